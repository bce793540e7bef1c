"""The Python pipeline of a share: what the share producer runs when the trainer's pipeline has
no native plan (``_share_producer.make_producer``).

:func:`make_stream` turns the trainer's pickled pipeline (``_share.pipeline_of``) into a
re-iterable whose pass e is stream epoch e, in chunks of the pipeline's batch size, every
sample (each trainer's Loader cuts its own batch size and drops its own short last batch): the
pipeline's sampler after ``sampler.set_epoch(e)`` (a DistributedSampler), or a RandomSampler
drawn from ``seed + e``. Any
epoch's order can be rebuilt, so a map-style dataset also gives ``regenerate(epoch, index)``,
which decodes chunk ``index`` of epoch ``epoch`` again (in this process, not in the workers) for
Loaders that join late or resume. An IterableDataset cannot: its late joiners wait for the next
epoch. Kept apart from the producer's process logic so that a native share never imports torch.

Thread-safety: a stream and its regenerate are used by the producer's threads as
:class:`batchcast.Producer` documents (regenerate has its own copy of the sampler).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import torch
import torch.utils.data

__all__ = ["make_stream", "order_epoch"]


def order_epoch(sampler: Any, epoch: int, seed: Optional[int]) -> None:
    """Makes ``sampler`` yield the order of stream epoch ``epoch``."""
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    elif isinstance(sampler, torch.utils.data.RandomSampler) and seed is not None:
        sampler.generator = torch.Generator().manual_seed((seed + epoch) % (1 << 63))


class _EpochLoader(torch.utils.data.DataLoader):
    """A torch DataLoader whose pass e yields stream epoch e (order_epoch before each pass)."""

    def __init__(self, *args: Any, seed: Optional[int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seed = seed
        self.next_epoch = 0

    def __iter__(self) -> Any:
        order_epoch(self.sampler, self.next_epoch, self.seed)
        self.next_epoch += 1
        return super().__iter__()


def make_stream(pipeline: Dict[str, Any]) -> Tuple[Iterable[Any], Optional[Callable]]:
    """What produces a share's stream in Python: (a re-iterable, one pass per epoch;
    ``regenerate(epoch, index) -> batch``, or None where the order cannot be rebuilt)."""
    dataset, sampler, seed = pipeline["dataset"], pipeline["sampler"], pipeline["seed"]
    batch_size = pipeline["batch_size"]
    collate = pipeline["collate_fn"] or torch.utils.data.default_collate
    stream = _EpochLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=False,  # each Loader drops its own short last batch, of its own batch size
        collate_fn=collate,
        seed=seed,
        **pipeline["decoding"],
    )
    if sampler is None:  # an IterableDataset
        return stream, None
    ordering = copy.copy(sampler)  # regenerate's own: the stream's sampler is in use
    orders: Dict[int, list] = {}

    def regenerate(epoch: int, index: int) -> Any:
        order = orders.get(epoch)
        if order is None:
            order_epoch(ordering, epoch, seed)
            orders.clear()  # one epoch at a time: late joiners and resumes cluster
            order = orders[epoch] = list(ordering)
        chunk = order[index * batch_size : (index + 1) * batch_size]
        if not chunk:
            raise IndexError(f"epoch {epoch} has no chunk {index} ({len(order)} samples)")
        return collate([dataset[i] for i in chunk])

    return stream, regenerate
