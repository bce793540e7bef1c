"""The tables of ``batchcast report``'s page: the runs' summaries side by side (with what each
saves against the first), each run's processes, and what could not be computed."""

from __future__ import annotations

import html
import math
import sys
from typing import Any, Optional, Sequence

from . import metrics

__all__ = ["summary_table", "process_table", "notes", "scaled"]


def scaled(v: Optional[float], k: float) -> Optional[float]:
    return None if v is None else v * k


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return html.escape(str(v))


def _ratio(v: Optional[float], base: Optional[float]) -> str:
    if not v or not base:
        return "–"
    return f"{v / base:.3f}× ({(1 - v / base) * 100:+.1f}% saved)" if v != base else "1.000×"


def summary_table(runs: Sequence[Any]) -> str:
    base = runs[0].summary
    rows = [
        ("directory", lambda s: html.escape(s["dir"])),
        ("parts", lambda s: len(s["parts"])),
        ("complete", lambda s: s["complete"]),
        ("duration (s)", lambda s: _fmt(s["duration_s"], 1)),
        ("samples consumed", lambda s: s["samples"]),
        ("samples/s", lambda s: _fmt(s["samples_per_s"], 1)),
        ("CPU core-s: server", lambda s: _fmt(s["cpu_core_s"]["server"])),
        ("CPU core-s: consumers", lambda s: _fmt(s["cpu_core_s"]["consumers"])),
        ("CPU core-s: all", lambda s: _fmt(s["cpu_core_s"]["all"])),
    ]
    for k in ("server", "consumers", "all"):
        rows.append((f"CPU core-ms/sample: {k}",
                     lambda s, k=k: _fmt((s["cpu_core_s_per_sample"][k] or math.nan) * 1e3, 3)))
    rows += [
        ("CPU/sample (all) vs first",
         lambda s: _ratio(s["cpu_core_s_per_sample"]["all"],
                          base["cpu_core_s_per_sample"]["all"])),
        ("consumer wait for data (s)", lambda s: _fmt(s["wait_s"])),
        ("producer blocked (s)", lambda s: _fmt(s["producer_blocked_s"])),
        ("ring size / mean fill %",
         lambda s: f"{s['ring_size']} / {_fmt(s['mean_ring_fill_percent'], 1)}"
         if s["ring_size"] else "–"),
        ("peak RSS (MB)", lambda s: _fmt(s["peak_rss_mb"], 0)),
        ("mean system CPU %",
         lambda s: _fmt((s.get("system") or {}).get("mean_cpu_utilization_percentage"), 1)),
        ("mean GPU utilisation %", lambda s: _fmt(s.get("mean_gpu_utilization_percentage"), 1)),
        ("collocation", lambda s: _fmt(s.get("collocation"))),
        ("run-queue wait (s)", lambda s: _fmt(s.get("run_queue_wait_s"))),
        ("GPU / CPU energy (J)",
         lambda s: "{} / {}".format(_fmt((s.get("energy_joules") or {}).get("gpu"), 1),
                                    _fmt((s.get("energy_joules") or {}).get("cpu"), 1))),
        ("J/sample (all)", lambda s: _fmt((s.get("joules_per_sample") or {}).get("all"), 4)),
        ("mean SM activity %", lambda s: _fmt(s.get("mean_sm_active_percentage"), 1)),
        ("saved vs first: CPU core-ms/sample",
         lambda s: _fmt(scaled(metrics.savings(s, base)["cpu_core_s_per_sample"], 1e3), 3)),
        ("saved vs first: J/sample",
         lambda s: _fmt(metrics.savings(s, base)["joules_per_sample"], 4)),
        ("saved vs first: CPU cores", lambda s: _fmt(metrics.savings(s, base)["cores"], 2)),
        ("sampler CPU % of a core", lambda s: _fmt(s["sampler"]["percent_of_core"], 3)),
    ]
    head = "".join(f"<th>{html.escape(r.name)}</th>" for r in runs)
    body = "".join(
        "<tr><th>{}</th>{}</tr>".format(
            html.escape(name), "".join(f"<td>{fn(r.summary)}</td>" for r in runs))
        for name, fn in rows)
    return f"<table><tr><th></th>{head}</tr>{body}</table>"


def process_table(run: Any) -> str:
    cols = ("part", "role", "id", "pid", "cpu_core_s", "mean_cpu_percent", "run_queue_wait_s",
            "samples", "samples_per_s", "wait_s", "peak_tree_rss_mb", "max_procs",
            "mean_gpu_sm_percent", "peak_gpu_memory_mb")
    head = "".join(f"<th>{c}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{_fmt(p.get(c))}</td>" for c in cols) + "</tr>"
        for p in run.summary["processes"])
    return (f"<details><summary>{html.escape(run.name)}: {len(run.summary['processes'])} "
            f"processes</summary><table><tr>{head}</tr>{body}</table></details>")


def notes(runs: Sequence[Any]) -> str:
    """A list of what could not be computed in each run (its summary's warnings, also said on
    stderr) and what this machine does not measure; "" when there is nothing to say."""
    items = []
    for r in runs:
        for w in r.summary.get("warnings", []):
            print(f"batchcast report: {r.name}: {w}", file=sys.stderr)
            items.append(f"<li>{html.escape(r.name)}: {html.escape(w)}</li>")
    missing = sorted({m for r in runs for m in r.summary.get("missing", [])})
    if missing:
        items.append("<li>not measured on this machine: "
                     + "; ".join(html.escape(m) for m in missing) + "</li>")
    return f"<ul class='notes'>{''.join(items)}</ul>" if items else ""
