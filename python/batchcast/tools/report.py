"""Plots and an HTML page for one or more metrics run directories.

    python -m batchcast.tools.report DIR [DIR ...] [--out OUT]

(`batchcast report` runs exactly this.) Each DIR is a run tree as written by `batchcast track`,
the server's collector or batchcast.tools.metrics.track() (several parts are combined, see
batchcast.tools.metrics.summarize), or an MLflow run directory (mlruns/EXPERIMENT/RUN) written by
`batchcast track`. Several DIRs are drawn side by side in each picture; comparison.png sets
samples/s, CPU per sample, joules per sample, SM activity and run-queue wait next to each other,
and the table states what each run saves against the first DIR (its baseline) three ways: CPU
core-seconds per sample, joules per sample and CPU cores. Writes PNGs and index.html into OUT (default
<first DIR>/report) and prints the path of index.html.
"""

from __future__ import annotations

import argparse
import html
import math
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

from . import metrics
from . import report_tables as tables

__all__ = ["load_run", "render", "main"]


def _float(v: Optional[str]) -> float:
    n = metrics.csv_number(v)
    return math.nan if n is None else n


class Run:
    """A run directory: its combined summary and time series on one clock (seconds since the
    earliest part started)."""

    def __init__(self, dir: str) -> None:
        self.dir = os.path.abspath(dir)
        self.summary = metrics.summarize(dir)
        self.name = self.summary["run_name"]
        self.step = float(self.summary.get("interval_s") or 1.0)  # grid of the "all" lines
        start = self.summary["start_unix_s"]
        # processes: (part, role, id, pid) -> {"t": [...], column: [...]}
        self.processes: Dict[tuple, Dict[str, List[float]]] = {}
        self.server: List[Dict[str, List[float]]] = []  # one per part that has a ring
        self.system: Optional[Dict[str, List[float]]] = None  # from the longest part
        longest = -1.0
        if self.summary.get("mlflow"):
            self._load_mlflow(start)
        for rel in self.summary["parts"]:
            part = os.path.normpath(os.path.join(self.dir, rel))
            s = metrics._load(part)
            offset = s.get("start_unix_s", start) - start
            for row in metrics.read_csv(os.path.join(part, "processes.csv")):
                key = (rel, row["role"], row["id"], row["pid"])
                series = self.processes.setdefault(key, {})
                series.setdefault("t", []).append(_float(row["time_s"]) + offset)
                for col in ("cpu_s", "cpu_percent", "rss_mb", "tree_rss_mb", "samples",
                            "samples_per_s", "wait_s", "run_queue_wait_s"):
                    series.setdefault(col, []).append(_float(row.get(col)))
            rows = metrics.read_csv(os.path.join(part, "server.csv"))
            if rows and any(_float(r.get("ring_size")) > 0 for r in rows):
                self.server.append(_columns(rows, offset))
            if s.get("duration_s", 0.0) > longest:
                rows = metrics.read_csv(os.path.join(part, "system.csv"))
                if rows:
                    self.system = _columns(rows, offset)
                    longest = s.get("duration_s", 0.0)

    def _load_mlflow(self, start: float) -> None:
        from .mlflow_store import read_run

        m = read_run(self.dir)["metrics"]
        def series(key: str) -> Dict[str, List[float]]:
            pts = m.get(key) or []
            return {"t": [p[0] / 1000.0 - start for p in pts], "v": [p[1] for p in pts]}
        cpu = series("process/cpu_core_s")
        proc = {"t": cpu["t"], "cpu_s": cpu["v"]}
        for col, key in (("cpu_percent", "process/cpu_percent"),
                         ("samples_per_s", "process/samples_per_s"),
                         ("run_queue_wait_s", "process/run_queue_wait_s")):
            v = series(key)
            proc[col] = v["v"] if len(v["v"]) == len(cpu["t"]) else [math.nan] * len(cpu["t"])
        self.processes[("", "command", self.name, "")] = proc
        system = {k: series(k) for k in m if k.startswith("system/")}
        if system:
            first = next(iter(system.values()))
            self.system = {"t": first["t"]}
            self.system.update({k: v["v"] for k, v in system.items()
                                if len(v["v"]) == len(first["t"])})

    def label(self, key: tuple) -> str:
        _, role, id, pid = key
        return f"{role} {id}" if id and id != pid else f"{role} {pid}"

    def gpu_columns(self) -> List[str]:
        if not self.system:
            return []
        return sorted(c for c in self.system if c.startswith("system/gpu_")
                      and c.endswith("_utilization_percentage"))


def _columns(rows: List[Dict[str, str]], offset: float) -> Dict[str, List[float]]:
    out: Dict[str, List[float]] = {c: [] for c in rows[0]}
    for r in rows:
        for c in out:
            out[c].append(_float(r.get(c)))
    out["t"] = [t + offset for t in out["time_s"]]
    return out


def load_run(dir: str) -> Run:
    return Run(dir)


def _total_rate(series: List[Dict[str, List[float]]], column: str, step: float,
                scale: float = 1.0, limit: Optional[float] = None):
    """Sum over processes of d(column)/dt on a common grid of `step` seconds: each cumulative
    series is interpolated onto the grid (processes sample at different instants), summed,
    differenced. A step whose rate is negative or above ``limit`` (already scaled) is left out
    (NaN): the total moved by what the ticks did not see happen in it (a process's CPU counted
    all at once when it was reaped), which is no rate."""
    import numpy as np

    series = [s for s in series if len(s["t"]) >= 2]
    if not series:
        return None, None
    t0 = min(s["t"][0] for s in series)
    t1 = max(s["t"][-1] for s in series)
    if t1 <= t0:
        return None, None
    steps = max(2, min(2000, int(math.ceil((t1 - t0) / max(step, 1e-3))) + 1))
    grid = np.linspace(t0, t1, steps)
    total = np.zeros_like(grid)
    for s in series:
        t = np.asarray(s["t"])
        v = np.asarray(s[column], dtype=float)
        ok = ~np.isnan(v)
        if ok.sum() < 2:
            continue
        t, v = t[ok], v[ok]
        # Before first sight a process contributes its first value, after its last its last:
        # a constant, so it adds no rate outside its lifetime.
        total += np.interp(grid, t, v)
    rate = np.diff(total) / np.diff(grid) * scale
    if limit is not None:
        rate[(rate < 0) | (rate > limit)] = np.nan
    return grid[1:], rate


def _figure(runs: Sequence[Run], title: str, ylabel: str, draw) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(6.4 * len(runs), 4.2), sharey=True,
                             squeeze=False)
    for ax, run in zip(axes[0], runs):
        draw(ax, run)
        if not ax.lines and not ax.patches:
            ax.text(0.5, 0.5, "not recorded in this run", ha="center", va="center",
                    transform=ax.transAxes, color="gray")
        ax.set_title(run.name)
        ax.set_xlabel("time (s)")
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(handles[:12], labels[:12], fontsize="small", loc="best")
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _save(fig: Any, out: str, name: str) -> str:
    import matplotlib.pyplot as plt

    path = os.path.join(out, name)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return name


def _plot_cpu(ax, run: Run) -> None:
    for key, s in run.processes.items():
        ax.plot(s["t"], s["cpu_percent"], label=run.label(key), linewidth=1)
    cores = (run.summary.get("system") or {}).get("cpu_cores")
    # /proc counts in 10 ms ticks per process: that much slack per process in a grid step.
    limit = (cores * 100.0 + 1.0 * len(run.processes) / run.step) if cores else None
    # The total counts each CPU second once: the processes summarize() counts in "all" (a
    # tracked command's tree, not again the trainer or server that recorded itself inside it).
    counted = {(p["part"], p["role"], p["id"], str(p["pid"])) for p in run.summary["processes"]
               if p.get("counted_in_all", True)}
    total = [s for key, s in run.processes.items() if key in counted or not counted]
    t, rate = _total_rate(total, "cpu_s", run.step, 100.0, limit)
    if t is not None:
        ax.plot(t, rate, label="all processes", color="black", linewidth=2)


def _plot_throughput(ax, run: Run) -> None:
    consumers = {k: s for k, s in run.processes.items() if k[1] in metrics.CONSUMER_ROLES}
    for key, s in consumers.items():
        ax.plot(s["t"], s["samples_per_s"], label=run.label(key), linewidth=1)
    t, rate = _total_rate(list(consumers.values()), "samples", run.step)
    if t is not None and len(consumers) > 1:
        ax.plot(t, rate, label="all consumers", color="black", linewidth=2)


def _plot_ring(ax, run: Run) -> None:
    for i, s in enumerate(run.server):
        ax.plot(s["t"], s["ring_fill_percent"], label=f"ring fill {i}" if i else "ring fill")
        ax.plot(s["t"], s["producer_blocked_percent"], label="producer blocked (% of time)",
                linestyle="--")
    ax.set_ylim(0, 105)


def _plot_gpu(ax, run: Run) -> None:
    for col in run.gpu_columns():
        gpu = col[len("system/"):-len("_utilization_percentage")]
        ax.plot(run.system["t"], run.system[col], label=f"{gpu} utilisation")
    ax.set_ylim(0, 105)


def _plot_per_sample(runs: Sequence[Run], out: str) -> Optional[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("server", "consumers", "all")
    if not any(r.summary["samples"] for r in runs):
        return None
    fig, ax = plt.subplots(figsize=(max(6.4, 2.2 * len(runs) + 2), 4.2))
    width = 0.8 / len(runs)
    for i, r in enumerate(runs):
        vals = [(r.summary["cpu_core_s_per_sample"].get(k) or 0.0) * 1e3 for k in keys]
        ax.bar([j + i * width for j in range(len(keys))], vals, width, label=r.name)
    ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(keys))])
    ax.set_xticklabels(keys)
    ax.set_ylabel("CPU core-ms per consumed sample")
    ax.set_title("CPU per sample")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, out, "cpu_per_sample.png")


_COMPARED = (  # (title, figure of a summary) for comparison.png
    ("samples/s", lambda s: s.get("samples_per_s")),
    ("CPU core-ms / sample", lambda s: tables.scaled(s["cpu_core_s_per_sample"]["all"], 1e3)),
    ("J / sample", lambda s: (s.get("joules_per_sample") or {}).get("all")),
    ("SM activity %", lambda s: s.get("mean_sm_active_percentage")),
    ("run-queue wait (s)", lambda s: s.get("run_queue_wait_s")),
)


def _plot_comparison(runs: Sequence[Run], out: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(_COMPARED), figsize=(3.2 * len(_COMPARED) + 1, 3.8))
    names = [r.name for r in runs]
    for ax, (title, fn) in zip(axes, _COMPARED):
        vals = [fn(r.summary) for r in runs]
        ax.bar(range(len(runs)), [math.nan if v is None else v for v in vals],
               color=[f"C{i}" for i in range(len(runs))])
        for i, v in enumerate(vals):
            if v is None:
                ax.text(i, 0, "not measured", rotation=90, ha="center", va="bottom",
                        color="gray", fontsize="small")
        ax.set_xticks(range(len(runs)))
        ax.set_xticklabels(names, rotation=20, ha="right", fontsize="small")
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, out, "comparison.png")


_CSS = """body{font-family:sans-serif;margin:2em;max-width:1600px}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:right}th{background:#f4f4f4}img{max-width:100%;display:block;margin:1em 0}"""


def _separate(dirs: Sequence[str]) -> List[str]:
    """``dirs`` with each folder that holds several runs (metrics.run_dirs: parts that did not
    run at the same time, such as a parent of a baseline and a shared run) replaced by its
    runs; said on stderr, never merged in silence."""
    out: List[str] = []
    for d in dirs:
        runs = metrics.run_dirs(d)
        if len(runs) > 1:
            print(f"batchcast report: {d} holds {len(runs)} runs that did not run at the same "
                  f"time; reporting them one by one: {', '.join(runs)}", file=sys.stderr)
        out += runs
    return out


def render(dirs: Sequence[str], out: Optional[str] = None) -> str:
    """Writes the PNGs and index.html for run directories ``dirs`` into ``out`` (default
    ``<dirs[0]>/report``); returns the path of index.html."""
    if not dirs:
        raise ValueError("report: give at least one run directory")
    runs = [Run(d) for d in _separate(dirs)]
    out = os.path.abspath(out or os.path.join(dirs[0], "report"))
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise OSError(f"report: cannot create output directory {out}: {e.strerror}; "
                      "pass a writable --out") from None
    images = [
        ("CPU per process", _save(_figure(runs, "CPU per process (incl. child processes)",
                                          "CPU % of one core", _plot_cpu), out, "cpu.png")),
        ("Throughput", _save(_figure(runs, "Throughput per consumer", "samples/s",
                                     _plot_throughput), out, "throughput.png")),
    ]
    if any(r.server for r in runs):
        images.append(("Ring", _save(_figure(runs, "Ring occupancy and producer blocking", "%",
                                             _plot_ring), out, "ring.png")))
    if any(r.gpu_columns() for r in runs):
        images.append(("GPU", _save(_figure(runs, "GPU utilisation", "%", _plot_gpu), out,
                                    "gpu.png")))
    per_sample = _plot_per_sample(runs, out)
    if per_sample:
        images.insert(0, ("CPU per sample", per_sample))
    images.insert(0, ("Comparison", _plot_comparison(runs, out)))
    names = ", ".join(html.escape(r.name) for r in runs)
    page = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>batchcast metrics: {names}</title><style>{_CSS}</style></head><body>",
        f"<h1>batchcast metrics: {names}</h1>",
        "<p>CPU is core-seconds of each process plus its child processes (DataLoader workers), "
        "each CPU second counted once (metrics/README.md, \"What each figure counts\"); "
        "ratios and savings are relative to the first run (the baseline). Cores saved = CPU per "
        "sample saved x the run's samples/s.</p>",
        tables.notes(runs),
        tables.summary_table(runs),
        "".join(tables.process_table(r) for r in runs),
    ]
    for title, name in images:
        page.append(f"<h2>{html.escape(title)}</h2><img src='{name}' alt='{html.escape(title)}'>")
    page.append("</body></html>")
    index = os.path.join(out, "index.html")
    with open(index, "w") as f:
        f.write("\n".join(page))
    return index


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="batchcast report",
        description="PNG plots and an HTML page for batchcast metrics run directories; several "
                    "directories are compared side by side (ratios versus the first).")
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="run directory")
    parser.add_argument("--out", help="output directory (default: <first DIR>/report)")
    args = parser.parse_args(argv)
    try:
        index = render(args.dirs, args.out)
    except (OSError, ValueError) as e:
        print(f"batchcast report: {e}", file=sys.stderr)
        return 2
    print(index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
