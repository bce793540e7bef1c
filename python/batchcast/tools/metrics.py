"""Recording a training process in batchcast's metrics format, and reading run directories.

A trainer that runs its own DataLoader records a baseline the server's collector can be
compared with::

    from batchcast.tools import metrics
    with metrics.track("runs/baseline") as tracker:
        for images, labels in tracker.wrap(loader):   # counts samples and time in next()
            ...

:func:`track` and :class:`Tracker` are the package's own (``batchcast._tracking``): each
tracking process writes ``<dir>/<role>-<pid>/``. :func:`summarize` combines a run tree (every
summary.json in it, at any depth: ``batchcast track`` writes
``<experiment>/<workload>/<run>/command/``) into one summary, counting each CPU second and each
sample once (the rules are in metrics/README.md, "What each figure counts"), and reads an
MLflow run directory written by ``batchcast track`` too. :func:`collocation_mode` says how GPU
jobs share this machine (radT's "Collocation" column).
"""

from __future__ import annotations

import csv
import json
import os
from typing import Any, Dict, List, Optional

from .._tracking import Tracker, batch_size_of, native as _native, track

__all__ = ["Tracker", "track", "summarize", "find_parts", "batch_size_of", "collocation_mode",
           "savings", "TRACK_PART"]

CONSUMER_ROLES = ("consumer", "trainer")
# The part `batchcast track` writes for its command: the whole process tree of the command.
TRACK_PART = "command"


def collocation_mode(nvml_library: str = "") -> str:
    """How GPU jobs share this machine, detected: "mig" (MIG mode on), "mps" (an MPS control
    daemon answers on $CUDA_MPS_PIPE_DIRECTORY or /tmp/nvidia-mps, or NVML lists MPS clients),
    "time-slicing" (a GPU without either) or "none" (no GPU through NVML). See
    metrics/collocation.h."""
    return str(_native().collocation_mode(nvml_library))


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


# The id `batchcast track` gives a process its command left behind (re-parented to track).
ADOPTED = "adopted"
_SELF_RECORDING_ROLES = ("server", "trainer")


def outlived(summary: Dict[str, Any]) -> List[int]:
    """The pids a ``batchcast track`` part (its summary.json) saw outlive its command: processes
    the command left behind that were still running when it ended, so no wait4() total of the
    tracked tree holds their CPU."""
    return [p["pid"] for p in summary.get("processes", [])
            if p.get("id") == ADOPTED and not p.get("cpu_exact")]


def count_once(parts: List[tuple]) -> Dict[str, Any]:
    """CPU and samples of run parts ``[(path, summary), ...]``, each counted once (metrics/README.md,
    "What each figure counts"): ``cpu_all`` (the tracked commands' trees, where there are any,
    with each process that outlived its command counted by its own record instead; else every
    part's), ``counted`` (the processes it sums: ``(part path, role, id, pid)``), ``samples``
    (observed by batchcast where it could observe the trainers, else declared with
    ``--samples``) and ``warnings`` (each figure that cannot be computed, or a declaration that
    was overruled)."""
    commands = [(p, s) for p, s in parts if os.path.basename(p) == TRACK_PART]
    others = [s for p, s in parts if os.path.basename(p) != TRACK_PART]
    warnings: List[str] = []
    # Processes that recorded themselves, by pid: their figure counts from their start to their end.
    own = {p["pid"]: (path, p) for path, s in parts if os.path.basename(path) != TRACK_PART
           for p in s.get("processes", [])
           if p.get("role") in _SELF_RECORDING_ROLES and p.get("cpu_core_s") is not None}
    if commands:
        counted = []
        for path, s in commands:
            left = set(outlived(s))
            for p in s.get("processes", []):
                if p["pid"] in left and p["pid"] in own:
                    counted.append(own[p["pid"]])
                    continue
                if p["pid"] in left:
                    warnings.append(
                        f"process {p['pid']} outlived its command ({s.get('run_name')}) and "
                        "recorded nothing itself: its CPU is counted until the command ended")
                counted.append((path, p))
        cpu_all = sum(p.get("cpu_core_s") or 0.0 for _, p in counted)
    else:
        counted = [(path, p) for path, s in parts for p in s.get("processes", [])]
        cpu_all = sum((s.get("cpu_core_s") or {}).get("all") or 0.0 for _, s in parts)
    # Samples: a trainer's own record (metrics.track()) over what a server saw it consume.
    trainers = {p["pid"] for s in others for p in s.get("processes", [])
                if p.get("role") == "trainer"}
    observed = sum(s.get("samples", 0) for s in others) - sum(
        p.get("samples", 0) for s in others for p in s.get("processes", [])
        if p.get("role") == "consumer" and p["pid"] in trainers)
    declared = sum(s.get("samples", 0) for _, s in commands)
    if observed:
        if declared and declared != observed:
            warnings.append(
                f"--samples declared {declared} samples, but batchcast saw the trainers consume "
                f"{observed}: the observed count is used")
        samples = observed
    else:
        samples = declared
        if not samples:
            warnings.append(
                "no samples counted (batchcast could not observe the trainers): per-sample "
                "figures and savings are blank; give `batchcast track --samples N`, or record "
                "the trainer with batchcast.tools.metrics.track()")
    return {"cpu_all": cpu_all, "samples": samples, "warnings": warnings,
            "counted": {(path, p.get("role"), p.get("id"), p.get("pid")) for path, p in counted}}


def summarize(dir: "os.PathLike[str] | str") -> Dict[str, Any]:
    """One summary for run tree ``dir`` (layout of summary.json, see metrics/README.md), or for
    an MLflow run directory written by ``batchcast track``.

    Wait and blocked time are summed over the parts; CPU too, except that where the tree
    holds ``batchcast track`` parts (``command/``), ``cpu_core_s["all"]`` is theirs (each is its
    command's whole process tree, which already contains any server or trainer that recorded
    itself beside it), plus the own records of processes that outlived their command
    ("server"/"consumers" stay the parts' own figures); samples are counted once
    (:func:`count_once`), and ``warnings`` says what could not be computed. Per-sample ratios are recomputed, processes concatenated (each with its ``part``),
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
    counted = count_once(parts)
    cpu = {"server": 0.0, "consumers": 0.0, "all": counted["cpu_all"]}
    wait, blocked, sampler_cpu, ticks, run_wait = 0.0, 0.0, 0.0, 0, 0.0
    processes = []
    for (path, s), track_part in zip(parts, is_track):
        offset = s.get("start_unix_s", 0.0) - start
        rel = os.path.relpath(path, dir)
        for k in ("server", "consumers"):
            cpu[k] += (s.get("cpu_core_s") or {}).get(k) or 0.0
        wait += s.get("wait_s", 0.0)
        blocked += s.get("producer_blocked_s", 0.0)
        sampler_cpu += (s.get("sampler") or {}).get("cpu_s", 0.0)
        ticks += s.get("ticks", 0)
        if track_part or not tracked:  # a tracked tree holds the others' processes
            run_wait += s.get("run_queue_wait_s") or 0.0
        for p in s.get("processes", []):
            p = dict(p, part=rel, counted_in_all=(path, p.get("role"), p.get("id"), p.get("pid"))
                     in counted["counted"])
            p["first_s"] = p.get("first_s", 0.0) + offset
            p["last_s"] = p.get("last_s", 0.0) + offset
            processes.append(p)
    samples = counted["samples"]
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
        "warnings": counted["warnings"],
        "processes": processes,
        "sampler": {
            "cpu_s": sampler_cpu,
            "percent_of_core": 100.0 * sampler_cpu / duration if duration > 0 else 0.0,
        },
    }
