"""What makes the pipelines of two ``DataLoader(share=KEY)`` trainers one stream, and which of
their differences are views of it (docs/views.md).

A fingerprint is a dict of stable texts (no memory addresses: they differ between processes):
the stream fields (dataset type, root and length, the sampler, batch size, drop_last,
collate_fn, how samples are decoded), which must match for one key, and VIEW_FIELDS (the
dataset's transforms), which may differ where both pipelines run natively, the same way, into a
pool that makes both (a GPU pool resizes bilinearly only).
Pure functions; no state.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Optional

import torch.utils.data

from . import _batchcast, _torchvision_plan

__all__ = ["VIEW_FIELDS", "decoding_of", "fingerprint", "gpu_refusal", "joins_as_view",
           "view_fields", "view_of"]

# The fingerprint's fields that are a view of the stream, not the stream.
VIEW_FIELDS = ("transform", "transforms")


def _plain(value: Any) -> Any:
    """A stable text of a value: no memory addresses (they differ between processes)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def _qualified(obj: Any) -> Optional[str]:
    if obj is None:
        return None
    kind = obj if hasattr(obj, "__qualname__") else type(obj)  # functions name themselves
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', kind)}"


def view_fields(dataset: Any) -> Dict[str, Any]:
    """The fingerprint's VIEW_FIELDS of a dataset: what it makes of each sample."""
    return {name: _plain(getattr(dataset, name, None)) for name in VIEW_FIELDS}


def fingerprint(loader: torch.utils.data.DataLoader, seed: Optional[int]) -> Dict[str, Any]:
    """What makes two pipelines one stream: dataset type, root, length, the sampler (type,
    shuffle, seed, replicas, rank), batch size, drop_last, collate_fn; and what they make of each
    sample (VIEW_FIELDS: the transforms)."""
    dataset, sampler = loader.dataset, loader.sampler
    try:
        length: Optional[int] = len(dataset)  # type: ignore[arg-type]
    except TypeError:  # an IterableDataset, or a ChainDataset of them (its __len__ raises)
        length = None
    described = {
        name: _plain(getattr(sampler, name))
        for name in ("shuffle", "seed", "num_replicas", "rank", "drop_last", "replacement")
        if hasattr(sampler, name)
    }
    if seed is not None:
        described["seed"] = seed
    return {
        "dataset": _qualified(dataset),
        "root": _plain(getattr(dataset, "root", None)),
        "len": length,
        "target_transform": _plain(getattr(dataset, "target_transform", None)),
        **view_fields(dataset),
        "sampler": f"{_qualified(sampler)}{sorted(described.items())}",
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "collate_fn": _qualified(loader.collate_fn),
    }


def decoding_of(plan: Optional[_torchvision_plan.NativePlan]) -> str:
    """How a share's samples are made, as the fingerprint states it: one stream, one way."""
    return "python" if plan is None else f"native {plan.decoder} decoder, pool on {plan.device}"


# How a host pool's stream decodes: its views take any recognised transform.
_HOST = "native cpu decoder, pool on cpu"


def joins_as_view(plan: Optional[_torchvision_plan.NativePlan], decoding: str) -> bool:
    """Whether a pipeline whose transform differs from that of a stream made as ``decoding``
    says (decoding_of) can read the stream as a view: its transform is recognised (``plan``)
    and the stream's pool makes it. A host pool makes any recognised transform; a GPU pool one
    that this trainer's plan decodes on that GPU too (nvJPEG: a bilinear resize)."""
    return plan is not None and decoding in (decoding_of(plan), _HOST)


def gpu_refusal(plan: Optional[_torchvision_plan.NativePlan], decoding: str) -> Optional[str]:
    """Why a stream made on a GPU as ``decoding`` says cannot make the transform of ``plan`` (a
    trainer that asked for a GPU pool too: pin_memory) as a view, naming the field and the fix;
    None where that is not why."""
    if plan is None or not plan.gpu_refused or " pool on cuda" not in decoding:
        return None
    return (f"{plan.gpu_refused}; use InterpolationMode.BILINEAR in this transform, or "
            "pin_memory=False in every trainer of this key (a host pool, whose views resize "
            "either way)")


def view_of(key: str, mine: Dict[str, Any], running: Dict[str, Any],
            plan: Optional[_torchvision_plan.NativePlan]) -> str:
    """The view a trainer of fingerprint ``mine`` (native plan ``plan``) reads from the stream
    of fingerprint ``running``: "" for the stream's own pipeline, the plan's view text when only
    the transform differs and the pipeline joins as a view; else ValueError naming the fields."""
    differ = [name for name, value in mine.items() if running.get(name) != value]
    if not differ:
        return ""
    decoding = str(running.get("decoding"))
    transform_only = bool(set(differ) & set(VIEW_FIELDS)) and set(differ) <= {*VIEW_FIELDS,
                                                                               "decoding"}
    refusal = gpu_refusal(plan, decoding) if transform_only else None
    if refusal is not None:
        raise ValueError(
            f"DataLoader(share={key!r}): the stream of that key ({decoding}) cannot make this "
            f"process's transform as a view: {refusal}"
        )
    if set(differ) <= set(VIEW_FIELDS) and joins_as_view(plan, decoding):
        # Another view of one stream: the server decodes each sample once for both and
        # derives this view's seed from the stream's (the same transform: the same bytes).
        assert plan is not None
        return _batchcast.View(plan.transform).text(with_seed=False)
    lines = "; ".join(
        f"{name}: running {running.get(name)!r}, this process {mine[name]!r}" for name in differ
    )
    if transform_only:
        why = ("a transform joins a stream as another view only when both trainers' pipelines "
               "are recognised torchvision ImageFolder pipelines (batchcast.torchvision_plan "
               "logs why one is not) decoded natively the same way (DataLoader(native=True), "
               "the same pin_memory)")
    else:
        why = ("one key is one stream: use another share key for this one (or the same "
               "dataset, sampler, batch_size, drop_last, collate_fn and pin_memory; a "
               "transform that differs joins as another view)")
    raise ValueError(
        f"DataLoader(share={key!r}): the stream of that key serves another pipeline; {lines}. "
        f"{why}"
    )
