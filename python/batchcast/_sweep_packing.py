"""``--per-gpu auto``: how many trials fit on a GPU, from the first trial's measured memory.

What it is: the sweep starts with one slot per GPU. :class:`MemoryPacking` reads the GPUs'
memory (``nvidia-smi --query-gpu=uuid,memory.used,memory.total``) when the first trial starts
on a GPU and then at every report while it runs alone there; once that trial finished its first
epoch (its shared loaders report it) or ended, the most it added to its GPU's used memory
(itself, and a share producer's GPU pool or an MPS server it caused) is its footprint, and each
GPU gets ``floor(total x (1 - HEADROOM) / footprint)`` slots (1 to MOST): the runner adds them.
Measuring the GPU rather than the trial's processes counts what MPS clients use too (under MPS
the driver lists only the MPS server's process).

Thread-safety: none; the sweep's one thread uses it.
"""

from __future__ import annotations

import math
import subprocess
from typing import Any, Dict, Optional, Sequence, Tuple

from ._sweep_devices import Gpu

__all__ = ["HEADROOM", "MOST", "MemoryPacking"]

HEADROOM = 0.1  # of each GPU's memory, left free
MOST = 8  # trials per GPU at most (a trial that uses next to no GPU memory)


def _memory() -> Dict[str, Tuple[float, float]]:
    """Used and total MiB of each GPU, by UUID; empty where nvidia-smi cannot tell."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid,memory.used,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found = {}
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        try:
            found[fields[0]] = (float(fields[1]), float(fields[2]))
        except (IndexError, ValueError):
            continue
    return found


class MemoryPacking:
    """See the module doc. ``decision``: None while measuring, then {GPU index: slots}."""

    def __init__(self, gpus: Sequence[Gpu]) -> None:
        self._gpus = list(gpus)
        self._trial: Optional[str] = None
        self._gpu: Optional[Gpu] = None
        self._base = 0.0
        self._peak = 0.0
        self.decision: Optional[Dict[int, int]] = None
        self.line = ""

    def started(self, record: Dict[str, Any], gpu: Optional[Gpu]) -> None:
        """A trial starts on ``gpu``: the first one is measured, from its GPU's memory now."""
        if self._trial is None and gpu is not None:
            self._trial, self._gpu = record["id"], gpu
            self._base = _memory().get(gpu.device, (0.0, 0.0))[0]

    def update(self, records: Sequence[Dict[str, Any]]) -> Optional[Dict[int, int]]:
        """Measures while the first trial runs; its decision once made (once: then None)."""
        if self.decision is not None or self._trial is None or self._gpu is None:
            return None
        memory = _memory()
        used = memory.get(self._gpu.device, (self._base, 0.0))[0]
        self._peak = max(self._peak, used - self._base)
        first = next(r for r in records if r["id"] == self._trial)
        if not (first.get("epochs") or 0) >= 1 and first.get("end") is None:
            return None
        when = "its first epoch" if (first.get("epochs") or 0) >= 1 else "its run"
        self.decision = {}
        for g in self._gpus:
            total = memory.get(g.device, (0.0, 0.0))[1]
            fits = MOST if self._peak <= 0 else math.floor(total * (1 - HEADROOM) / self._peak)
            self.decision[g.index] = max(1, min(MOST, fits))
        self.line = (f"--per-gpu auto: trial {self._trial} added {self._peak:.0f} MiB to GPU "
                     f"{self._gpu.index}'s memory at most over {when}; with "
                     f"{HEADROOM:.0%} headroom: " + ", ".join(
                         f"{k} trials on GPU {i}" for i, k in self.decision.items()))
        return self.decision
