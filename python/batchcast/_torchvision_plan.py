"""Recognises a torchvision ImageFolder pipeline that ``batchcast serve`` reproduces natively.

:func:`plan` looks at a dataset and the torch DataLoader arguments a trainer gave and answers
either a :class:`NativePlan` (the ``batchcast serve`` and Loader arguments that yield the same
samples: labels, order, transform parameters, dtype and layout) or a :class:`Fallback` naming
the step that prevented it, which it also logs once (logger ``batchcast.torchvision_plan``:
WARNING for a torchvision dataset, INFO for any other). Recognised:

- the dataset: ``torchvision.datasets.ImageFolder``, or a ``DatasetFolder`` with the default
  loader, whose ``samples`` equal the native scan of its root (same files, order and labels;
  a filtered or edited sample list is not), and no ``target_transform``;
- the transform: a ``Compose`` (v1 or ``transforms.v2``, nested allowed) of
  ``RandomResizedCrop`` (square, bilinear or nearest) + ``RandomHorizontalFlip``, or
  ``Resize(int)`` + ``CenterCrop`` (square, not larger than the resize), then a conversion to a
  tensor (``ToTensor``, ``PILToTensor``, ``ConvertImageDtype(float32)``, v2's ``ToImage`` /
  ``ToDtype(float32, scale=True)``) and at most one ``Normalize``; the output is float32
  (3, S, S), or uint8 (3, S, S) without a float conversion;
- the DataLoader arguments: no ``batch_sampler`` or ``collate_fn``; no ``sampler``, or torch's
  ``DistributedSampler`` with ``drop_last=False`` (the native server shards the same way:
  rank r takes every num_replicas-th sample of the epoch's order, padded by wrapping around).

Known differences, within the tolerance the native pipeline documents (decoders/README.md):
its resize has no antialias filter, and its random draws come from its own seeded source (the
same distributions, not torch's stream). Thread-safety: pure functions of their arguments, apart
from reading the dataset's folder once.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _batchcast

__all__ = ["NativePlan", "Fallback", "plan", "steps"]

log = logging.getLogger("batchcast.torchvision_plan")


@dataclass(frozen=True)
class NativePlan:
    """What ``batchcast serve`` and a Loader need to yield the torchvision pipeline's batches."""

    root: str  # the ImageFolder root, resolved (absolute, no symlinks)
    # The per-sample transform (its seed: the stream's shuffling and augmentation); also what
    # ``_batchcast.ImagePipeline(plan.transform)`` runs in this process (inspection, tests).
    transform: _batchcast.PipelineOptions
    batch_size: int
    shuffle: bool
    drop_last: bool
    device: str  # where the pool lives: "cpu" or "cuda:K"
    decoder: str  # "cpu" or "mixed" (a GPU pool: CPU workers first, nvJPEG the rest)
    rank: int = 0  # the shard (a DistributedSampler's rank and num_replicas)
    world_size: int = 1
    # Why a pool asked for on a GPU (device and nvjpeg given) is in host memory instead: the
    # GPU decoders resize bilinearly. "": no GPU was asked for, or the pool is on it.
    gpu_refused: str = ""

    def serve_config(self) -> _batchcast.ServeConfig:
        """The :class:`_batchcast.ServeConfig` that serves this pipeline (set endpoint, epochs,
        workers... on it): for ``_batchcast.ServeRun`` or :func:`batchcast.serve`. It names
        the shard explicitly, so RANK/WORLD_SIZE in the environment never shard it further."""
        return _batchcast.ServeConfig(
            data=self.root, batch_size=self.batch_size, transform=self.transform,
            shuffle=self.shuffle, device=self.device, decoder=self.decoder, rank=self.rank,
            world_size=self.world_size,
        )

    def loader_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments of :class:`batchcast.Loader` besides the endpoint."""
        return dict(batch_size=self.batch_size, drop_last=self.drop_last)


@dataclass(frozen=True)
class Fallback:
    """The pipeline runs in Python; ``reason`` names the step that prevented the native path."""

    reason: str


class _Unsupported(Exception):
    """A step the native pipeline does not reproduce (internal: becomes a Fallback)."""


@dataclass
class _Transform:
    """What the steps seen so far amount to."""

    geometry: Optional[str] = None  # "crop" (RandomResizedCrop), "resize", "resize+crop"
    image_size: int = 0
    resize_size: int = 0
    scale: Tuple[float, float] = (0.08, 1.0)
    ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    interpolation: str = "bilinear"
    mode: str = "BILINEAR"  # the step's InterpolationMode, as torchvision names it
    flip_p: float = 0.0
    flips: int = 0
    kind: str = "pil"  # "pil", "uint8" (tensor) or "float" (tensor, values / 255)
    mean: Tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: Tuple[float, float, float] = (1.0, 1.0, 1.0)
    normalized: bool = False


def _torchvision_step(step: Any) -> str:
    """The class name of a torchvision transform; "" for anything else (a user's subclass
    included: it may do more than its base)."""
    module = type(step).__module__
    return type(step).__name__ if module.startswith("torchvision.transforms") else ""


def _describe(index: int, step: Any) -> str:
    text = repr(step).replace("\n", " ")
    return f"step {index} {text if len(text) <= 80 else text[:77] + '...'}"


def _square(size: Any, what: str) -> int:
    sizes = [size] if isinstance(size, int) else list(size)
    if len(sizes) == 2 and sizes[0] == sizes[1]:
        sizes = sizes[:1]
    if len(sizes) != 1 or not isinstance(sizes[0], int):
        raise _Unsupported(f"{what} size {size!r} is not square: the native output is S x S")
    return sizes[0]


def _interpolation(t: _Transform, step: Any) -> None:
    mode = getattr(step.interpolation, "value", step.interpolation)
    t.mode = getattr(step.interpolation, "name", str(mode))
    if mode == "bilinear":
        t.interpolation = "bilinear"
    # PIL's NEAREST (both modes on a PIL image) is nearest-exact's rule; torch's "nearest"
    # on a tensor picks other pixels.
    elif mode == "nearest-exact" or (mode == "nearest" and t.kind == "pil"):
        t.interpolation = "nearest"
    else:
        raise _Unsupported(f"interpolation {mode!r}: the native resize is bilinear or nearest")


def _float_target(dtype: Any) -> bool:
    import torch

    if isinstance(dtype, dict):  # v2.ToDtype({ImageType: dtype, ...})
        values = set(dtype.values()) - {None}
        dtype = values.pop() if len(values) == 1 else None
    if dtype != torch.float32:
        raise _Unsupported(f"dtype {dtype}: the native pipeline converts to float32 only")
    return True


def _apply(t: _Transform, name: str, step: Any) -> None:
    """Folds one recognised step into `t`; raises _Unsupported with the reason."""
    geometric = name in ("RandomResizedCrop", "Resize", "CenterCrop")
    if geometric and t.kind == "float":
        raise _Unsupported("a geometric step after the float conversion (put it before)")
    if name == "RandomResizedCrop":
        if t.geometry is not None:
            raise _Unsupported(f"RandomResizedCrop after {t.geometry}")
        t.geometry, t.image_size = "crop", _square(step.size, "RandomResizedCrop")
        t.scale = (float(step.scale[0]), float(step.scale[1]))
        t.ratio = (float(step.ratio[0]), float(step.ratio[1]))
        _interpolation(t, step)
    elif name == "Resize":
        if t.geometry is not None:
            raise _Unsupported(f"Resize after {t.geometry}")
        if getattr(step, "max_size", None) is not None:
            raise _Unsupported("Resize max_size")
        size = step.size if isinstance(step.size, int) else list(step.size)
        if not isinstance(size, int) and len(size) != 1:
            raise _Unsupported(f"Resize to {tuple(size)}: the native eval sizes the shorter side")
        t.geometry, t.resize_size = "resize", size if isinstance(size, int) else size[0]
        _interpolation(t, step)
    elif name == "CenterCrop":
        t.image_size = _square(step.size, "CenterCrop")
        if t.geometry != "resize" or t.image_size > t.resize_size:
            raise _Unsupported("CenterCrop without a Resize(R >= crop size) right before it")
        t.geometry = "resize+crop"
    elif name == "RandomHorizontalFlip":
        t.flips += 1
        t.flip_p = float(step.p)
    elif name == "ToTensor":
        if t.kind != "pil":
            raise _Unsupported("ToTensor of a tensor")
        t.kind = "float"
    elif name in ("PILToTensor", "ToImage", "ToImageTensor"):
        if t.kind != "pil":
            raise _Unsupported(f"{name} of a tensor")
        t.kind = "uint8"
    elif name in ("ConvertImageDtype", "ConvertDtype", "ToDtype"):
        _float_target(step.dtype)
        if name == "ToDtype" and not getattr(step, "scale", False):
            raise _Unsupported("ToDtype(float32, scale=False) keeps 0..255 values")
        if t.kind == "uint8":
            t.kind = "float"
        elif t.kind != "float":
            raise _Unsupported(f"{name} of a PIL image")
    elif name == "Normalize":
        if t.kind != "float" or t.normalized:
            raise _Unsupported("Normalize of anything but a float tensor, or twice")
        mean, std = list(step.mean), list(step.std)
        if len(mean) != 3 or len(std) != 3:
            raise _Unsupported("Normalize with other than 3 channel values")
        t.mean = (float(mean[0]), float(mean[1]), float(mean[2]))
        t.std = (float(std[0]), float(std[1]), float(std[2]))
        t.normalized = True
    else:
        raise _Unsupported("no native equivalent")


def steps(transform: Any) -> List[Any]:
    """The flat list of steps of (nested) Composes."""
    if _torchvision_step(transform) == "Compose":
        return [s for inner in transform.transforms for s in steps(inner)]
    return [transform]


def _transform(transform: Any) -> _Transform:
    if transform is None:
        raise _Unsupported("transform=None: the dataset yields PIL images")
    t = _Transform()
    for index, step in enumerate(steps(transform)):
        name = _torchvision_step(step)
        try:
            _apply(t, name, step)
        except _Unsupported as e:
            raise _Unsupported(f"{_describe(index, step)}: {e}") from None
    if t.geometry not in ("crop", "resize+crop"):
        raise _Unsupported(
            "no RandomResizedCrop, nor Resize + CenterCrop: the samples would not all be S x S"
        )
    if t.kind == "pil":
        raise _Unsupported("the transform ends with a PIL image, not a tensor")
    if t.flips > 1 or (t.flips and t.geometry != "crop"):
        raise _Unsupported("RandomHorizontalFlip outside a single RandomResizedCrop pipeline")
    return t


def _check_dataset(dataset: Any) -> str:
    """The dataset's root when the native folder scan yields its samples exactly."""
    from torchvision.datasets import DatasetFolder, ImageFolder
    from torchvision.datasets.folder import default_loader, pil_loader

    if type(dataset) not in (ImageFolder, DatasetFolder):
        raise _Unsupported(
            f"dataset {type(dataset).__name__} is not an ImageFolder or DatasetFolder"
        )
    if dataset.loader not in (default_loader, pil_loader):
        loader = getattr(dataset.loader, "__name__", dataset.loader)
        raise _Unsupported(f"dataset loader {loader} is not torchvision's default_loader")
    if getattr(dataset, "target_transform", None) is not None:
        raise _Unsupported("dataset target_transform")
    if default_loader is dataset.loader:
        import torchvision

        if torchvision.get_image_backend() != "PIL":
            raise _Unsupported(f"image backend {torchvision.get_image_backend()}")
    root = str(dataset.root)
    try:
        native = _batchcast.Dataset.image_folder(root)
    except Exception as e:  # noqa: BLE001 - the native scan's own message says what is wrong
        raise _Unsupported(f"dataset root: {e}") from None
    samples: Sequence[Tuple[str, int]] = dataset.samples
    if len(native) != len(samples):
        raise _Unsupported(
            f"dataset.samples has {len(samples)} entries, the folder scan {len(native)} "
            "(filtered, extended or edited samples)"
        )
    i = native.first_difference(samples)  # one C loop, also over an ImageNet-sized list
    if i >= 0:
        raise _Unsupported(
            f"dataset.samples[{i}] = {tuple(samples[i])!r}, the folder scan has {native[i]!r} "
            "(edited samples)"
        )
    return os.path.realpath(root)


@dataclass(frozen=True)
class _Order:
    shuffle: bool
    seed: Optional[int]  # None: the caller's
    rank: int = 0
    world_size: int = 1


def _check_loader_args(args: Mapping[str, Any]) -> _Order:
    """The stream order the arguments ask for; raises _Unsupported where it is not native."""
    for name in ("batch_sampler", "collate_fn"):
        if args.get(name) is not None:
            raise _Unsupported(f"DataLoader {name}=")
    if "batch_size" in args and args["batch_size"] is None:
        raise _Unsupported("DataLoader batch_size=None (unbatched samples)")
    sampler = args.get("sampler")
    if sampler is None:
        return _Order(bool(args.get("shuffle", False)), None)
    from torch.utils.data.distributed import DistributedSampler

    if type(sampler) is not DistributedSampler:
        raise _Unsupported(f"DataLoader sampler={type(sampler).__name__}")
    if sampler.drop_last:
        raise _Unsupported("DistributedSampler(drop_last=True): the native shards pad instead")
    return _Order(bool(sampler.shuffle), int(sampler.seed), int(sampler.rank),
                  int(sampler.num_replicas))


def plan(
    dataset: Any,
    loader_args: Mapping[str, Any],
    *,
    seed: int = 0,
    device: Optional[str] = None,
    nvjpeg: bool = False,
) -> Union[NativePlan, Fallback]:
    """The native plan for ``DataLoader(dataset, **loader_args)``, or why there is none.

    ``seed`` seeds shuffling and augmentation (a DistributedSampler's own seed wins). ``device="cuda:K"`` with ``nvjpeg=True`` (the
    trainer moves its batches to that GPU and this build has nvJPEG) decodes into a pool on that
    GPU where the transform resizes bilinearly (nvJPEG's resize), with the mixed decoder: the
    CPU workers decode what they keep up with, nvJPEG the chunks a trainer waits for (beside
    GPU-bound trainers nvJPEG alone decodes a few thousand images/s: bench/RESULTS.md);
    otherwise the pool is in host memory and decoding on the CPU (``gpu_refused`` says why,
    where a GPU was asked for). A Fallback is logged once.
    """
    try:
        order = _check_loader_args(loader_args)
        t = _transform(getattr(dataset, "transform", None))
        root = _check_dataset(dataset)
    except _Unsupported as e:
        # A warning where native decoding was likely expected (a torchvision folder dataset);
        # other datasets (tensors, text...) were never candidates: an info line.
        expected = any(k.__module__.startswith("torchvision.datasets")
                       for k in type(dataset).__mro__)
        log.log(logging.WARNING if expected else logging.INFO,
                "batchcast: the dataset runs in Python, not natively: %s", e)
        return Fallback(str(e))
    # nvJPEG's resize kernel is bilinear only: another interpolation decodes into a host pool,
    # and the plan says why (a share decoding on a GPU refuses it as a view: _fingerprint).
    asked_gpu = bool(device and str(device).startswith("cuda") and nvjpeg)
    gpu = asked_gpu and t.interpolation == "bilinear"
    uint8 = t.kind != "float"
    return NativePlan(
        root=root,
        transform=_batchcast.PipelineOptions(
            image_size=t.image_size,
            train=t.geometry == "crop",
            scale=t.scale,
            ratio=t.ratio,
            flip_p=t.flip_p,
            resize_size=t.resize_size if t.geometry == "resize+crop" else 0,
            interpolation=t.interpolation,
            output="uint8" if uint8 else "float32",
            uint8_layout="chw" if uint8 else "hwc",  # PILToTensor's (3, S, S)
            mean=t.mean,
            std=t.std,
            seed=seed if order.seed is None else order.seed,
        ),
        batch_size=int(loader_args.get("batch_size", 1)),
        shuffle=order.shuffle,
        drop_last=bool(loader_args.get("drop_last", False)),
        device=str(device) if gpu else "cpu",
        decoder="mixed" if gpu else "cpu",
        rank=order.rank,
        world_size=order.world_size,
        gpu_refused=(f"interpolation {t.mode}: decoding on a GPU (nvJPEG) resizes bilinearly"
                     if asked_gpu and not gpu else ""),
    )
