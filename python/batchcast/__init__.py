"""batchcast: one shared data-loading server for collocated training jobs.

Public API (the design behind it: docs/README.md):

- :class:`Loader` — a consumer: zero-copy batches from a server, one epoch per iteration.
- :class:`Producer` — shares any re-iterable of tensor batches (e.g. a torch DataLoader).
- :func:`serve` — starts the native ``batchcast serve`` server; a context manager.
- :func:`sweep` — runs a sweep's trials collocated on a node's GPUs (``batchcast sweep``).
- :class:`DataLoader` — torch's DataLoader; with ``share=KEY`` one detached producer serves
  every process that uses the same key.
- Errors: :class:`BatchcastError` (a RuntimeError) and its subclasses
  :class:`ServerGoneError`, :class:`TimeoutError` (also a builtin TimeoutError),
  :class:`SampleError`, :class:`PositionUnavailableError`.

Torch is imported only by what needs it: ``Loader(framework="numpy")`` works without it.
``__version__`` is the installed distribution's, which setup.py takes from CMake's project
VERSION: one number for the package, the program and the C++ library.
"""

from __future__ import annotations

from importlib.metadata import version as _version
from typing import Any

from ._batchcast import (
    BatchcastError,
    PositionUnavailableError,
    SampleError,
    ServerGoneError,
    TimeoutError,
    rank_endpoint,
)
from .loader import Loader, LoaderStats
from .producer import Producer
from ._sweep import sweep
from .server import Server, serve

__version__ = _version("batchcast")

__all__ = [
    "BatchcastError",
    "DataLoader",
    "Loader",
    "LoaderStats",
    "PositionUnavailableError",
    "Producer",
    "SampleError",
    "Server",
    "ServerGoneError",
    "TimeoutError",
    "rank_endpoint",
    "serve",
    "sweep",
]


def __getattr__(name: str) -> Any:
    # DataLoader subclasses torch's, so it is imported on first use: `import batchcast` must
    # not import torch for NumPy-only consumers.
    if name == "DataLoader":
        from .dataloader import DataLoader

        return DataLoader
    raise AttributeError(f"module 'batchcast' has no attribute {name!r}")
