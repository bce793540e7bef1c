"""The GPUs' energy counters through NVML, loaded with ctypes (no NVML headers or Python package
needed): what ``batchcast sweep`` and ``batchcast bench`` divide by samples for joules per
sample. The counter is the total energy since the driver loaded, in mJ (Volta and later), read at
the two ends of a window.

Thread-safety: a ``GpuEnergy`` belongs to one thread. Ownership: it holds NVML loaded for the
process's lifetime (nvmlShutdown is not called: NVML reference-counts init).
"""

from __future__ import annotations

import ctypes
from typing import Any, Iterable, Optional

__all__ = ["GpuEnergy"]


class GpuEnergy:
    """The energy counters of the GPUs of NVML indices ``indices`` (nvidia-smi -L's order),
    summed, in joules; ``read()`` is None where NVML or a counter is missing (no GPU, a MIG
    instance, a pre-Volta GPU, no driver)."""

    def __init__(self, indices: Iterable[int]) -> None:
        self._nvml: Any = None
        self._handles = [(i, ctypes.c_void_p()) for i in indices]
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if nvml.nvmlInit_v2() == 0 and all(nvml.nvmlDeviceGetHandleByIndex_v2(
                    i, ctypes.byref(h)) == 0 for i, h in self._handles):
                self._nvml = nvml
        except OSError:
            pass  # no NVML: no energy figures

    def read(self) -> Optional[float]:
        if self._nvml is None or not self._handles:
            return None
        total = 0.0
        for _, handle in self._handles:
            mj = ctypes.c_ulonglong()
            if self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(mj)) != 0:
                return None
            total += mj.value / 1000.0
        return total
