"""``batchcast track``: record any training command, and all its descendants, with no code change.

    batchcast track [--out DIR] [--experiment NAME] [--workload NAME] [--run-name NAME]
                    [--interval S] [--samples N] [--param K=V ...] [--no-gpu] -- COMMAND...
    batchcast track --file EXPERIMENTS.csv|.yaml [--out DIR]

One tracked command is one run: its metrics go to ``DIR/<experiment>/<workload>/<run>/``
(batchcast's CSV + summary.json, the command's part in ``command/``) and to the MLflow file
store ``DIR/mlruns`` (a run nested under its workload's parent run; see
:mod:`batchcast.tools.mlflow_store`). Commands given the same ``--workload`` are collocated runs of one
workload, as radT's workloads. The exit status is the command's (128 + N if signal N killed it).

Nothing is lost at either end: the command is started after the sampler's first tick and its
CPU counts from its start; when it exits, the rusage of ``wait4`` (the command and every
descendant it reaped, DataLoader workers included) is the exact total. This process is made a
child subreaper: a descendant left behind (its parent died: a daemon, a detached share
producer) is re-parented here and recorded as a process of its own (id "adopted"), exact once
reaped; one still running at the end outlived the command (metrics/README.md, "What each
figure counts").
``BATCHCAST_METRICS_DIR`` is set to the run directory for the command: a ``batchcast serve``
started under it writes its own metrics (ring, consumers) into the same run tree.

``--file`` runs an experiment file instead (:mod:`batchcast.tools.experiment_file`).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

from .._proc import stat_fields
from . import metrics
from .mlflow_store import FAILED, FINISHED, KILLED, RunWriter, Store

__all__ = ["track_command", "main", "ENV_METRICS_DIR"]

ENV_METRICS_DIR = "BATCHCAST_METRICS_DIR"
_PR_SET_CHILD_SUBREAPER = 36
_PROCESS_SERIES = {  # processes.csv column -> MLflow metric key
    "cpu_percent": "process/cpu_percent",
    "cpu_s": "process/cpu_core_s",
    "rss_mb": "process/rss_megabytes",
    "tree_rss_mb": "process/tree_rss_megabytes",
    "run_queue_wait_s": "process/run_queue_wait_s",
    "gpu_sm_percent": "process/gpu_sm_percent",
    "gpu_memory_mb": "process/gpu_memory_megabytes",
    "samples_per_s": "process/samples_per_s",
}


def _become_subreaper() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: daemonised grandchildren are then not counted


def _rusage_cpu(ru: Any) -> float:
    return float(ru.ru_utime + ru.ru_stime)


def _children(ppid: int) -> List[int]:
    """The live processes whose parent is ``ppid`` (a scan of /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = stat_fields(int(name))
        if fields is not None and int(fields[1]) == ppid:
            out.append(int(name))
    return out


class _Adopted:
    """The processes the command left behind: descendants whose parent died, re-parented to this
    process (a child subreaper), such as a detached share producer. Each is watched as a
    process of its own (role "command", id "adopted") from its start; one that exits is reaped
    here and its wait4() total is exact. Thread-safe: the sampler thread looks for them, the
    main thread takes the final reaping."""

    def __init__(self, command_pid: int) -> None:
        self._command = command_pid
        self._lock = threading.Lock()
        self.exact: Dict[int, Optional[float]] = {}  # pid -> CPU once reaped

    def look(self) -> None:
        with self._lock:
            for pid in _children(os.getpid()):
                if pid != self._command:
                    self.exact.setdefault(pid, None)
            for pid, cpu in self.exact.items():
                if cpu is None:
                    self._reap(pid)

    def reap_all(self) -> List[int]:
        """Reaps every adopted process that has exited (those never seen included); returns
        the pids still running: they outlived the command."""
        with self._lock:
            while True:
                try:
                    pid, _, ru = os.wait4(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                self.exact[pid] = _rusage_cpu(ru)
            return [pid for pid, cpu in self.exact.items() if cpu is None]

    def _reap(self, pid: int) -> None:
        try:
            done, _, ru = os.wait4(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done == pid:
            self.exact[pid] = _rusage_cpu(ru)

    def processes(self) -> List[Dict[str, Any]]:
        with self._lock:
            return [{"role": "command", "id": metrics.ADOPTED, "pid": pid, "since_start": True,
                     "exact_cpu_s": cpu} for pid, cpu in self.exact.items()]


def _run_name(command: Sequence[str]) -> str:
    stem = os.path.basename(command[0]) if command else "run"
    if stem.startswith("python") and len(command) > 1:
        stem = os.path.splitext(os.path.basename(command[1] if command[1] != "-m" else
                                                 (command[2] if len(command) > 2 else "m")))[0]
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def log_run_dir(run: RunWriter, run_dir: str) -> Dict[str, Any]:
    """Logs batchcast run directory ``run_dir`` into MLflow run ``run``: every system.csv column
    (already ``system/`` keys), the tracked command's processes.csv series under ``process/``,
    and the combined summary's figures (step 0). Returns that summary."""
    summary = metrics.summarize(run_dir)
    for rel in summary["parts"]:
        part = os.path.normpath(os.path.join(run_dir, rel))
        start = metrics._load(part).get("start_unix_s", 0.0)
        ms = lambda row: int((start + float(row["time_s"])) * 1000)  # noqa: E731
        system = metrics.read_csv(os.path.join(part, "system.csv"))
        if rel == metrics.TRACK_PART:
            for col in (system[0].keys() if system else []):
                if col.startswith("system/"):
                    run.log_metric(col, [(ms(r), metrics.csv_number(r[col]), i) for i, r in enumerate(system)])
        by_series: Dict[str, list] = {}
        for r in metrics.read_csv(os.path.join(part, "processes.csv")):
            prefix = "" if r["role"] == "command" else f"{r['role']}_{r['id'] or r['pid']}/"
            for col, key in _PROCESS_SERIES.items():
                by_series.setdefault(prefix + key, []).append((ms(r), metrics.csv_number(r.get(col))))
        for key, points in by_series.items():
            run.log_metric(key, [(t, v, i) for i, (t, v) in enumerate(points)])
    end = int((summary["start_unix_s"] + summary["duration_s"]) * 1000)
    figures = {
        "samples": summary["samples"],
        "samples_per_s": summary["samples_per_s"],
        "duration_s": summary["duration_s"],
        "cpu_core_s": summary["cpu_core_s"]["all"],
        "cpu_core_s_per_sample": summary["cpu_core_s_per_sample"]["all"],
        "run_queue_wait_s": summary.get("run_queue_wait_s"),
        "gpu_energy_joules": (summary.get("energy_joules") or {}).get("gpu"),
        "cpu_energy_joules": (summary.get("energy_joules") or {}).get("cpu"),
        "joules_per_sample": (summary.get("joules_per_sample") or {}).get("all"),
        "sm_active_percentage": summary.get("mean_sm_active_percentage"),
        "gpu_utilization_percentage": summary.get("mean_gpu_utilization_percentage"),
    }
    for key, value in figures.items():
        run.log_metric(key, [(end, value, 0)])
    return summary


def track_command(
    command: Sequence[str],
    out: str = "runs",
    experiment: str = "batchcast",
    workload: str = "default",
    run_name: Optional[str] = None,
    interval: float = 1.0,
    samples: Optional[int] = None,
    params: Optional[Dict[str, str]] = None,
    gpu: bool = True,
    env: Optional[Dict[str, str]] = None,
) -> int:
    """Runs ``command`` and records it (see the module doc); returns its exit status."""
    if not command:
        raise ValueError("batchcast track: no command given; put it after --")
    run_name = run_name or _run_name(command)
    run_dir = os.path.abspath(os.path.join(out, experiment, workload, run_name))
    store = Store(os.path.join(out, "mlruns"))
    exp_id = store.experiment_id(experiment)
    parent = store.parent_run(exp_id, workload)
    native = metrics._native()
    state: Dict[str, Any] = {"pid": 0, "exact": None, "samples": 0, "adopted": None}
    # The command's stdout is its own: this process's messages (the native collector logs to
    # fd 1) go to stderr while the command runs, and the command gets the original stdout.
    sys.stdout.flush()
    command_stdout = os.dup(1)
    os.dup2(2, 1)

    def snapshot() -> Dict[str, Any]:
        adopted = state["adopted"]
        if adopted is None:
            return {}
        if state["exact"] is None:
            adopted.look()
        return {"processes": [{"role": "command", "id": run_name, "pid": state["pid"],
                               "since_start": True, "exact_cpu_s": state["exact"],
                               "samples": state["samples"]}, *adopted.processes()]}

    collector = native.MetricsCollector(os.path.join(run_dir, metrics.TRACK_PART), snapshot,
                                        float(interval), run_name, gpu)
    run = store.create_run(exp_id, run_name, {
        "batchcast.workload": workload, "batchcast.run_dir": run_dir,
        "batchcast.collocation": collector.collocation,
        "mlflow.source.name": shlex.join(command)}, parent=parent)
    parent.set_tags({"batchcast.collocation": collector.collocation})
    run.log_params({"command": shlex.join(command), "workload": workload,
                    "collocation": collector.collocation, "interval_s": interval,
                    "devices": (env or os.environ).get("CUDA_VISIBLE_DEVICES", "all"),
                    **(params or {})})
    child_env = dict(os.environ if env is None else env, **{ENV_METRICS_DIR: run_dir})
    _become_subreaper()
    collector.start()  # the baseline tick comes before the command exists
    status, code = KILLED, 1
    forwarded: Dict[int, Any] = {}
    children: List[subprocess.Popen] = []

    def forward(signum: int, _frame: Any) -> None:
        for child in children:
            child.send_signal(signum)

    # Ctrl-C reaches the command from the terminal itself (same process group): swallowed here
    # (a handler, not SIG_IGN, which the command would inherit) so that the command decides how
    # to end; a supervisor's SIGTERM/SIGHUP is passed on. Installed before the command starts,
    # so no signal can end this process and orphan the command.
    forwarded[signal.SIGINT] = signal.signal(signal.SIGINT, lambda *_: None)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        forwarded[sig] = signal.signal(sig, forward)
    try:
        proc = subprocess.Popen(list(command), env=child_env, stdout=command_stdout,
                                restore_signals=True)
        children.append(proc)
        state["pid"] = proc.pid
        state["adopted"] = _Adopted(proc.pid)
        while True:
            try:
                _, wstatus, ru = os.wait4(proc.pid, 0)
                break
            except InterruptedError:
                continue
        proc.returncode = os.waitstatus_to_exitcode(wstatus)
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        left = state["adopted"].reap_all()
        state["samples"] = samples or 0
        state["exact"] = _rusage_cpu(ru)
        if left:
            print(f"batchcast track: {len(left)} process(es) the command started are still "
                  f"running (pids {', '.join(map(str, left))}); their CPU counts where they "
                  "record it (a share producer does), else until now", file=sys.stderr)
        status = FINISHED if code == 0 else FAILED
    except FileNotFoundError as e:
        print(f"batchcast track: cannot run {command[0]!r}: {e.strerror}; check the command",
              file=sys.stderr)
        code, status = 127, FAILED
    finally:
        for sig, handler in forwarded.items():
            signal.signal(sig, handler)
        collector.stop()
        try:
            log_run_dir(run, run_dir)
            print(f"batchcast track: run recorded in {run_dir} (MLflow store "
                  f"{os.path.abspath(os.path.join(out, 'mlruns'))}); see it with "
                  f"`batchcast report {shlex.quote(run_dir)}`", file=sys.stderr)
        finally:
            run.end(status)
            parent.end(FINISHED)  # the workload's span so far: ends with its latest command
            sys.stdout.flush()
            os.dup2(command_stdout, 1)
            os.close(command_stdout)
    return code


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command: List[str] = []
    if "--" in args:
        i = args.index("--")
        args, command = args[:i], args[i + 1:]
    p = argparse.ArgumentParser(
        prog="batchcast track", description=__doc__.split("\n\n")[0],
        usage="batchcast track [options] -- COMMAND...\n"
              "       batchcast track --file EXPERIMENTS.csv|.yaml [--out DIR]")
    p.add_argument("--out", default="runs", help="root of run trees and mlruns (default: runs)")
    p.add_argument("--experiment", default="batchcast", help="MLflow experiment name")
    p.add_argument("--workload", default="default", help="groups collocated commands")
    p.add_argument("--run-name", help="default: <command>-<time>-<pid>")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--samples", type=int, help="samples the command consumes, if known")
    p.add_argument("--param", action="append", default=[], metavar="K=V",
                   help="an MLflow param of the run (repeatable)")
    p.add_argument("--no-gpu", action="store_true", help="skip NVML")
    p.add_argument("--file", help="an experiment file (CSV or YAML) to run instead of COMMAND")
    o = p.parse_args(args)
    if o.interval <= 0:
        p.error("--interval must be > 0")
    if o.file:
        if command:
            p.error("give either --file or a COMMAND after --, not both")
        from .experiment_file import run_experiment_file

        return run_experiment_file(o.file, o.out, o.interval)
    if not command:
        p.error("no command: batchcast track [options] -- COMMAND...")
    params = {}
    for kv in o.param:
        k, sep, v = kv.partition("=")
        if not sep:
            p.error(f"--param {kv!r}: expected KEY=VALUE")
        params[k] = v
    return track_command(command, o.out, o.experiment, o.workload, o.run_name, o.interval,
                         o.samples, params, not o.no_gpu)
