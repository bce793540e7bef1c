"""How a Loader's batch reaches the trainer's device: the one seam between the pool and the
trainer's GPU (:class:`DeviceCopy`), and which GPU a ``device`` argument names
(:func:`cuda_index`). Internal to :mod:`batchcast.loader`.

Thread-safety: a DeviceCopy belongs to one Loader, used by one thread.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["DeviceCopy", "cuda_index"]


def cuda_index(device: Any) -> int:
    """The CUDA device index `device` names ("cuda:1", torch.device, 1), else -1. A pool in GPU
    memory is read on that GPU (a pool on several GPUs has an arena on each); one the pool is
    not on is refused (no silent peer copy)."""
    if device is None:
        return -1
    if isinstance(device, int):
        return device
    text = str(device)
    if not text.startswith("cuda"):
        return -1
    if ":" in text:
        return int(text.split(":", 1)[1])
    import torch

    return torch.cuda.current_device()


class DeviceCopy:
    """Moves a batch's tensors to the Loader's ``device``: the one seam between the pool and the
    trainer's GPU.

    With ``pin_memory`` and a CUDA device, host batches reach the GPU through page-locked memory
    by ``non_blocking`` copies on the current stream: the host queues them and goes on preparing
    the next step while the GPU copies (torch's ``pin_memory`` idiom). The consumer
    page-locks its read-only mapping of the pool once (``batch.pinned`` views) and the slot is
    released only once the stream has done the copy: an event recorded there when the batch is
    freed (no host wait, no device-wide sync). Other host batches (private copies, or a pool
    that could not be page-locked, logged once by the consumer) are staged through torch's
    pinned allocator, which keeps each buffer until its copy has completed. Without a device,
    ``pin_memory`` returns pinned host copies, as torch's DataLoader does; without a usable CUDA
    device it is ignored, with one log line (torch warns likewise).
    """

    def __init__(self, device: Any, pin_memory: bool) -> None:
        import torch

        self.device = torch.device(device) if device is not None else None
        cuda = torch.cuda.is_available()
        self.pin_host = pin_memory and cuda and self.device is None
        on_gpu = self.device is not None and self.device.type == "cuda"
        self.pin_copies = pin_memory and cuda and on_gpu
        if pin_memory and not (self.pin_host or self.pin_copies):
            logging.getLogger("batchcast").warning(
                "pin_memory=True is ignored: %s",
                "no CUDA device is usable" if not cuda else f"device {self.device} is not a GPU",
            )

    def stream(self, batch: Any) -> int:
        """The stream that reads the batch: it waits for a GPU pool's writes, and the slot is
        released once it has finished (``batch.capsules(stream)``); 0 for host reads."""
        import torch

        if batch.cuda_device >= 0:
            return int(torch.cuda.current_stream(batch.cuda_device).cuda_stream)
        if self.pin_copies and batch.pinned:
            return int(torch.cuda.current_stream(self.device).cuda_stream)
        return 0

    def __call__(self, batch: Any, tensors: list) -> list:
        if self.pin_host and batch.cuda_device < 0:
            return [t.pin_memory() for t in tensors]
        if self.device is None:
            return tensors
        if not self.pin_copies or batch.cuda_device >= 0:
            return [t.to(self.device) for t in tensors]
        if batch.pinned:
            return [t.to(self.device, non_blocking=True) for t in tensors]
        return [t.pin_memory().to(self.device, non_blocking=True) for t in tensors]
