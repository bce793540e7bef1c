"""batchcast.DataLoader: torch's DataLoader, optionally shared between processes.

A subclass of ``torch.utils.data.DataLoader`` (isinstance works, every attribute is torch's).
Without ``share`` it iterates exactly as torch's. With ``share=KEY`` every process that uses
the same key (same user, same machine; per distributed rank) reads one stream, decoded once::

    loader = batchcast.DataLoader(dataset, batch_size=64, sampler=DistributedSampler(dataset),
                                  num_workers=4, share="cifar-train")
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for images, labels in loader:
            ...

With ``share``, torch's arguments mean:

- ``dataset``, ``shuffle``, ``sampler``, ``collate_fn``: the stream, run by the detached
  producer; a process whose stream differs under the same key gets a ValueError naming each
  field that differs and what would join (one key is one stream). Its transform may differ
  (another view of the stream, below), and so may its batch size.
- ``batch_size``, ``drop_last``: this trainer's own. The producer decodes chunks of the batch
  size of the trainer that started it; each trainer cuts them into its own batch size, so
  every epoch holds every sample once, ``len()`` and ``drop_last`` as torch's for that batch
  size (under a custom ``collate_fn``, whose batches cannot be cut, the key's batch size).
- ``num_workers``, ``worker_init_fn``, ``multiprocessing_context``, ``prefetch_factor``,
  ``persistent_workers``, ``in_order``: how the producer decodes (the first process's rule).
- ``generator``: its seed orders the shuffle (epoch e is drawn from seed + e): a stream field,
  since all trainers of a key read one order. Without it, the trainer that starts the producer
  draws the seed (from torch's default generator, as torch's RandomSampler does).
- ``augment_seed`` (share= only): this trainer's own augmentation draws (its random crops and
  flips), from this seed, the shuffle order staying the stream's: the trainer reads a view of
  the stream with that seed (docs/views.md, "Seeds"). None: the stream's draws, shared by every
  trainer of its transform. A trainer that starts the producer without a ``generator`` seeds
  the stream's shuffle with it too (then its view is the stream's own). Needs a native pipeline
  (below): a ValueError says why one is not.
- ``pin_memory`` (``pin_memory_device``): batches are handed out in pinned memory.
- ``timeout``: the longest wait for a batch, as torch's; 0 (default): as long as the producer
  is alive (a slow peer or an epoch boundary is no error; a dead producer is).
- ``stall_timeout`` (share= only): seconds this trainer may hold the shared stream back (a slow
  model, validation, a checkpoint, a debugger) before the others go on without it; it then reads
  what it missed as private chunks, nothing lost, and merges back when it catches up. None:
  the producer's default (3 s). A producer over an IterableDataset cannot regenerate: there the
  others wait for it, as torch's DataLoaders of one stream would.
- ``share_order`` (share= only): the order this trainer reads each epoch in, ``"exact"`` (the
  stream's, as the sampler says) or ``"relaxed"`` (every sample of its epoch exactly once, in an
  order the producer chooses so that one decode serves every trainer that still needs a sample,
  whatever their paces; docs/stream.md, "Order"). None: ``batchcast sweep --order``'s inside a
  sweep (``BATCHCAST_SHARE_ORDER``, relaxed by default), else the producer's default (exact).
- ``share_cache`` (share= only): ``"decoded"`` (or True) keeps each image decoded, its shorter
  side shrunk to 256 px for 224-px views, after its first decode, and makes every later epoch
  from it without reading or decoding the file; ``"off"`` (or False) decodes every epoch
  (docs/views.md, "Decoded cache"). Applied by the trainer that starts the producer, within half
  of the free memory; natively decoded pipelines only. None: ``batchcast sweep --cache``'s inside
  a sweep (``BATCHCAST_SHARE_CACHE``, decoded by default), else off.
- ``share_memory`` (share= only): the shared memory the stream's ring may take, all its views
  included, as bytes or a size text ("512MiB", "2G"); applied by the trainer that starts the
  producer (docs/memory.md). None: ``batchcast sweep --share-memory``'s inside a sweep, else
  1 GiB within the host's means, and never more than an epoch holds. A natively decoded pipeline only (a Python pipeline's ring is 8 slots).
- refused: ``batch_sampler`` and ``batch_size=None`` (the stream is chunks of one batch size).

Native decoding: a torchvision ``ImageFolder`` pipeline that ``batchcast._torchvision_plan``
recognises (RandomResizedCrop + flip, or Resize + CenterCrop, then ToTensor/Normalize or their
v2 forms; no custom sampler or collate_fn) is served by the native C++ pipeline instead of the
dataset's Python code: the same labels, class order, transform parameters, dtype and layout,
within the pipeline's documented tolerance, and its own seeded shuffle and augmentation draws.
With ``pin_memory=True`` on a machine with a GPU and a build with nvJPEG, it decodes into a pool
on that GPU (``pin_memory_device``, default the current device), ``num_workers`` CPU threads
first and nvJPEG the chunks a trainer waits for, and batches arrive as CUDA tensors there.
Anything else runs in Python, and one log line (logger ``batchcast.torchvision_plan``) names the
step that prevented the native path. ``native=False`` always runs the dataset's own code. Which
one runs is logged once at INFO (logger ``batchcast``) and is the loader's ``decoding`` (and
``native``, a bool). A native share's producer starts when the loader is made (unless the key's
is running), so that its first chunks are ready by the first iteration; one that no loader read
exits as soon as the loader that started it is closed or collected.

Progressive resizing: a transform assigned to the dataset between epochs (``dataset.transform
= T.Compose([T.RandomResizedCrop(160), ...])``) is read from the next iteration on, as another
view of the same stream (docs/views.md): each epoch whole in one transform, the others' streams
untouched, on a host pool or a GPU pool alike. Where the pipeline is not native, or the share
decodes on a GPU (nvJPEG resizes bilinearly only) and the new transform resizes otherwise, that
next iteration raises ValueError naming why (the producer would go on serving the old
transform), unless it is the first (a Python pipeline's producer takes the dataset as it is
then). A second trainer of the key with another transform joins its stream as a view alike.

Epochs: each iteration yields the epoch the sampler names (``sampler.set_epoch(e)`` of a
DistributedSampler), else the next one; a ``break`` and a new iteration start the next epoch
without draining the rest. Resume: ``state_dict()`` / ``load_state_dict()`` (torchdata's
StatefulDataLoader convention, keys ``epoch`` and ``sample``, load before iterating; in relaxed
``share_order`` also ``order`` and ``had``, the samples had in that epoch: see Loader).

Batches are zero-copy views of shared memory: clone before modifying in place (see Loader).
The share protocol is in ``_share.py``; the producer process in ``_share_producer.py``.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, Iterator, Optional, Union

import torch.utils.data

from ._fingerprint import (decoding_of, fingerprint, gpu_refusal, joins_as_view, plan_view,
                           view_fields)
from ._share import SharedStream, native_plan, pipeline_of, share_paths
from ._sizes import size_bytes
from ._sweep_progress import CACHE_ENV, ORDER_ENV, SHARE_MEMORY_ENV
from ._torchvision_plan import Fallback, NativePlan
from .loader import Closeable, order_name

__all__ = ["DataLoader", "share_paths"]


def cache_name(cache: Union[None, bool, str], given_as: str) -> str:
    """``share_cache``'s value as the server's ``--cache`` name; a ValueError naming the choices
    for anything else."""
    if cache is None or cache is False:
        return "off"
    if cache is True:
        return "decoded"
    if cache in ("off", "decoded"):
        return str(cache)
    raise ValueError(f"{given_as}: {cache!r} is not one of decoded, off (or True, False, None)")


class DataLoader(torch.utils.data.DataLoader, Closeable):
    """torch.utils.data.DataLoader with one more argument, ``share`` (see the module doc)."""

    def __init__(
        self,
        dataset: Any,
        batch_size: Optional[int] = 1,
        shuffle: Optional[bool] = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Optional[Callable] = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Callable] = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        share: Optional[str] = None,
        native: bool = True,
        stall_timeout: Optional[float] = None,
        augment_seed: Optional[int] = None,
        share_memory: Union[None, int, str] = None,
        share_order: Optional[str] = None,
        share_cache: Union[None, bool, str] = None,
        **kwargs: Any,
    ) -> None:
        self._stream: Optional[SharedStream] = None  # before torch's __init__: __del__ reads it
        self._decoding: Optional[str] = None
        super().__init__(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            **kwargs,
        )
        self.share = share
        if share is None:
            if augment_seed is not None:
                raise ValueError(
                    "augment_seed= gives a trainer of a share=KEY stream its own augmentation "
                    "draws; without share= torch's workers draw from generator= (their "
                    "base_seed) and worker_init_fn"
                )
            if share_memory is not None:
                raise ValueError("share_memory= sizes a share=KEY stream's shared ring; without "
                                 "share= there is none: drop it or pass share=")
            if share_order is not None:
                raise ValueError("share_order= is the order a share=KEY trainer reads its "
                                 "stream in; without share= torch's sampler orders the batches: "
                                 "drop it or pass share=")
            if share_cache is not None:
                raise ValueError("share_cache= keeps a share=KEY stream's decoded images; "
                                 "without share= there is no stream: drop it or pass share=")
            return
        given_as = "share_order"
        if share_order is None:  # a sweep's --order, for the trials' loaders that give none
            share_order, given_as = os.environ.get(ORDER_ENV) or None, ORDER_ENV
        order_name(share_order, given_as)  # a bad value: before anything starts
        if batch_size is None or batch_sampler is not None:
            raise ValueError(
                f"DataLoader(share={share!r}) streams chunks of one batch size: pass batch_size "
                "(an integer) and, for a custom order, sampler= instead of batch_sampler="
            )
        device = kwargs.get("pin_memory_device") or ""
        if device and not device.startswith("cuda"):
            raise ValueError(
                f"pin_memory_device={device!r}: DataLoader(share=) pins for CUDA only; leave "
                "it empty or name a cuda device"
            )
        if augment_seed is not None and not (
                isinstance(augment_seed, int) and 0 <= augment_seed < 1 << 64):
            raise ValueError(f"augment_seed={augment_seed!r}: an integer in 0..2**64-1, or None")
        pipeline, chosen_seed = pipeline_of(self, multiprocessing_context)
        if share_memory is None:  # a sweep's --share-memory, for the trials that start a stream
            share_memory = os.environ.get(SHARE_MEMORY_ENV) or None
        pipeline["memory"] = size_bytes(share_memory, "share_memory")
        given_as = "share_cache"
        if share_cache is None:  # a sweep's --cache, for the trials that start a stream
            share_cache, given_as = os.environ.get(CACHE_ENV) or None, CACHE_ENV
        pipeline["cache"] = cache_name(share_cache, given_as)
        if augment_seed is not None and chosen_seed is None:
            pipeline["seed"] = augment_seed  # a stream it starts: its view is the stream's own
        user_args = dict(batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                         batch_sampler=batch_sampler, collate_fn=collate_fn, drop_last=drop_last)
        self._plan_args = (user_args, pipeline["seed"], pin_memory, device)
        found = native_plan(self, *self._plan_args) if native else Fallback("native=False")
        pipeline["native"] = found if isinstance(found, NativePlan) else None
        python_why = "" if pipeline["native"] is not None else found.reason
        if augment_seed is not None and python_why:
            raise ValueError(
                f"DataLoader(share={share!r}, augment_seed={augment_seed}): a seed of its own "
                "is a view of a stream decoded natively, and this pipeline runs in Python "
                f"({python_why}); there the dataset's own code draws in the producer's workers, "
                "one stream for every trainer: drop augment_seed, or use a pipeline that "
                "batchcast recognises (batchcast.torchvision_plan logs the step that is not)"
            )
        if python_why and pipeline["cache"] != "off":
            logging.getLogger("batchcast").warning(
                "DataLoader(share=%r): %s=%r keeps natively decoded images only; this pipeline "
                "runs in Python (%s): every epoch decodes", share, given_as, share_cache,
                python_why)
        self._augment_seed = augment_seed
        prints = fingerprint(self, chosen_seed)
        self._view_fields = view_fields(dataset)
        prints["decoding"] = decoding_of(pipeline["native"])
        self._stream = SharedStream(
            share, pipeline, prints,
            {"timeout": timeout, "pin_memory": pin_memory, "stall_timeout": stall_timeout,
             "order": share_order},
            augment_seed, python_why,
        )
        self._decoding = prints["decoding"]
        logging.getLogger("batchcast").info(
            "DataLoader(share=%r): samples decoded by the %s", share,
            self._decoding if self.native else "dataset's own Python code (torch workers)")
        if pipeline["native"] is not None:
            self._stream.start()  # its start-up overlaps the trainer's own (model, optimiser)

    # -- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if self._stream is None:
            return super().__iter__()
        self._follow_transform()
        epoch = getattr(self.sampler, "epoch", None)
        return self._stream.iterate(epoch if isinstance(epoch, int) else None)

    def _follow_transform(self) -> None:
        """Progressive resizing: a dataset whose transform changed since the last iteration is
        read in the new one from this epoch on, as another view of the same stream."""
        now = view_fields(self.dataset)
        if now == self._view_fields:
            return
        assert self._stream is not None
        if not self.native and not self._stream.attached:
            # Its producer is not started yet: it will pickle the dataset as it is now.
            self._stream.restate(now)
            self._view_fields = now
            return
        found = native_plan(self, *self._plan_args) if self.native else None
        plan = found if isinstance(found, NativePlan) else None
        assert self._decoding is not None
        refusal = gpu_refusal(plan, self._decoding)
        if refusal is not None:
            raise ValueError(
                f"DataLoader(share={self.share!r}): the dataset's new transform cannot be made "
                f"by the share's pool ({self._decoding}): {refusal}"
            )
        if not joins_as_view(plan, self._decoding):
            changed = [name for name, value in now.items() if self._view_fields[name] != value]
            raise ValueError(
                f"DataLoader(share={self.share!r}): the dataset's {' and '.join(changed)} "
                "changed after the share's producer took it, and it would go on serving the "
                "old one. A share follows a new transform (progressive resizing) only when the "
                "old and the new are recognised torchvision pipelines decoded natively "
                "(batchcast._torchvision_plan logs why one is not); otherwise make a new "
                "DataLoader with another share key for the new transform"
            )
        assert plan is not None
        self._stream.follow(plan_view(plan, self._augment_seed))
        self._view_fields = now

    # -- share -------------------------------------------------------------------------------

    @property
    def paths(self) -> Dict[str, str]:
        """The share's files (endpoint, socket, lock, state, log) of this process's rank."""
        return self._shared().paths

    @property
    def endpoint(self) -> str:
        return self._shared().paths["endpoint"]

    @property
    def decoding(self) -> Optional[str]:
        """How the share's samples are made: ``"native <decoder> decoder, pool on <device>"``
        (the C++ pipeline) or ``"python"`` (the dataset's own code in a detached producer);
        None without ``share``. Logged once at INFO (logger ``batchcast``) when the loader is
        made; ``batchcast.torchvision_plan`` logs why a pipeline is not native."""
        return self._decoding

    @property
    def native(self) -> bool:
        """True when the share's samples are decoded by the native pipeline (see decoding)."""
        return bool(self._decoding and self._decoding.startswith("native"))

    @property
    def stats(self) -> Any:
        """The shared stream's Loader counters (None before the first iteration)."""
        return self._shared().stats

    def state_dict(self) -> Dict[str, Any]:
        """``{"epoch", "sample"}``: where this trainer's next iteration resumes (mid-epoch
        too); ``epoch`` None before the first batch. In relaxed order also ``"order"`` and
        ``"had"`` (Loader.state_dict)."""
        return self._shared().state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes at a :meth:`state_dict` position at the next iteration (which then yields
        the rest of that epoch), however far the other trainers of the key are."""
        self._shared().load_state_dict(state)

    def close(self) -> None:
        """Leaves the shared stream; its producer exits once no process reads it."""
        stream = getattr(self, "_stream", None)
        if stream is not None:
            stream.close()

    def _shared(self) -> SharedStream:
        if self._stream is None:
            raise TypeError(
                "this batchcast.DataLoader has no share= key: it is torch's DataLoader; "
                "state_dict/paths/stats belong to DataLoader(..., share=KEY)"
            )
        return self._stream
