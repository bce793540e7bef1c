"""Recording a training process in batchcast's metrics format, and reading run directories.

A trainer that runs its own DataLoader records a baseline the server's collector can be
compared with::

    from batchcast import metrics
    with metrics.track("runs/baseline") as tracker:
        for images, labels in tracker.wrap(loader):   # counts samples and time in next()
            ...

Each tracking process writes ``<dir>/<role>-<pid>/`` (processes.csv, system.csv, server.csv,
summary.json), so N independent trainers can share one run directory; :func:`summarize`
combines a run directory (its own summary.json and those of its immediate subdirectories) into
one summary. CPU is that of the process plus its live child processes (DataLoader workers) and
reaped children, sampled by a native thread that never takes the GIL. See metrics/README.md.
"""

from __future__ import annotations

import atexit
import json
import os
import time
import weakref
from typing import Any, Dict, Iterable, Iterator, List, Optional

__all__ = ["Tracker", "track", "summarize", "find_parts", "batch_size_of"]

CONSUMER_ROLES = ("consumer", "trainer")


def _native():
    from . import _batchcast  # lazily: importing batchcast must not need the build

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
    server's collector). ``gpu=False`` skips NVML.
    """

    def __init__(
        self,
        dir: "os.PathLike[str] | str",
        role: str = "trainer",
        interval: float = 1.0,
        id: Optional[str] = None,
        run_name: Optional[str] = None,
        gpu: bool = True,
    ) -> None:
        self.run_dir = os.path.abspath(os.fspath(dir))
        self.role = role
        self.pid = os.getpid()
        self.dir = os.path.join(self.run_dir, f"{role}-{self.pid}")
        if run_name is None:
            run_name = os.path.basename(self.run_dir.rstrip(os.sep)) or self.run_dir
        self._native = _native().ProcessTracker(
            self.dir, role, "" if id is None else str(id), float(interval), run_name, gpu
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


# --- reading run directories -------------------------------------------------------------------


def find_parts(dir: "os.PathLike[str] | str") -> List[str]:
    """The directories holding a summary.json that make up run directory ``dir``: ``dir`` itself
    (a server's collector) and its immediate subdirectories (one per tracked process)."""
    dir = os.fspath(dir)
    parts = []
    if os.path.isfile(os.path.join(dir, "summary.json")):
        parts.append(dir)
    if os.path.isdir(dir):
        for name in sorted(os.listdir(dir)):
            sub = os.path.join(dir, name)
            if os.path.isfile(os.path.join(sub, "summary.json")):
                parts.append(sub)
    if not parts:
        raise FileNotFoundError(
            f"{dir}: no summary.json in it or in its subdirectories; pass a run directory "
            "written by `batchcast serve --metrics-dir` or batchcast.metrics.track()"
        )
    return parts


def _load(path: str) -> Dict[str, Any]:
    with open(os.path.join(path, "summary.json")) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}/summary.json is not valid JSON ({e})") from None


def _per_sample(cpu: float, samples: int) -> Optional[float]:
    return cpu / samples if samples else None


def _weighted_mean(pairs: List[tuple]) -> Optional[float]:
    pairs = [(v, w) for v, w in pairs if v is not None and w]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None


def summarize(dir: "os.PathLike[str] | str") -> Dict[str, Any]:
    """One summary for run directory ``dir`` (layout of summary.json, see metrics/README.md):
    CPU core-seconds, samples and wait summed over its parts, per-sample ratios recomputed,
    processes concatenated (each with its ``part``), ``duration_s`` from the earliest start to
    the latest end, peak RSS summed over parts (an upper bound), system and GPU figures from the
    longest part (they describe the same machine). ``parts`` lists the directories used."""
    dir = os.fspath(dir)
    paths = find_parts(dir)
    parts = [(p, _load(p)) for p in paths]
    start = min(s.get("start_unix_s", 0.0) for _, s in parts)
    end = max(s.get("start_unix_s", 0.0) + s.get("duration_s", 0.0) for _, s in parts)
    duration = end - start
    cpu = {"server": 0.0, "consumers": 0.0, "all": 0.0}
    samples, wait, blocked, sampler_cpu, ticks = 0, 0.0, 0.0, 0.0, 0
    processes = []
    for path, s in parts:
        offset = s.get("start_unix_s", 0.0) - start
        rel = os.path.relpath(path, dir)
        for k in cpu:
            cpu[k] += (s.get("cpu_core_s") or {}).get(k) or 0.0
        samples += s.get("samples", 0)
        wait += s.get("wait_s", 0.0)
        blocked += s.get("producer_blocked_s", 0.0)
        sampler_cpu += (s.get("sampler") or {}).get("cpu_s", 0.0)
        ticks += s.get("ticks", 0)
        for p in s.get("processes", []):
            p = dict(p, part=rel)
            p["first_s"] = p.get("first_s", 0.0) + offset
            p["last_s"] = p.get("last_s", 0.0) + offset
            processes.append(p)
    longest = max(parts, key=lambda ps: ps[1].get("duration_s", 0.0))[1]
    ring_parts = [s for _, s in parts if s.get("ring_size")]
    peaks = [s.get("peak_rss_mb") for _, s in parts if s.get("peak_rss_mb") is not None]
    return {
        "format": "batchcast-metrics",
        "format_version": 1,
        "run_name": os.path.basename(os.path.abspath(dir)),
        "dir": os.path.abspath(dir),
        "parts": [os.path.relpath(p, dir) for p, _ in parts],
        "complete": all(s.get("complete", False) for _, s in parts),
        "start_unix_s": start,
        "duration_s": duration,
        "interval_s": longest.get("interval_s"),
        "ticks": ticks,
        "samples": samples,
        "samples_per_s": samples / duration if duration > 0 else 0.0,
        "wait_s": wait,
        "cpu_core_s": cpu,
        "cpu_core_s_per_sample": {k: _per_sample(v, samples) for k, v in cpu.items()},
        "peak_rss_mb": sum(peaks) if peaks else None,
        "producer_blocked_s": blocked,
        "ring_size": max((s["ring_size"] for s in ring_parts), default=0),
        "mean_ring_fill_percent": _weighted_mean(
            [(s.get("mean_ring_fill_percent"), s.get("ticks", 0)) for s in ring_parts]
        ),
        "system": longest.get("system", {}),
        "gpus": longest.get("gpus", []),
        "mean_gpu_utilization_percentage": longest.get("mean_gpu_utilization_percentage"),
        "processes": processes,
        "sampler": {
            "cpu_s": sampler_cpu,
            "percent_of_core": 100.0 * sampler_cpu / duration if duration > 0 else 0.0,
        },
    }
