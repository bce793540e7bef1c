"""The collocated benchmark's report: Markdown tables and one PNG from its results.json.

Layout read here (written by batchcast.tools.bench.collocated): ``meta`` (machine and settings),
``regimes`` (each: ``trainers``, the [model, image size] of trainer i at index i; n; ``runs``:
peer -> figures of runner.measure, whose ``per_trainer`` entries carry ``of_ceiling``, or
``{"skipped": why}`` / ``{"error": log}``), ``sweep`` (trainers, n, ``runs``: figures at several
``cores``), ``anchor`` (``runs``: data-only figures at N = 1; ``engine``: the lines of
cuda_bench's decode of the same files, when it ran). A regime whose trainers differ (a mixed
regime) also gets a table per trainer. Pure functions of that dict; no state.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

TARGET = 0.95  # "reaches the ceiling": within 5 % of the synthetic rate


def ceiling(regime: Dict[str, Any]) -> Optional[float]:
    return (regime["runs"].get("synthetic") or {}).get("samples_per_s")


def sweep_ceiling(results: Dict[str, Any]) -> Optional[float]:
    """The synthetic rate of the regime the cores sweep reran."""
    return next((ceiling(r) for r in results["regimes"]
                 if r["trainers"] == results["sweep"]["trainers"]), None)


def _f(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def mixed(trainers: Sequence[Sequence[Any]]) -> bool:
    return len({tuple(t) for t in trainers}) > 1


def regime_name(trainers: Sequence[Sequence[Any]]) -> str:
    """The regime in file names (its runs' log folders)."""
    if mixed(trainers):
        return "+".join(f"{m}-{s}" for m, s in trainers)
    return f"{trainers[0][0]}-{trainers[0][1]}-N{len(trainers)}"


def regime_title(r: Dict[str, Any]) -> str:
    if mixed(r["trainers"]):
        return " + ".join(f"{m}:{s}" for m, s in r["trainers"]) + f", N = {r['n']}"
    model, size = r["trainers"][0]
    return f"{model}, {size} px, N = {r['n']}"


def regime_table(regime: Dict[str, Any]) -> str:
    top = ceiling(regime)
    lines = ["| peer | samples/s | of ceiling | workers | CPU cores busy (data side) | "
             "GPU W | J/sample | waiting on data |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for peer, fig in regime["runs"].items():
        if "samples_per_s" not in fig:
            why = fig.get("skipped") or "failed: " + fig.get("error", "?").splitlines()[0]
            lines.append(f"| {peer} | {why} | | | | | | |")
            continue
        pct = f"{100 * fig['samples_per_s'] / top:.0f} %" if top else "-"
        lines.append(
            f"| {peer} | {fig['samples_per_s']:.0f} | {pct} | {_f(fig['workers'], 'd')} | "
            f"{fig['cpu_cores']:.1f} ({fig['data_cpu_cores']:.1f}) | "
            f"{_f(fig['gpu_watts'], '.0f')} | "
            f"{_f(fig['joules_per_sample'], '.3f')} | {100 * fig['wait_fraction']:.0f} % |")
    return "\n".join(lines)


def trainer_table(regime: Dict[str, Any]) -> str:
    """Per trainer, each peer's samples/s and its share of the same trainer's synthetic rate."""
    runs = {p: f for p, f in regime["runs"].items() if "per_trainer" in f}
    lines = ["| trainer | " + " | ".join(runs) + " |", "|---|" + "---:|" * len(runs)]
    for i, (model, size) in enumerate(regime["trainers"]):
        cells = []
        for fig in runs.values():
            t = fig["per_trainer"][i]
            share = t.get("of_ceiling")
            cells.append(f"{t['samples_per_s']:.0f}"
                         + ("" if share is None else f" ({100 * share:.0f} %)"))
        lines.append(f"| {i}: {model}:{size} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fewest_cores(runs: List[Dict[str, Any]], top: Optional[float]) -> Dict[str, Optional[int]]:
    """Per peer, the fewest data-side cores whose rate reaches TARGET of the ceiling (None: no
    swept value did)."""
    out: Dict[str, Optional[int]] = {}
    for fig in sorted(runs, key=lambda f: f.get("cores", 0)):
        peer = fig["peer"]
        out.setdefault(peer, None)
        if out[peer] is None and top and fig.get("samples_per_s", 0) >= TARGET * top:
            out[peer] = fig["cores"]
    return out


def sweep_table(sweep: Dict[str, Any], top: Optional[float]) -> str:
    runs = [f for f in sweep["runs"] if "samples_per_s" in f]
    ks = sorted({f["cores"] for f in runs})
    need = fewest_cores(runs, top)
    lines = ["| peer | " + " | ".join(f"{k} cores" for k in ks) + " | fewest cores for 95 % |",
             "|---|" + "---:|" * (len(ks) + 1)]
    for peer in need:
        by_k = {f["cores"]: f for f in runs if f["peer"] == peer}
        cells = [f"{by_k[k]['samples_per_s']:.0f} ({100 * by_k[k]['samples_per_s'] / top:.0f} %)"
                 if k in by_k and top else "-" for k in ks]
        lines.append(f"| {peer} | " + " | ".join(cells) + f" | {_f(need[peer], 'd')} |")
    return "\n".join(lines)


def anchor_table(anchor: Dict[str, Any]) -> str:
    lines = ["| data path (data only, one consumer, all cores) | samples/s | CPU cores busy |",
             "|---|---:|---:|"]
    for peer, fig in anchor["runs"].items():
        if "samples_per_s" in fig:
            lines.append(f"| {peer} | {fig['samples_per_s']:.0f} | {fig['cpu_cores']:.1f} |")
        else:
            lines.append(f"| {peer} | {fig.get('skipped') or 'failed'} | |")
    engine = anchor.get("engine")
    return "\n".join(lines + ([""] + engine if engine else []))


def markdown(results: Dict[str, Any]) -> str:
    m = results["meta"]
    out = [f"Hardware: {m['cpu']} ({m['cores']} cores), GPU {m['gpu'] or 'none'}; Python "
           f"{m['python']}, torch {m['torch']}, torchvision {m['torchvision']}; collocation "
           f"{m['collocation_mode'] or 'not recorded'}. Batch {m['batch_size']}, "
           f"{'float32' if m['fp32'] else 'bf16 autocast + channels_last'}, {m['seconds']} s "
           f"window per run after {m['warmup']} warmup steps + {m['settle']} s."]
    for r in results["regimes"]:
        out += ["", f"#### {regime_title(r)}", "", regime_table(r)]
        if mixed(r["trainers"]):
            out += ["", "Per trainer: samples/s (share of the same trainer's synthetic rate)", "",
                    trainer_table(r)]
    sweep = results.get("sweep")
    if sweep and sweep["runs"]:
        top = sweep_ceiling(results)
        out += ["", f"#### Cores for the data side, {regime_title(sweep)}", "",
                sweep_table(sweep, top)]
    if results.get("anchor"):
        out += ["", "#### Data only (physical anchor)", "", anchor_table(results["anchor"])]
    return "\n".join(out)


def plot(results: Dict[str, Any], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    regimes = results["regimes"]
    sweep = results.get("sweep") or {"runs": []}
    panels = len(regimes) + (1 if sweep["runs"] else 0)
    fig, axes = plt.subplots(1, panels, figsize=(4.6 * panels, 4), squeeze=False)
    for ax, r in zip(axes[0], regimes):
        peers = [p for p, f in r["runs"].items() if "samples_per_s" in f]
        ax.bar(peers, [r["runs"][p]["samples_per_s"] for p in peers], color="tab:blue")
        if ceiling(r):
            ax.axhline(TARGET * ceiling(r), color="tab:red", ls="--", lw=1, label="95 % of ceiling")
            ax.legend(fontsize=7)
        ax.set(title=regime_title(r), ylabel="aggregate samples/s")
        ax.tick_params(axis="x", rotation=45, labelsize=7)
    if sweep["runs"]:
        ax = axes[0][-1]
        top = sweep_ceiling(results)
        for peer in sorted({f["peer"] for f in sweep["runs"] if "samples_per_s" in f}):
            fs = sorted((f for f in sweep["runs"] if f["peer"] == peer and "samples_per_s" in f),
                        key=lambda f: f["cores"])
            ys = [100 * f["samples_per_s"] / top if top else f["samples_per_s"] for f in fs]
            ax.plot([f["cores"] for f in fs], ys, "o-", label=peer)
        ax.set_xscale("log", base=2)
        ks = sorted({f["cores"] for f in sweep["runs"]})
        ax.set_xticks(ks, [str(k) for k in ks])
        if top:
            ax.axhline(100 * TARGET, color="tab:red", ls="--", lw=1)
            ax.set_ylim(0, 110)
        ax.set(title=f"data-side cores, {regime_title(sweep)}", xlabel="cores",
               ylabel="% of ceiling" if top else "samples/s")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
