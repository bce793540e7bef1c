"""What a sweep tells its trials, and a trial's progress as its shared loaders report it.

``SCOPE_ENV`` (``BATCHCAST_SHARE_SCOPE``): the sweep's id, which scopes the trials' share keys
(``_share_scope.scoped_key``); ``PROGRESS_ENV``: the trial's progress file; ``SHARE_MEMORY_ENV``
``ORDER_ENV`` and ``CACHE_ENV``: the share_memory, share_order and share_cache of its shared loaders
that give none; ``GPU_CHUNK_ENV``: the fewest samples per chunk of a stream it starts on a GPU pool;
``SHARE_DATALOADERS_ENV``: set by ``--share-dataloaders`` (``_sweep_swap``); ``SWEEP_PID_ENV``:
the sweep's process, while which the share producers its trials start linger between trials.

What it is: :func:`report_progress` wraps one epoch's batches of a ``DataLoader(share=)`` and,
when ``$BATCHCAST_SWEEP_PROGRESS`` names a file (``batchcast sweep`` sets it for each trial),
writes there, at most once a second and at the end of each epoch, what every shared loader of
this process has read: ``{"loaders": {effective key: {"epochs", "samples", "wait_s",
"since"}}}`` (epochs: whole epochs finished; wait_s: seconds spent waiting for data; since: the
wall-clock time its first epoch first asked for a batch, so that rates leave out the trial's
start-up before it reads: imports, the model, CUDA). Without the variable
the batches pass through untouched. :func:`read_progress` is the sweep's side: the file summed
over loaders, or None where the trial wrote none (it reads no shared loader).

Thread-safety: the table is per process and guarded by a lock (loaders iterate on any thread).
The file is replaced atomically (write, then rename), so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional

__all__ = ["CACHE_ENV", "GPU_CHUNK_ENV", "ORDER_ENV", "PROGRESS_ENV", "SCOPE_ENV",
           "SHARE_DATALOADERS_ENV", "SHARE_MEMORY_ENV", "SWEEP_PID_ENV",
           "read_progress", "report_progress"]

SCOPE_ENV = "BATCHCAST_SHARE_SCOPE"
PROGRESS_ENV = "BATCHCAST_SWEEP_PROGRESS"
# The share_memory of the trials' DataLoader(share=) streams (batchcast sweep --share-memory).
SHARE_MEMORY_ENV = "BATCHCAST_SHARE_MEMORY"
# The share_order of the trials' DataLoader(share=) that do not give one (batchcast sweep
# --order; docs/stream.md, Order).
ORDER_ENV = "BATCHCAST_SHARE_ORDER"
CACHE_ENV = "BATCHCAST_SHARE_CACHE"
# The fewest samples per chunk of a trial's stream on a GPU pool (batchcast sweep under
# time-slicing): the stream is served in chunks of the smallest multiple of the batch size that
# holds that many; each trainer still reads its own batch size. Why: docs/sweep.md, Collocation.
GPU_CHUNK_ENV = "BATCHCAST_SHARE_GPU_CHUNK"
# Set: the trials' shuffled torch DataLoaders join the sweep's stream where they can
# (--share-dataloaders); unset: they stay torch's and are only counted.
SHARE_DATALOADERS_ENV = "BATCHCAST_SWEEP_SHARE_DATALOADERS"
# The sweep's pid: a share producer that one of its trials starts serves for a minute after its
# last reader left while the sweep runs (_share_producer.SWEEP_LINGER_S), not a second, so that
# a trial starting after the others ended (a queue of trials, or one slow to start) reads the
# same stream and its decoded cache instead of decoding anew. The sweep stops them when it ends;
# a sweep that died lets them go.
SWEEP_PID_ENV = "BATCHCAST_SWEEP_PID"
_EVERY_S = 1.0

_lock = threading.Lock()
_loaders: Dict[str, Dict[str, Any]] = {}
_since: Dict[str, float] = {}  # each loader's first epoch's request, written or not yet


def _write(path: str, key: str, epochs: int, stats: Any) -> None:
    with _lock:
        _loaders[key] = {"epochs": epochs, "samples": int(stats.samples),
                         "wait_s": float(stats.wait_s), "since": _since[key]}
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({"pid": os.getpid(), "loaders": _loaders}, f)
            os.replace(tmp, path)
        except OSError:
            pass  # the sweep's folder went away: progress is a report, never a failure


def report_progress(batches: Iterator[Any], key: str, stats: Callable[[], Any], asked: float
                    ) -> Iterator[Any]:
    """``batches`` (one epoch of the loader of effective key ``key``; ``stats()``: its
    LoaderStats, None before it attached; ``asked``: the wall-clock time the loop asked for the
    epoch, before the loader made its iterator), reported to ``$BATCHCAST_SWEEP_PROGRESS``."""
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return batches
    return _reported(batches, path, key, stats, asked)


def _reported(batches: Iterator[Any], path: str, key: str, stats: Callable[[], Any],
              asked: float) -> Iterator[Any]:
    with _lock:
        epochs = _loaders.get(key, {}).get("epochs", 0)
        _since.setdefault(key, asked)  # its first epoch's, even one left before a write
    last = time.monotonic()
    for batch in batches:
        yield batch
        now = time.monotonic()
        if now - last >= _EVERY_S and stats() is not None:
            _write(path, key, epochs, stats())
            last = now
    if stats() is not None:
        _write(path, key, epochs + 1, stats())


def read_progress(path: str) -> Optional[Dict[str, Any]]:
    """The trial's progress file summed over its loaders: ``{"epochs"}`` (the most any of its
    loaders finished), ``{"samples", "wait_s"}`` (sums), ``{"since"}`` (the earliest); None where
    there is none (yet)."""
    try:
        with open(path) as f:
            loaders = json.load(f).get("loaders", {})
    except (OSError, ValueError):
        return None
    if not loaders:
        return None
    return {
        "epochs": max(int(v.get("epochs", 0)) for v in loaders.values()),
        "samples": sum(int(v.get("samples", 0)) for v in loaders.values()),
        "wait_s": sum(float(v.get("wait_s", 0.0)) for v in loaders.values()),
        "since": min(float(v["since"]) for v in loaders.values()),
    }
