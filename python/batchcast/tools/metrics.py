"""Recording a training process in batchcast's metrics format, and reading run directories.

A trainer that runs its own DataLoader records a baseline the server's collector can be
compared with::

    from batchcast.tools import metrics
    with metrics.track("runs/baseline") as tracker:
        for images, labels in tracker.wrap(loader):   # counts samples and time in next()
            ...

Each tracking process writes ``<dir>/<role>-<pid>/`` (processes.csv, system.csv, server.csv,
summary.json), so N independent trainers can share one run directory; :func:`summarize`
combines a run tree (every summary.json in it, at any depth: ``batchcast track`` writes
``<experiment>/<workload>/<run>/command/``) into one summary, and reads an MLflow run directory
written by ``batchcast track`` too. :func:`collocation_mode` says how GPU jobs share this
machine (radT's "Collocation" column). CPU is that of the process plus its live child processes (DataLoader workers) and
reaped children, sampled by a native thread that never takes the GIL. See metrics/README.md.
"""

from __future__ import annotations

import atexit
import csv
import json
import os
import time
import weakref
from typing import Any, Dict, Iterable, Iterator, List, Optional

__all__ = ["Tracker", "track", "summarize", "find_parts", "batch_size_of", "collocation_mode",
           "savings", "TRACK_PART"]

CONSUMER_ROLES = ("consumer", "trainer")
# The part `batchcast track` writes for its command: the whole process tree of the command.
TRACK_PART = "command"


def _native():
    from .. import _batchcast  # lazily: importing batchcast must not need the build

    return _batchcast


def collocation_mode(nvml_library: str = "") -> str:
    """How GPU jobs share this machine, detected: "mig" (MIG mode on), "mps" (an MPS control
    daemon answers on $CUDA_MPS_PIPE_DIRECTORY or /tmp/nvidia-mps, or NVML lists MPS clients),
    "time-slicing" (a GPU without either) or "none" (no GPU through NVML). See
    metrics/collocation.h."""
    return str(_native().collocation_mode(nvml_library))


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
    """The directories holding a summary.json that make up run tree ``dir``: ``dir`` itself (a
    server's collector) and every directory below it (tracked processes, tracked runs of a
    workload or experiment), sorted."""
    dir = os.fspath(dir)
    parts = []
    for root, subdirs, files in os.walk(dir):
        subdirs[:] = sorted(d for d in subdirs if d != "mlruns")
        if "summary.json" in files:
            parts.append(root)
    if not parts:
        raise FileNotFoundError(
            f"{dir}: no summary.json in it or below it; pass a run directory written by "
            "`batchcast track`, `batchcast serve --metrics-dir` or batchcast.tools.metrics.track()"
        )
    return parts


def separate_runs(dir: "os.PathLike[str] | str") -> List[List[str]]:
    """The parts of run tree ``dir`` (find_parts) grouped into runs: parts whose spans (from
    ``start_unix_s`` for ``duration_s``) overlap, directly or through other parts, ran together
    (a server and its trainers, a workload's collocated commands); parts that ran at other times
    (a baseline measured before the shared run, two runs of one folder) are separate runs,
    which summarize() refuses to add up. Groups in start order, each sorted."""
    spans = []
    for path in find_parts(dir):
        s = _load(path)
        start = s.get("start_unix_s", 0.0)
        # A tick of slack: a process listed at the last tick of another part ran with it.
        slack = s.get("interval_s") or 0.0
        spans.append((start, start + s.get("duration_s", 0.0) + slack, path))
    groups: List[List[str]] = []
    end = None
    for start, stop, path in sorted(spans):
        if end is None or start > end:
            groups.append([])
            end = stop
        groups[-1].append(path)
        end = max(end, stop)
    return [sorted(g) for g in groups]


def run_dirs(dir: "os.PathLike[str] | str") -> List[str]:
    """The run directories in ``dir``: ``[dir]`` when it holds one run (or is an MLflow run),
    else one folder per run of :func:`separate_runs` (the folder its parts share). Raises
    ValueError when two runs share a folder, so that nothing is ever added up across runs."""
    dir = os.fspath(dir)
    if _is_mlflow_run(dir):
        return [dir]
    groups = separate_runs(dir)
    if len(groups) == 1:
        return [dir]
    names = [os.path.commonpath(g) if len(g) > 1 else g[0] for g in groups]
    if len(set(names)) < len(names) or os.path.abspath(dir) in map(os.path.abspath, names):
        raise ValueError(
            f"{dir} holds {len(groups)} runs that did not run at the same time, and some share "
            f"a folder ({', '.join(names)}): move each run into a folder of its own")
    return names


def read_csv(path: str) -> List[Dict[str, str]]:
    """The rows of one of a run's CSV files (processes.csv, system.csv, server.csv); [] when the
    run has no such file."""
    if not os.path.isfile(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def csv_number(v: Optional[str]) -> Optional[float]:
    """A CSV cell as a number; None for an empty cell (a figure the run could not measure)."""
    try:
        return float(v) if v not in (None, "") else None
    except ValueError:
        return None


def _load(path: str) -> Dict[str, Any]:
    with open(os.path.join(path, "summary.json")) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}/summary.json is not valid JSON ({e})") from None


def _per_sample(value: Optional[float], samples: int) -> Optional[float]:
    return value / samples if samples and value is not None else None


def _weighted_mean(pairs: List[tuple]) -> Optional[float]:
    pairs = [(v, w) for v, w in pairs if v is not None and w]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None


def _is_mlflow_run(dir: str) -> bool:
    return os.path.isfile(os.path.join(dir, "meta.yaml")) and os.path.isdir(
        os.path.join(dir, "metrics"))


def _summarize_mlflow(dir: str) -> Dict[str, Any]:
    """A summary (the keys the report uses) from the final figures ``batchcast track`` logged."""
    from .mlflow_store import read_run

    r = read_run(dir)
    last = {k: v[-1][1] for k, v in r["metrics"].items() if v}
    samples = int(last.get("samples", 0))
    cpu = last.get("cpu_core_s", 0.0)
    series = r["metrics"].get("process/cpu_core_s") or []
    start = min((p[0] for v in r["metrics"].values() for p in v), default=0) / 1000.0
    gpu_j, cpu_j = last.get("gpu_energy_joules"), last.get("cpu_energy_joules")
    all_j = None if gpu_j is None and cpu_j is None else (gpu_j or 0.0) + (cpu_j or 0.0)
    return {
        "format": "batchcast-metrics", "format_version": 2,
        "run_name": r["meta"].get("run_name") or os.path.basename(dir),
        "dir": os.path.abspath(dir), "parts": [], "mlflow": True,
        "complete": r["meta"].get("status") != 1,
        "collocation": r["tags"].get("batchcast.collocation"),
        "start_unix_s": start, "duration_s": last.get("duration_s", 0.0),
        "interval_s": None, "ticks": len(series),
        "samples": samples, "samples_per_s": last.get("samples_per_s", 0.0), "wait_s": 0.0,
        "run_queue_wait_s": last.get("run_queue_wait_s"),
        "cpu_core_s": {"server": 0.0, "consumers": 0.0, "all": cpu},
        "cpu_core_s_per_sample": {"server": None, "consumers": None,
                                  "all": _per_sample(cpu, samples)},
        "energy_joules": {"gpu": gpu_j, "cpu": cpu_j, "all": all_j},
        "joules_per_sample": {"gpu": _per_sample(gpu_j, samples),
                              "cpu": _per_sample(cpu_j, samples),
                              "all": _per_sample(all_j, samples)},
        "mean_sm_active_percentage": last.get("sm_active_percentage"),
        "mean_gpu_utilization_percentage": last.get("gpu_utilization_percentage"),
        "peak_rss_mb": None, "producer_blocked_s": 0.0, "ring_size": 0,
        "mean_ring_fill_percent": None, "system": {}, "gpus": [], "processes": [],
        "missing": [], "sampler": {"cpu_s": 0.0, "percent_of_core": 0.0},
    }


def savings(shared: Dict[str, Any], baseline: Dict[str, Any]) -> Dict[str, Optional[float]]:
    """What a shared run saves against its baseline, three ways (None where a figure is
    unknown): CPU core-seconds per sample, joules per sample, and CPU cores needed at the shared
    run's throughput (baseline CPU per sample x shared samples/s, minus the shared run's
    cores)."""
    def diff(a: Optional[float], b: Optional[float]) -> Optional[float]:
        return None if a is None or b is None else b - a

    cpu_s, cpu_b = shared["cpu_core_s_per_sample"]["all"], baseline["cpu_core_s_per_sample"]["all"]
    j_s = (shared.get("joules_per_sample") or {}).get("all")
    j_b = (baseline.get("joules_per_sample") or {}).get("all")
    rate = shared.get("samples_per_s") or 0.0
    cores = None
    if cpu_s is not None and cpu_b is not None and rate:
        cores = (cpu_b - cpu_s) * rate
    return {"cpu_core_s_per_sample": diff(cpu_s, cpu_b), "joules_per_sample": diff(j_s, j_b),
            "cores": cores}


def summarize(dir: "os.PathLike[str] | str") -> Dict[str, Any]:
    """One summary for run tree ``dir`` (layout of summary.json, see metrics/README.md), or for
    an MLflow run directory written by ``batchcast track``.

    Samples, wait and blocked time are summed over the parts; CPU too, except that where the
    tree holds ``batchcast track`` parts (``command/``), ``cpu_core_s["all"]`` is theirs alone:
    each covers its command's whole process tree, which already contains any server or trainer
    that recorded itself beside it ("server"/"consumers" stay those parts' own figures).
    Per-sample ratios are recomputed, processes concatenated (each with its ``part``),
    ``duration_s`` runs from the earliest start to the latest end, peak RSS is summed over parts
    (an upper bound); system, GPU and energy figures come from the longest part (collocated
    parts measure the same machine over the same span). ``parts`` lists the directories used."""
    dir = os.fspath(dir)
    if _is_mlflow_run(dir):
        return _summarize_mlflow(dir)
    runs = separate_runs(dir)
    if len(runs) > 1:
        names = "; ".join(", ".join(os.path.relpath(p, dir) for p in g) for g in runs)
        raise ValueError(
            f"{dir} holds {len(runs)} runs that did not run at the same time ({names}): their "
            "figures would be added up as one; pass each run's directory (batchcast report "
            "reports them one by one)")
    paths = runs[0]
    parts = [(p, _load(p)) for p in paths]
    start = min(s.get("start_unix_s", 0.0) for _, s in parts)
    end = max(s.get("start_unix_s", 0.0) + s.get("duration_s", 0.0) for _, s in parts)
    duration = end - start
    is_track = [os.path.basename(p) == TRACK_PART for p, _ in parts]
    tracked = [s for (_, s), t in zip(parts, is_track) if t]
    cpu = {"server": 0.0, "consumers": 0.0, "all": 0.0}
    samples, wait, blocked, sampler_cpu, ticks, run_wait = 0, 0.0, 0.0, 0.0, 0, 0.0
    processes = []
    for (path, s), track_part in zip(parts, is_track):
        offset = s.get("start_unix_s", 0.0) - start
        rel = os.path.relpath(path, dir)
        for k in cpu:
            cpu[k] += (s.get("cpu_core_s") or {}).get(k) or 0.0
        samples += s.get("samples", 0)
        wait += s.get("wait_s", 0.0)
        blocked += s.get("producer_blocked_s", 0.0)
        sampler_cpu += (s.get("sampler") or {}).get("cpu_s", 0.0)
        ticks += s.get("ticks", 0)
        if track_part or not tracked:  # a tracked tree holds the others' processes
            run_wait += s.get("run_queue_wait_s") or 0.0
        for p in s.get("processes", []):
            p = dict(p, part=rel)
            p["first_s"] = p.get("first_s", 0.0) + offset
            p["last_s"] = p.get("last_s", 0.0) + offset
            processes.append(p)
    if tracked:
        cpu["all"] = sum((s.get("cpu_core_s") or {}).get("all") or 0.0 for s in tracked)
    longest = max(parts, key=lambda ps: ps[1].get("duration_s", 0.0))[1]
    energy = dict(longest.get("energy_joules") or {"gpu": None, "cpu": None, "all": None})
    ring_parts = [s for _, s in parts if s.get("ring_size")]
    peaks = [s.get("peak_rss_mb") for _, s in parts if s.get("peak_rss_mb") is not None]
    return {
        "format": "batchcast-metrics",
        "format_version": 2,
        "run_name": os.path.basename(os.path.abspath(dir)),
        "dir": os.path.abspath(dir),
        "parts": [os.path.relpath(p, dir) for p, _ in parts],
        "complete": all(s.get("complete", False) for _, s in parts),
        "incomplete_reasons": [f"{os.path.relpath(p, dir)}: {s['incomplete_reason']}"
                               for p, s in parts if s.get("incomplete_reason")],
        "collocation": longest.get("collocation"),
        "start_unix_s": start,
        "duration_s": duration,
        "interval_s": longest.get("interval_s"),
        "ticks": ticks,
        "samples": samples,
        "samples_per_s": samples / duration if duration > 0 else 0.0,
        "wait_s": wait,
        "run_queue_wait_s": run_wait,
        "cpu_core_s": cpu,
        "cpu_core_s_per_sample": {k: _per_sample(v, samples) for k, v in cpu.items()},
        "energy_joules": energy,
        "joules_per_sample": {k: _per_sample(v, samples) for k, v in energy.items()},
        "peak_rss_mb": sum(peaks) if peaks else None,
        "producer_blocked_s": blocked,
        "ring_size": max((s["ring_size"] for s in ring_parts), default=0),
        "mean_ring_fill_percent": _weighted_mean(
            [(s.get("mean_ring_fill_percent"), s.get("ticks", 0)) for s in ring_parts]
        ),
        "system": longest.get("system", {}),
        "gpus": longest.get("gpus", []),
        "mean_gpu_utilization_percentage": longest.get("mean_gpu_utilization_percentage"),
        "mean_sm_active_percentage": longest.get("mean_sm_active_percentage"),
        "missing": longest.get("missing", []),
        "processes": processes,
        "sampler": {
            "cpu_s": sampler_cpu,
            "percent_of_core": 100.0 * sampler_cpu / duration if duration > 0 else 0.0,
        },
    }
