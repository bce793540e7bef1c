"""What the collocated benchmark reads from the machine around each measured window, besides the
GPUs' energy (batchcast._energy.GpuEnergy): CPU time of the benchmark's process tree (/proc, read
through batchcast._proc), and the hardware and software it ran on.

Thread-safety: the functions keep no state.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any, Dict, List

from ..._proc import stat_fields


def descendants(root: int) -> List[int]:
    """Every live process below `root` (children, grandchildren...), from /proc's parent ids."""
    children: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat_fields(int(name))
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
        fields = stat_fields(pid)
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
