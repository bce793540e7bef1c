"""The data paths a benchmark trainer reads from, one per peer (SOURCES), as people build them.

Each ``open_source(peer, args, device)`` returns an endless iterator of (images, labels): images
float32 NCHW normalised with ImageNet's mean and std, RandomResizedCrop(args.image_size) + flip
for every real data path, labels int64, both on `device` (the trainer moves them if not).
Ownership: the iterator owns its loader (DataLoader workers, DALI pipeline, batchcast Loader);
they end with the trainer process. Thread-safety: one trainer thread iterates.

`args.data_cpus` (a list, or None) is the set of cores the data side may use: DataLoader
workers pin themselves there (the GPU decode peer's file readers too), DALI's threads are pinned
once its pipeline started them; batchcast's server is pinned by the orchestrator.
"""

from __future__ import annotations

import argparse
import os
import random
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

import torch

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
Batch = Tuple[torch.Tensor, torch.Tensor]


def _forever(loader: Iterable[Any]) -> Iterator[Any]:
    while True:
        yield from loader


def _pin(cpus: Optional[List[int]]) -> Optional[Callable[[int], None]]:
    return None if cpus is None else _Pin(cpus)


class _Pin:  # a class, not a closure: DataLoader pickles worker_init_fn for spawned workers
    def __init__(self, cpus: List[int]) -> None:
        self.cpus = cpus

    def __call__(self, _worker: int) -> None:
        os.sched_setaffinity(0, self.cpus)


def _dataloader(dataset: Any, args: argparse.Namespace, pin_memory: bool,
                collate: Optional[Callable[..., Any]] = None) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
        drop_last=True, persistent_workers=args.workers > 0, pin_memory=pin_memory,
        worker_init_fn=_pin(args.data_cpus), collate_fn=collate)


def synthetic(args: argparse.Namespace, device: torch.device) -> Iterator[Batch]:
    """The GPU-bound ceiling: one random batch already on the device, reused every step."""
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    labels = torch.randint(0, args.classes, (args.batch_size,), device=device)
    while True:
        yield images, labels


def dataloader(args: argparse.Namespace, device: torch.device) -> Iterator[Batch]:
    """torchvision ImageFolder + PIL transforms in `args.workers` DataLoader workers."""
    import torchvision
    from torchvision import transforms as T
    tf = T.Compose([T.RandomResizedCrop(args.image_size), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(MEAN, STD)])
    loader = _dataloader(torchvision.datasets.ImageFolder(args.data, transform=tf), args,
                         pin_memory=device.type == "cuda")
    for images, labels in _forever(loader):
        yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


class _JpegFiles(torch.utils.data.Dataset):
    """(file bytes, class index) of an ImageFolder: GPU decode's host side."""

    def __init__(self, root: str) -> None:
        import torchvision
        self.samples = torchvision.datasets.ImageFolder(root).samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Tuple[bytes, int]:
        path, label = self.samples[i]
        with open(path, "rb") as f:
            return f.read(), label


def _collate_bytes(batch: List[Tuple[bytes, int]]) -> Tuple[torch.Tensor, torch.Tensor,
                                                            torch.Tensor]:
    # One tensor for the batch's files, plus their sizes: one shared-memory hand-over per batch
    # instead of 128 (a list of torchvision.io.read_file tensors failed there with EBADF).
    data = torch.frombuffer(bytearray(b"".join(b for b, _ in batch)), dtype=torch.uint8)
    sizes = torch.tensor([len(b) for b, _ in batch])
    return data, sizes, torch.tensor([label for _, label in batch])


def _batched_gpu_decode() -> bool:
    """torchvision >= 0.19 decodes a list of JPEGs on CUDA in one batched nvJPEG call."""
    import torchvision
    major, minor = (int(x) for x in torchvision.__version__.split(".")[:2])
    return (major, minor) >= (0, 19)


def gpu_decode(args: argparse.Namespace, device: torch.device) -> Iterator[Batch]:
    """Each trainer decodes on its own GPU: workers read file bytes, torchvision.io.decode_jpeg
    decodes on CUDA (batched where supported), and RandomResizedCrop, flip and normalise run on
    the GPU image by image (the images differ in size, so they cannot be stacked first)."""
    from torch.nn.functional import interpolate
    from torchvision import transforms as T
    from torchvision.io import ImageReadMode, decode_jpeg
    if device.type != "cuda":
        raise SystemExit("the gpu-decode peer needs --device cuda")
    # File bytes stay in pageable memory: decode_jpeg copies them to the GPU itself.
    loader = _dataloader(_JpegFiles(args.data), args, pin_memory=False, collate=_collate_bytes)
    batched = _batched_gpu_decode()
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
    size = (args.image_size, args.image_size)
    for data, sizes, labels in _forever(loader):
        datas = list(torch.split(data, sizes.tolist()))
        if batched:
            images = decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)
        else:
            images = [decode_jpeg(d, mode=ImageReadMode.RGB, device=device) for d in datas]
        out = torch.empty(len(images), 3, *size, device=device)
        for i, img in enumerate(images):
            top, left, h, w = T.RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3])
            crop = img[None, :, top:top + h, left:left + w].float()
            crop = interpolate(crop, size=size, mode="bilinear", align_corners=False)
            out[i] = crop[0].flip(-1) if random.random() < 0.5 else crop[0]
        yield out.sub_(mean).div_(std), labels.to(device, non_blocking=True)


def dali(args: argparse.Namespace, device: torch.device) -> Iterator[Batch]:
    """NVIDIA DALI: file reader, mixed (nvJPEG) decode, random_resized_crop, flip + normalise."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    @pipeline_def
    def pipeline() -> Any:
        jpegs, labels = fn.readers.file(file_root=args.data, random_shuffle=True, name="reader")
        images = fn.decoders.image(jpegs, device="mixed", output_type=types.RGB)
        images = fn.random_resized_crop(images, size=[args.image_size, args.image_size])
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="CHW", mean=[m * 255 for m in MEAN],
            std=[s * 255 for s in STD], mirror=fn.random.coin_flip())
        return images, labels

    pipe = pipeline(batch_size=args.batch_size, num_threads=args.workers,
                    device_id=device.index or 0, seed=os.getpid())
    before = set(os.listdir("/proc/self/task"))
    pipe.build()
    it = DALIGenericIterator([pipe], ["images", "labels"], reader_name="reader",
                             last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)
    if args.data_cpus is not None:  # DALI has no affinity option: pin the threads it started
        for tid in set(os.listdir("/proc/self/task")) - before:
            os.sched_setaffinity(int(tid), args.data_cpus)
    for (batch,) in _forever(it):
        yield batch["images"], batch["labels"].view(-1).long().to(device, non_blocking=True)


def batchcast_loader(args: argparse.Namespace, device: torch.device) -> Iterator[Batch]:
    """A batchcast server (started by the orchestrator, decoder per peer) through batchcast.Loader,
    reading `args.view` where the trainer's size is one of the server's views; with the pool on
    the GPU the tensors arrive there, zero-copy."""
    from ... import Loader
    # On a GPU: read the pool's arena on this trainer's GPU (a pool on several GPUs has one each).
    loader = Loader(args.endpoint, batch_size=args.batch_size, drop_last=True,
                    timeout=300, name=f"bench-{os.getpid()}",
                    device=device if device.type == "cuda" else None, view=args.view,
                    # A host pool (batchcast-host-cached): page-locked, non_blocking copies.
                    pin_memory=device.type == "cuda")
    try:
        for images, labels in _forever(loader):
            yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
    finally:
        loader.close()  # leave the server now: it keeps a GPU pool until every consumer left


SOURCES = {"synthetic": synthetic, "dataloader": dataloader, "gpu-decode": gpu_decode,
           "batchcast-cpu": batchcast_loader, "batchcast-nvjpeg": batchcast_loader,
           "batchcast-mixed": batchcast_loader, "dali": dali,
           "batchcast-cpu-pergpu": batchcast_loader, "batchcast-nvjpeg-pergpu": batchcast_loader,
           "batchcast-cpu-cached": batchcast_loader, "batchcast-nvjpeg-cached": batchcast_loader,
           "batchcast-mixed-cached": batchcast_loader, "batchcast-host-cached": batchcast_loader}


def open_source(peer: str, args: argparse.Namespace, device: torch.device) -> Iterator[Batch]:
    return SOURCES[peer](args, device)
