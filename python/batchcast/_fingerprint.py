"""What makes the pipelines of two ``DataLoader(share=KEY)`` trainers one stream, which of
their differences each trainer keeps for itself (docs/views.md), and the refusal that names
what really differs and what would join.

A fingerprint is a dict of stable JSON values (no memory addresses: they differ between
processes), written by the trainer that starts the key's producer and compared by every other:

- the stream fields (STREAM_FIELDS): the dataset's type, root (as a resolved path: ``data`` and
  ``/tmp/x/data``, or a symlink to it, are one folder), length and target_transform, the sampler
  (its type and each of its fields, the shuffle seed among them), the collate_fn, and how
  samples are decoded. They must match: one key is one stream;
- the view field ``transform`` (the transform's steps, Composes flattened): it may differ where
  both pipelines run natively into a pool that makes both, and the trainer then reads its own
  view of the stream (its own augmentation seed too: ``augment_seed``);
- ``batch_size``, the stream's chunk size: each trainer cuts the chunks into its own batch size
  (and applies its own drop_last), except under a custom collate_fn, whose batches cannot be cut.

Pure functions; no state.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Any, Dict, List, Optional, Tuple

import torch.utils.data

from . import _batchcast, _torchvision_plan

__all__ = ["decoding_of", "fingerprint", "gpu_refusal", "joins_as_view", "plan_view",
           "view_fields", "view_of"]

_SAMPLER_FIELDS = ("shuffle", "seed", "num_replicas", "rank", "drop_last", "replacement")
STREAM_FIELDS = ("dataset", "root", "len", "target_transform", "sampler",
                 *(f"sampler.{name}" for name in _SAMPLER_FIELDS), "collate_fn")
# How a refusal names a field, where its key would not say it to a user.
_LABELS = {"len": "dataset length", "sampler.seed": "shuffle seed"}


def _plain(value: Any) -> Any:
    """A stable text of a value: no memory addresses (they differ between processes)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value)).replace("\n", " ")


def _qualified(obj: Any) -> Optional[str]:
    if obj is None:
        return None
    kind = obj if hasattr(obj, "__qualname__") else type(obj)  # functions name themselves
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', kind)}"


_DEFAULT_COLLATE = _qualified(torch.utils.data.default_collate)


def _root(dataset: Any) -> Any:
    """The dataset's root as the folder it is: resolved (cwd, ``~``, symlinks)."""
    root = getattr(dataset, "root", None)
    if isinstance(root, (str, os.PathLike)):
        return os.path.realpath(os.path.expanduser(os.fspath(root)))
    return _plain(root)


def view_fields(dataset: Any) -> Dict[str, Any]:
    """The fingerprint's view field of a dataset: what it makes of each sample, its
    ``transform`` (a VisionDataset's ``transforms`` only where it has no ``transform``: the
    one wraps the other) as the list of its steps."""
    transform = getattr(dataset, "transform", None)
    if transform is None:
        transform = getattr(dataset, "transforms", None)
    steps = None if transform is None else [_plain(s) for s in _torchvision_plan.steps(transform)]
    return {"transform": steps}


def fingerprint(loader: torch.utils.data.DataLoader, seed: Optional[int]) -> Dict[str, Any]:
    """The fingerprint of ``loader``'s pipeline (the module doc); ``seed``: the shuffle seed
    the user chose (a generator), else None."""
    dataset, sampler = loader.dataset, loader.sampler
    try:
        length: Optional[int] = len(dataset)  # type: ignore[arg-type]
    except TypeError:  # an IterableDataset, or a ChainDataset of them (its __len__ raises)
        length = None
    samplers = {f"sampler.{name}": _plain(getattr(sampler, name))
                for name in _SAMPLER_FIELDS if hasattr(sampler, name)}
    if seed is not None:
        samplers["sampler.seed"] = seed
    return {
        "dataset": _qualified(dataset),
        "root": _root(dataset),
        "len": length,
        "target_transform": _plain(getattr(dataset, "target_transform", None)),
        **view_fields(dataset),
        "sampler": _qualified(sampler),
        **samplers,
        "batch_size": loader.batch_size,
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
            "pin_memory=False in every trainer of this key")


def plan_view(plan: _torchvision_plan.NativePlan, augment_seed: Optional[int]) -> str:
    """The view text that reads ``plan``'s transform from a stream: its draws derived from the
    stream's seed, or from ``augment_seed`` where given (docs/views.md, "Seeds")."""
    text = _batchcast.View(plan.transform).text(with_seed=False)
    return text if augment_seed is None else f"{text},seed={augment_seed}"


def view_of(key: str, mine: Dict[str, Any], running: Dict[str, Any],
            plan: Optional[_torchvision_plan.NativePlan], python_why: str = "",
            augment_seed: Optional[int] = None) -> str:
    """The view a trainer of fingerprint ``mine`` (native plan ``plan``, or None and
    ``python_why`` saying why not) reads from the stream of fingerprint ``running``: "" for the
    stream's own, a view text for another transform or ``augment_seed``. Where it cannot join,
    a ValueError names each field that differs, once, and what would join."""
    conflicts = _stream_conflicts(mine, running)
    decoding = str(running.get("decoding"))
    wants_view = mine.get("transform") != running.get("transform") or augment_seed is not None
    if wants_view:
        conflict = _view_conflict(mine, running, plan, python_why, augment_seed)
    elif mine.get("decoding") != decoding and not joins_as_view(plan, decoding):
        conflict = _decoding_conflict(mine, running)
    else:
        conflict = None
    if conflict is not None:
        conflicts.append(conflict)
    if conflicts:
        raise ValueError(
            f"DataLoader(share={key!r}) cannot join the stream of that key. "
            + " ".join(f"{what}; to join: {fix}." for what, fix in conflicts)
            + " Otherwise use another share key for this pipeline (one key is one stream)"
        )
    if not wants_view:
        return ""
    assert plan is not None
    # Another view of one stream: the server decodes each sample once for all views and derives
    # this view's draws from the stream's seed, or from augment_seed.
    return plan_view(plan, augment_seed)


def _label(name: str) -> str:
    return _LABELS.get(name, name.replace(".", " "))


def _short(value: Any) -> Any:
    """A qualified class name as its class name (a sampler's), any other value as it is."""
    return value.rsplit(".", 1)[1] if isinstance(value, str) and value.startswith("torch.") \
        else value


def _differs(name: str, running: Any, mine: Any) -> str:
    return f"{_label(name)}: running {_short(running)!r}, this process {_short(mine)!r}"


def _stream_conflicts(mine: Dict[str, Any], running: Dict[str, Any]) -> List[Tuple[str, str]]:
    """(what differs, what would join) for each stream field (a sampler of another type only
    as that, not its fields too), and batch_size where a custom collate_fn makes the chunks
    uncuttable."""
    out = []
    for name in STREAM_FIELDS:
        theirs, ours = running.get(name), mine.get(name)
        if theirs == ours or (name.startswith("sampler.") and
                              running.get("sampler") != mine.get("sampler")):
            continue
        out.append((_differs(name, theirs, ours), _fix(name, theirs)))
    custom = running.get("collate_fn") != _DEFAULT_COLLATE
    if custom and mine.get("batch_size") != running.get("batch_size") and not any(
            what.startswith("collate_fn") for what, _ in out):
        out.append((_differs("batch_size", running.get("batch_size"), mine.get("batch_size")),
                    f"batch_size={running.get('batch_size')}, the stream's (the batches of a "
                    "custom collate_fn cannot be cut into another size)"))
    return out


def _fix(name: str, running: Any) -> str:
    """What makes a stream field this process's join the stream's value ``running``."""
    if name == "sampler.seed":
        seeded = "" if running is None else f", or one seeded {running}"
        return (f"pass no generator{seeded} (the shuffle order is the stream's, one per key); "
                "augment_seed=N gives this trainer its own augmentation draws")
    if name == "sampler" and _short(running) in ("RandomSampler", "SequentialSampler"):
        return f"shuffle={_short(running) == 'RandomSampler'}, as the stream's"
    if name == "root":
        return "the same folder"
    return f"the stream's {_label(name)} ({_short(running)!r})"


def _decoding_conflict(mine: Dict[str, Any], running: Dict[str, Any]) -> Tuple[str, str]:
    """The same transform, decoded another way than the stream's (native=, pin_memory=)."""
    theirs, ours = str(running.get("decoding")), str(mine.get("decoding"))
    if theirs == "python":
        fix = "native=False, as the stream's first trainer (it decodes in Python)"
    elif ours == "python":
        fix = "native=True, the default (the stream decodes natively)"
    elif " pool on cuda" in theirs:
        fix = (f"pin_memory=True, pin_memory_device={theirs.rsplit(' ', 1)[1]!r}: the same "
               "pin_memory as the key's other trainers, which decides where the pool is")
    else:
        fix = "pin_memory=False: the same pin_memory as the key's other trainers"
    return _differs("decoding", theirs, ours), fix


def _view_conflict(mine: Dict[str, Any], running: Dict[str, Any],
                   plan: Optional[_torchvision_plan.NativePlan], python_why: str,
                   augment_seed: Optional[int]) -> Optional[Tuple[str, str]]:
    """Why this trainer cannot read its transform (or augment_seed) as a view of the stream,
    or None when it can."""
    decoding = str(running.get("decoding"))
    if decoding == "python":
        fix = ("the stream's own (it runs its dataset's Python code, which makes one view; "
               "views need a stream decoded natively, its first trainer's transform one that "
               "batchcast recognises)")
        if mine.get("transform") == running.get("transform"):
            return (f"augment_seed={augment_seed}: the stream of that key has no views",
                    "no augment_seed: the draws are " + fix)
        steps = _step_changes(running.get("transform") or [], mine.get("transform") or [])
        return f"transform: {steps}", "the transform is " + fix
    if plan is None:
        return (f"transform: this process's does not run natively ({python_why})",
                "without that step it reads the stream as a view")
    refusal = gpu_refusal(plan, decoding)
    if refusal is not None:
        why, fix = refusal.split("; ", 1)
        return f"transform: its pool ({decoding}) cannot make this one as a view: {why}", fix
    if not joins_as_view(plan, decoding):
        return _decoding_conflict(mine, running)
    return None


def _step_changes(running: List[str], mine: List[str]) -> str:
    """The transform steps that differ, each once."""
    out = []
    matcher = difflib.SequenceMatcher(a=running, b=mine, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        theirs, ours = ", ".join(running[i1:i2]), ", ".join(mine[j1:j2])
        if op == "replace":
            out.append(f"step {j1}: running {theirs}, this process {ours}")
        elif op == "delete":
            out.append(f"this process has no {theirs}")
        elif op == "insert":
            out.append(f"this process adds {ours} at step {j1}")
    return "; ".join(out) or "the same steps"
