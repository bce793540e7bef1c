"""Experiment files for ``batchcast track --file EXPERIMENTS.csv|.yaml [--out DIR]``.

An experiment file starts a whole experiment: rows of one workload run collocated (together),
workloads run one after another. CSV columns are radT's: Experiment, Workload, Status, Run,
Devices, Collocation, File, Listeners, Params (File: a ``.py`` file, relative to the experiment
file, run with this Python, or a command line; Params: its arguments; Devices:
CUDA_VISIBLE_DEVICES; Listeners: radT's metric listeners, kept as the run's MLflow param
``listeners``, since the collector records everything the machine gives). Each row is one
``batchcast track`` command. Status, Run (the run's name) and Collocation (detected) are written
back after every change, and running the file again resumes it: rows whose Status is
``finished`` are skipped. YAML files hold the same fields in lowercase under ``runs:`` (PyYAML
is needed for them). After a workload's commands ended, the processes they left running are
waited for and the workload's figures are said once. metrics/sweep_example.csv is an example.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from typing import Any, Dict, List

from .._proc import pid_running
from . import metrics

__all__ = ["run_experiment_file"]

_CSV_COLUMNS = ["Experiment", "Workload", "Status", "Run", "Devices", "Collocation", "File",
                "Listeners", "Params"]


def _read_experiment(path: str) -> tuple:
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise SystemExit(f"batchcast track: {path} is YAML, which needs PyYAML "
                             "(pip install pyyaml); or write the experiment as CSV") from None
        with open(path) as f:
            doc = yaml.safe_load(f) or {}
        rows = [{k.capitalize(): ("" if v is None else str(v)) for k, v in r.items()}
                for r in doc.get("runs", [])]
        for r in rows:
            r.setdefault("Experiment", str(doc.get("experiment", "batchcast")))
        return rows, doc
    import csv

    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return rows, None


def _write_experiment(path: str, rows: List[Dict[str, str]], doc: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        if doc is not None:
            import yaml

            doc = dict(doc, runs=[{k.lower(): v for k, v in r.items() if k != "Experiment"
                                   or v != str(doc.get("experiment", "batchcast"))}
                                  for r in rows])
            yaml.safe_dump(doc, f, sort_keys=False)
        else:
            import csv

            columns = _CSV_COLUMNS + [c for c in (rows[0] if rows else {}) if c not in _CSV_COLUMNS]
            w = csv.DictWriter(f, fieldnames=columns)
            w.writeheader()
            w.writerows(rows)
    os.replace(tmp, path)


def _row_command(row: Dict[str, str], base: str) -> List[str]:
    file = row.get("File", "").strip()
    if not file:
        raise SystemExit(f"batchcast track: a row of workload {row.get('Workload')!r} has no "
                         "File; name the script or command to run")
    params = shlex.split(row.get("Params", "") or "")
    if file.endswith(".py"):
        path = file if os.path.isabs(file) else os.path.join(base, file)
        return [sys.executable, path, *params]
    return [*shlex.split(file), *params]


def run_experiment_file(path: str, out: str = "runs", interval: float = 1.0) -> int:
    """Runs every unfinished row of experiment file ``path`` (see the module doc); returns 0 if
    every row finished, else 1."""
    rows, doc = _read_experiment(path)
    base = os.path.dirname(os.path.abspath(path))
    workloads: Dict[tuple, List[Dict[str, str]]] = {}
    for r in rows:
        r.setdefault("Status", "")
        workloads.setdefault((r.get("Experiment") or "batchcast", r.get("Workload") or "default"),
                             []).append(r)
    collocation = metrics.collocation_mode()
    failed = False
    for (experiment, workload), group in workloads.items():
        todo = [r for r in group if r.get("Status", "").strip() != "finished"]
        if not todo:
            continue
        procs = []
        for i, r in enumerate(todo):
            name = f"{workload}-{i}-{time.strftime('%Y%m%d-%H%M%S')}"
            env = dict(os.environ)
            if r.get("Devices", "").strip():
                env["CUDA_VISIBLE_DEVICES"] = r["Devices"].strip()
            cmd = [sys.executable, "-m", "batchcast", "track", "--out", out, "--experiment",
                   experiment, "--workload", workload, "--run-name", name, "--interval",
                   str(interval), "--param", f"listeners={r.get('Listeners', '')}", "--",
                   *_row_command(r, base)]
            r.update(Status="running", Run=name, Collocation=collocation)
            procs.append((r, subprocess.Popen(cmd, env=env)))
        _write_experiment(path, rows, doc)
        try:
            for r, p in procs:
                code = p.wait()
                r["Status"] = "finished" if code == 0 else f"failed (exit {code})"
                failed = failed or code != 0
        except KeyboardInterrupt:
            for r, p in procs:  # the commands got Ctrl-C from the terminal; wait for their trackers
                p.wait()
                if r["Status"] == "running":
                    r["Status"] = "interrupted"
            _write_experiment(path, rows, doc)
            return 130
        _write_experiment(path, rows, doc)
        _close_workload(os.path.join(out, experiment, workload), [r["Run"] for r in todo])
    return 1 if failed else 0


def _close_workload(dir: str, runs: List[str], patience_s: float = 120.0) -> None:
    """After a workload's commands ended: waits (up to ``patience_s``) for the processes they
    left running (a share producer lingers until its last Loader left), so that their records
    are final and they do not run into the next workload; then says the workload's figures and
    what could not be computed, once."""
    left = []
    for run in runs:
        try:
            left += metrics.outlived(metrics._load(os.path.join(dir, run, metrics.TRACK_PART)))
        except (OSError, ValueError):
            continue
    deadline = time.monotonic() + patience_s
    while any(pid_running(pid) for pid in left) and time.monotonic() < deadline:
        time.sleep(0.2)
    still = [pid for pid in left if pid_running(pid)]
    if still:
        print(f"batchcast track: pids {', '.join(map(str, still))} still running "
              f"{patience_s:.0f} s after workload {os.path.basename(dir)} ended; its figures "
              "count them until now", file=sys.stderr)
    try:
        s = metrics.summarize(dir)
    except (OSError, ValueError) as e:
        print(f"batchcast track: {e}", file=sys.stderr)
        return
    per = s["cpu_core_s_per_sample"]["all"]
    print(f"batchcast track: workload {os.path.basename(dir)}: {s['samples']} samples, "
          f"{s['cpu_core_s']['all']:.2f} CPU core-s"
          + (f" ({per * 1e3:.3f} core-ms/sample)" if per is not None else "")
          + f"; `batchcast report {shlex.quote(dir)}`", file=sys.stderr)
    for w in s.get("warnings", []):
        print(f"batchcast track: workload {os.path.basename(dir)}: {w}", file=sys.stderr)
