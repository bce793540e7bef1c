"""The plot of a sweep: ``OUT/sweep.png``, one row per slot, each trial a bar from its start to
its end (green finished, red failed, grey stopped), labelled with its id and samples/s, so the
packing of the slots and the time to finish the whole sweep show at a glance.

Pure function of summary.json's content; matplotlib (Agg) is imported here only, and where it is
missing the sweep goes on without a plot (:func:`plot` returns why).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

__all__ = ["plot"]

_COLOURS = {"finished": "#4c9a5a", "failed": "#c44e52", "stopped": "#8c8c8c"}


def plot(summary: Dict[str, Any], path: str) -> Tuple[Optional[str], str]:
    """Draws ``summary`` into ``path``: (the path, "") or (None, why there is no plot)."""
    ran = [t for t in summary["trials"] if t.get("start") and t.get("end")]
    if not ran:
        return None, "no trial ran"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return None, f"matplotlib is not installed ({e})"
    t0 = min(t["start"] for t in ran)
    slots = sorted({t.get("slot", 0) for t in ran})
    row = {slot: i for i, slot in enumerate(slots)}
    gpu_of = {t.get("slot", 0): t.get("gpu") for t in ran}
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * len(slots)))
    for t in ran:
        y = row[t.get("slot", 0)]
        ax.barh(y, t["end"] - t["start"], left=t["start"] - t0, height=0.7,
                color=_COLOURS.get(t["state"], "#4878d0"), edgecolor="white")
        rate = t.get("samples_per_s")
        label = t["id"] if rate is None else f"{t['id']} {rate:.0f}/s"
        ax.text(t["start"] - t0 + 0.02 * (t["end"] - t["start"]), y, label, va="center",
                fontsize=7, color="white", clip_on=True)
    ax.set_yticks(range(len(slots)))
    ax.set_yticklabels([f"slot {s}" + ("" if gpu_of[s] is None else f" (GPU {gpu_of[s]})")
                        for s in slots])
    ax.invert_yaxis()
    span = max(t["end"] for t in ran) - t0
    done = sum(t["state"] == "finished" for t in ran)
    ax.set_xlabel("seconds since the first trial started")
    ax.set_title(f"{summary['sweep']['id']}: {done} of {len(summary['trials'])} trials finished "
                 f"in {span:.0f} s ({summary['sweep'].get('collocation')})", fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path, ""
