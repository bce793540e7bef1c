"""Recording one process in batchcast's metrics format: :class:`Tracker` and :func:`track`.

What the package itself needs of the metrics (the share producer records itself with it) and
what ``batchcast.tools.metrics`` offers trainers::

    from batchcast.tools import metrics
    with metrics.track("runs/baseline") as tracker:
        for images, labels in tracker.wrap(loader):   # counts samples and time in next()
            ...

Each tracking process writes ``<dir>/<role>-<pid>/`` (processes.csv, system.csv, server.csv,
summary.json), so N independent trainers can share one run directory. CPU is that of the
process plus its live child processes (DataLoader workers) and reaped children, sampled by a
native thread that never takes the GIL; see metrics/README.md.

Thread-safety: ``add_samples``/``add_wait`` from any thread; ``start``/``stop`` from one.
Lifetime: a tracker still running at interpreter exit is stopped then (its summary written).
"""

from __future__ import annotations

import atexit
import os
import time
import weakref
from typing import Any, Dict, Iterable, Iterator, Optional

__all__ = ["Tracker", "track", "batch_size_of", "native"]


def native():
    """The extension module, imported lazily: importing batchcast must not need the build."""
    from . import _batchcast

    return _batchcast


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the length of its first tensor (first element of a tuple/list, first
    value of a dict, recursively); 1 for something without a length."""
    def nested(x: Any) -> bool:
        return isinstance(x, (tuple, list, dict)) or getattr(x, "shape", None) is not None

    while True:
        shape = getattr(batch, "shape", None)
        if shape is not None:
            return int(shape[0]) if len(shape) > 0 else 1
        if isinstance(batch, dict) and batch:
            batch = next(iter(batch.values()))
        elif isinstance(batch, (tuple, list)) and batch and nested(batch[0]):
            batch = batch[0]
        else:
            break
    try:
        return len(batch)
    except TypeError:
        return 1


_live_trackers: "weakref.WeakSet[Tracker]" = weakref.WeakSet()


@atexit.register
def _stop_live_trackers() -> None:
    # A tracker still running at exit is stopped while the interpreter is whole, so its
    # summary.json is written and its thread is joined before Python tears itself down.
    for t in list(_live_trackers):
        try:
            t.stop()
        except Exception:  # noqa: BLE001 - nothing sensible to do at exit
            pass


class Tracker:
    """Records this process under ``role`` into ``<dir>/<role>-<pid>/``.

    ``start()``/``stop()`` or use it as a context manager (``track()`` returns one already
    started). ``add_samples(n)`` and ``add_wait(seconds)`` feed the counters; ``wrap(iterable)``
    does both for a loader. ``interval`` is the sampling period in seconds (default 1 s, as the
    server's collector). ``gpu=False`` skips NVML. ``since_start=True`` counts the process's CPU
    from its start (a server's start-up is its cost) instead of from ``start()`` (a trainer's
    ``import torch`` is not data loading).
    """

    def __init__(
        self,
        dir: "os.PathLike[str] | str",
        role: str = "trainer",
        interval: float = 1.0,
        id: Optional[str] = None,
        run_name: Optional[str] = None,
        gpu: bool = True,
        since_start: bool = False,
    ) -> None:
        self.run_dir = os.path.abspath(os.fspath(dir))
        self.role = role
        self.pid = os.getpid()
        self.dir = os.path.join(self.run_dir, f"{role}-{self.pid}")
        if run_name is None:
            run_name = os.path.basename(self.run_dir.rstrip(os.sep)) or self.run_dir
        self._native = native().ProcessTracker(
            self.dir, role, "" if id is None else str(id), float(interval), run_name, gpu,
            since_start=since_start,
        )
        self._started = False
        self._stopped = False

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "Tracker":
        if not self._started:
            self._native.start()  # returns after the first (baseline) sample
            self._started = True
            _live_trackers.add(self)
        return self

    def stop(self) -> Dict[str, Any]:
        """Final sample, writes summary.json; returns the summary. Idempotent."""
        if os.getpid() != self.pid:  # a forked child (DataLoader worker) owns no thread here
            return {}
        if self._started and not self._stopped:
            self._stopped = True
            _live_trackers.discard(self)
            self._native.stop()
        return self.summary()

    def __enter__(self) -> "Tracker":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # --- counters ------------------------------------------------------------------------------
    def add_samples(self, n: int) -> None:
        self._native.add_samples(int(n))

    def add_wait(self, seconds: float) -> None:
        self._native.add_wait(float(seconds))

    def wrap(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Yields the items of ``iterable``, counting the samples of each batch
        (:func:`batch_size_of`) and the time spent waiting in ``next()``."""
        it = iter(iterable)
        clock = time.perf_counter
        while True:
            t0 = clock()
            try:
                batch = next(it)
            except StopIteration:
                self.add_wait(clock() - t0)
                return
            self.add_wait(clock() - t0)
            self.add_samples(batch_size_of(batch))
            yield batch

    # --- results -------------------------------------------------------------------------------
    @property
    def samples(self) -> int:
        return self._native.samples

    @property
    def wait_s(self) -> float:
        return self._native.wait_s

    def summary(self) -> Dict[str, Any]:
        return self._native.summary()


def track(
    dir: "os.PathLike[str] | str", role: str = "trainer", interval: float = 1.0, **kwargs: Any
) -> Tracker:
    """Starts recording this process into ``<dir>/<role>-<pid>/`` and returns the
    :class:`Tracker` (a context manager: ``with track(dir) as t: ...``; or call ``t.stop()``)."""
    return Tracker(dir, role=role, interval=interval, **kwargs).start()
