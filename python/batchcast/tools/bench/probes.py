"""What the collocated benchmark reads from the machine around each measured window: GPU energy
(NVML), CPU time of the benchmark's process tree (/proc), and the hardware and software it ran on.

Thread-safety: the functions keep no state; an ``Energy`` reader belongs to one thread.
Ownership: ``Energy`` holds the NVML library loaded with ctypes for the process's lifetime
(nvmlShutdown is not called: NVML reference-counts init and the process exits soon after).

Why a local NVML reader: the figure needed is one counter (total energy since driver load, in
mJ, Volta and later) read at the two ends of a window; ctypes avoids a dependency.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from typing import Any, Dict, List, Optional


class Energy:
    """The energy counters of GPUs 0..gpus-1, summed, in joules; ``read()`` is None where NVML or
    a counter is missing (no GPU, pre-Volta GPU, no driver)."""

    def __init__(self, gpus: int = 1) -> None:
        self._nvml: Any = None
        self._handles = [ctypes.c_void_p() for _ in range(gpus)]
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if nvml.nvmlInit_v2() == 0 and all(nvml.nvmlDeviceGetHandleByIndex_v2(
                    i, ctypes.byref(h)) == 0 for i, h in enumerate(self._handles)):
                self._nvml = nvml
        except OSError:
            pass  # no NVML: no energy figures

    def read(self) -> Optional[float]:
        if self._nvml is None:
            return None
        total = 0.0
        for handle in self._handles:
            mj = ctypes.c_ulonglong()
            if self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(mj)) != 0:
                return None
            total += mj.value / 1000.0
        return total


def _stat(pid: int) -> Optional[List[str]]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            # comm may hold spaces and parentheses: the fields start after the last ')'
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None  # the process ended meanwhile


def descendants(root: int) -> List[int]:
    """Every live process below `root` (children, grandchildren...), from /proc's parent ids."""
    children: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat(int(name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cpu_seconds(pids: List[int]) -> Dict[int, float]:
    """User + system CPU seconds of each pid (all its threads) that is still alive."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in pids:
        fields = _stat(pid)
        if fields is not None:
            out[pid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> Dict[str, Any]:
    """Hardware and software versions, recorded with every result file."""
    import torch
    import torchvision
    from .. import metrics
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)), "gpu": gpu,
        "python": platform.python_version(), "torch": torch.__version__,
        "torchvision": torchvision.__version__, "platform": platform.platform(),
        "argv": sys.argv,
        # How collocated processes share the GPU (time-slicing, MPS, MIG), where this build of
        # batchcast.tools.metrics can tell.
        "collocation_mode": (metrics.collocation_mode()
                             if hasattr(metrics, "collocation_mode") else None),
    }
