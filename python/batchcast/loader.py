"""batchcast.Loader: the consumer side of the Python package.

A Loader connects to a batchcast server (``batchcast serve``, a :class:`batchcast.Producer`, or
the detached producer of ``DataLoader(share=...)``) and yields that server's stream as batches
of its own batch size. Iterating yields one epoch and stops at its end, so::

    loader = batchcast.Loader("ipc:///tmp/bc.sock", batch_size=32)
    for epoch in range(epochs):
        for images, labels in loader:
            ...

works like torch's DataLoader. Iterating after the server's last epoch ends at once. Leaving
an epoch early (``break``) and iterating again starts the next epoch; nothing is drained.

Resume follows torchdata's StatefulDataLoader: ``state_dict()`` (callable mid-epoch) returns
``{"epoch": E, "sample": S}``, the position of the next sample this Loader would yield (S
samples of epoch E were yielded; after an epoch's end that is ``(E + 1, 0)``; ``{"epoch":
None, "sample": 0}`` before the first batch: wherever the stream is). ``load_state_dict()``
on a new Loader, before iterating, makes its next iteration start there (``seek``); a server
that cannot serve that position raises :class:`batchcast.PositionUnavailableError`. In relaxed
order the state also keeps the samples yielded in epoch E (``"order": "relaxed"``, ``"had"``:
``_resume_state``), and a Loader resumed from it reads the rest of that epoch's shard once, then
the next epochs whole.

Batches are zero-copy views of the server's shared memory handed over through DLPack: the
server's slot is released when the last tensor of the batch is freed. Host views are
copy-on-write: an in-place write (``x.mul_(2)``) changes only this process's copy of the pages
written, never the other consumers' data (docs/memory.md). Exception: a pool page-locked for
``pin_memory`` on a GPU machine is read-only, and a write there kills the process (SIGSEGV)
after a message naming the fix. CUDA views cannot be protected (CUDA IPC maps device memory
read-write): an in-place write changes the batch every other consumer sees, so ``.clone()``
before modifying them in place.
A Loader that holds more than ``max_held`` zero-copy batches gets private copies from then on,
so keeping batches in a list never stalls the server. Batches of chunks the server regenerates
for this Loader alone (catching up after a mid-epoch join or a ``load_state_dict``) are private
copies too: each such chunk is copied as it arrives and its slot given back at once, and so
are a relaxed Loader's (``order="relaxed"``): the rows it takes of each chunk are copied out as
they arrive.

Structure: tensors named ``"#0", "#1", ...`` become a tuple (the native server sends
``(images, labels)``), a single ``"#"`` a bare tensor, any other names a dict.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from . import _batchcast, _tensor_names
from ._device_copy import DeviceCopy, cuda_index
from ._resume_state import ORDERS, HadSet, Position
from ._views import ViewLike, view_text

__all__ = ["Loader", "LoaderStats"]

_FRAMEWORKS = ("torch", "numpy", "dlpack")
_CONSUMER_DEFAULTS = _batchcast.ConsumerOptions()  # the defaults of Loader's arguments


@dataclasses.dataclass(frozen=True)
class LoaderStats:
    """Counters of one Loader since it connected."""

    batches: int  # batches yielded
    samples: int  # samples yielded
    skipped: int  # samples missed (late join into a partial epoch, or left behind by "skip")
    copies: int  # private copies (spanning chunks, beyond max_held, or of private chunks)
    wait_s: float  # seconds spent waiting for data
    dropped_messages: int  # malformed messages from the server, dropped


def order_name(order: Optional[str], argument: str) -> str:
    """ConsumerOptions.order for a Loader's ``order`` (a DataLoader's ``share_order``): None is
    the server's default; anything but exact or relaxed a ValueError naming ``argument``."""
    if order is None:
        return "server"
    if order not in ORDERS:
        raise ValueError(f"{argument}: {order!r} is not one of {', '.join(ORDERS)}")
    return order


def _structure(names: Sequence[str]) -> Tuple[str, Optional[List[int]]]:
    """How a batch with these tensor names is returned: ("bare", None), ("tuple", order of
    the "#i" names by i) or ("dict", None)."""
    if len(names) == 1 and names[0] == _tensor_names.BARE:
        return "bare", None
    found = [_tensor_names.tuple_position(n) for n in names]
    if names and all(p is not None for p in found):
        positions = [p for p in found if p is not None]
        if sorted(positions) == list(range(len(names))):
            return "tuple", sorted(range(len(names)), key=positions.__getitem__)
    return "dict", None


class Closeable:
    """Context-manager and finaliser plumbing for objects with a ``close()`` that tells the
    server they want no more data."""

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nobody to tell
            pass


class Loader(Closeable):
    """An iterable over a batchcast server's batches, one epoch per iteration.

    Args:
        endpoint: the server's endpoint (``ipc://PATH`` or ``tcp://HOST:PORT``); None: the
            default ``ipc:///tmp/batchcast-<uid>.sock``.
        batch_size: samples per batch; None: the server's batch size.
        device: move every tensor there (``"cuda:0"``); None: leave them in shared memory.
        pin_memory: with a CUDA ``device``, copy host batches there from page-locked memory
            asynchronously (``non_blocking``, on the current stream), so the host never waits
            for them and prepares the next step meanwhile; without a device,
            return pinned host copies (torch's DataLoader semantics). Ignored, with one log
            line, where no CUDA device is usable.
        drop_last: drop each epoch's short last batch, as torch's DataLoader does.
        timeout: seconds to wait for the server's welcome and for each batch
            (:class:`batchcast.TimeoutError` after that, naming what it waited for); <= 0
            (default): as long as the server is alive. A slow peer or an epoch boundary is no
            error; a dead server is detected by heartbeats (:class:`batchcast.ServerGoneError`).
            Nothing waits in silence: after 3 s of waiting (and every 10 s) the Loader logs at
            WARNING (logger ``batchcast``) what for: no server at the endpoint, min_consumers
            not met (n of m), a named consumer holding the stream back, or the producer.
        stall_timeout: seconds this Loader may hold the stream back (a slow step, validation,
            a debugger) before the server frees the others from it: under the server's
            default stall policy ``decouple`` it then reads what it missed as private
            chunks (nothing lost) and merges back when it catches up. None: the server's
            ``--stall-timeout`` (3 s by default).
        max_held: zero-copy batches alive at once before further ones are private copies
            (lowered to the server's ring size minus one when the ring is smaller, so that
            held batches can never pin every slot).
        prefetch: chunk descriptors asked for ahead (hides the round trip).
        late_join: joining mid-epoch, ``"replay"`` the retained chunks (the first epoch may be
            partial; ``stats.skipped`` says how much) or wait for the ``"next_epoch"``.
        name: shown in the server's log and metrics.
        framework: ``"torch"`` tensors (default), ``"numpy"`` arrays (numpy.from_dlpack), or
            ``"dlpack"`` objects with ``__dlpack__`` for any other framework.
        view: what this Loader makes of each decoded sample (docs/views.md): a view text such
            as ``"size=160,crop=center"`` or a dict ``{"size": 160, "scale": (0.35, 1)}`` over
            the server's transform (fields size, crop random|center, scale, ratio, flip, resize,
            interpolation, output, layout, mean, std, seed). Loaders of one view share its
            slots (identical bytes); a view the server does not serve yet is added, and its
            first epoch regenerated for this Loader. None: the server's own. A view the
            pipeline cannot make raises batchcast.BatchcastError naming the field.
        order: the order each epoch is read in (docs/stream.md, "Order"): ``"exact"``, the
            stream's seeded order (``sampler.set_epoch`` semantics, equal batch sizes seeing
            identical bytes), or ``"relaxed"``: every sample of the epoch (of this rank's shard)
            exactly once, in an order the server chooses from what every relaxed Loader still
            needs, so that one decode serves all of them however their paces differ (batches
            are private copies). None: the server's ``--order`` (exact by default). Anything
            else raises ValueError.
        rank: with a server of every rank (``serve --every-rank``, one node-wide server for
            DDP jobs), read this rank's shard (its stream at ``rank_endpoint(endpoint, rank)``).
    """

    def __init__(
        self,
        endpoint: Optional[str] = None,
        batch_size: Optional[int] = None,
        device: Any = None,
        drop_last: bool = False,
        timeout: float = 0.0,
        max_held: int = _CONSUMER_DEFAULTS.max_held,
        prefetch: int = _CONSUMER_DEFAULTS.prefetch,
        late_join: str = _CONSUMER_DEFAULTS.late_join,
        name: Optional[str] = None,
        framework: str = "torch",
        pin_memory: bool = False,
        rank: Optional[int] = None,
        stall_timeout: Optional[float] = None,
        view: ViewLike = None,
        order: Optional[str] = None,
    ) -> None:
        if rank is not None:  # a server of every rank (serve --every-rank): this rank's stream
            endpoint = _batchcast.rank_endpoint(endpoint or _batchcast.default_endpoint(), rank)
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: use an integer >= 1 (or None)")
        if framework not in _FRAMEWORKS:
            raise ValueError(f"framework={framework!r}: use one of {', '.join(_FRAMEWORKS)}")
        if stall_timeout is not None and not stall_timeout > 0:
            raise ValueError(f"stall_timeout={stall_timeout}: use seconds > 0 (or None)")
        if (device is not None or pin_memory) and framework != "torch":
            raise ValueError("device= and pin_memory= need framework='torch'")
        self._consumer: Optional[Any] = None
        to_device = DeviceCopy(device, pin_memory) if framework == "torch" else None
        self._convert = self._converter(framework, to_device)
        try:
            self._options = _batchcast.ConsumerOptions(
                endpoint=endpoint or "",
                batch_size=batch_size or 0,
                drop_last=drop_last,
                timeout=float(timeout) if timeout is not None else 0.0,
                prefetch=prefetch,
                max_held=max_held,
                late_join=late_join,
                name=name or f"loader-{os.getpid()}",
                cuda_device=cuda_index(device),
                pin_memory=bool(to_device and to_device.pin_copies),
                stall_timeout=float(stall_timeout or 0.0),
                view=view_text(view),
                order=order_name(order, "order"),
            )
        except _batchcast.BatchcastError as e:  # a value out of its set (late_join): the user's
            raise ValueError(str(e)) from None
        self._next_view: Optional[str] = None  # set_view's, taken at the next epoch start
        self._consumer = _batchcast.Consumer(self._options)
        self.endpoint = endpoint or _batchcast.default_endpoint()
        self.device = device
        self.drop_last = drop_last
        self._in_epoch = False  # a batch of the current epoch was yielded, its end not yet seen
        self._first_epoch: Optional[int] = None  # of the first batch this Loader yielded
        self._position = Position(self._consumer.order == "relaxed")  # state_dict's
        self._layouts: Dict[Tuple[Tuple[str, ...], Tuple[str, ...]], Callable[[list], Any]] = {}

    # -- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        consumer = self._open()
        if self._next_view is not None:
            consumer = self._switch_view(consumer)
        if self._in_epoch:
            # The previous iteration stopped early (break): like a new pass over torch's
            # DataLoader, this one starts at the next epoch; the server skips the rest.
            self.seek(int(consumer.epoch) + 1)
        return self._epoch(consumer)

    def set_view(self, view: ViewLike) -> None:
        """Reads ``view`` (as the constructor's ``view``) from the next epoch on: progressive
        resizing. The next iteration attaches again with the new view at the start of the epoch
        after the last one this Loader began (or where a seek put it), so that every epoch is
        read whole in one view. A view the server refuses raises there, naming the field."""
        self._open()
        self._next_view = view_text(view)

    def _switch_view(self, consumer: Any) -> Any:
        """Attaches again with set_view's view at the next epoch's start (see set_view)."""
        view, self._next_view = self._next_view, None
        if view == self._options.view:
            return consumer
        if self._in_epoch:  # stopped early: the next iteration is the next epoch's, as __iter__
            at: Tuple[Optional[int], int] = (int(consumer.epoch) + 1, 0)
        else:
            at = (self._position.epoch, self._position.sample)
        options = copy.copy(self._options)
        options.view = view
        fresh = _batchcast.Consumer(options)  # refused: this one stays
        self._consumer, self._options = fresh, options
        consumer.close()
        self._in_epoch = False
        if at[0] is not None:
            self._seek(at[0], at[1], self._position.had(at[0]))
        return fresh

    def _epoch(self, consumer: Any) -> Iterator[Any]:
        first = True
        while True:
            batch = consumer.next()
            if batch is None and first and consumer.finished:
                self._never_served(consumer)
            first = False
            if batch is None:
                self._in_epoch = False
                self._position.epoch_ended()
                return
            self._in_epoch = True
            if self._first_epoch is None:
                self._first_epoch = int(batch.epoch)
            self._position.yielded(batch)
            # The suspended generator keeps no reference: the user's tensors alone hold the slot.
            held = [batch]
            del batch
            yield self._convert(self, held.pop())

    def _never_served(self, consumer: Any) -> None:
        """An iteration after the server's last epoch: raises, naming the epochs it served."""
        epochs = int(consumer.epochs)
        served = f"epochs 0 to {epochs - 1}" if epochs else "its epochs"
        wanted = self._position.epoch if self._position.epoch is not None else epochs
        read = (f"; this Loader read epochs {self._first_epoch} to {wanted - 1}"
                if self._first_epoch is not None and wanted else "")
        raise _batchcast.PositionUnavailableError(
            f"position unavailable: epoch {wanted} will never be served: the batchcast server "
            f"at {self.endpoint} served {served} and has ended{read} (a trainer that started "
            "late gets fewer epochs: start the server with more --epochs, or loop until "
            "loader.finished)"
        )

    def __len__(self) -> int:
        """Batches per whole epoch (exact, respecting drop_last).

        Raises TypeError while the server does not know its epoch length (a Producer over an
        unsized iterable before its first pass), as torch does for iterable datasets."""
        n = self._open().batches_per_epoch
        if n is None:
            raise TypeError(
                f"the length of the Loader on {self.endpoint} is unknown: its server does not "
                "know the epoch length yet (e.g. a Producer over an unsized iterable before "
                "its first pass ends)"
            )
        return int(n)

    # -- state -------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """Epoch of the batches being yielded (the last one started)."""
        return int(self._open().epoch)

    @property
    def batch_size(self) -> int:
        """Samples per batch (the server's batch size unless one was given)."""
        return int(self._open().batch_size)

    @property
    def finished(self) -> bool:
        """True once the server's last epoch was consumed."""
        return bool(self._open().finished)

    @property
    def stats(self) -> LoaderStats:
        """Counters since the Loader connected (batches, samples, skipped, copies, wait_s)."""
        return LoaderStats(**self._open().stats())

    # -- position ----------------------------------------------------------------------------

    def seek(self, epoch: int, sample: int = 0) -> None:
        """The next iteration starts at sample ``sample`` of epoch ``epoch`` (the server
        regenerates what it no longer holds, or raises PositionUnavailableError). In relaxed
        order, inside an epoch only a state (:meth:`load_state_dict`) says what is left."""
        if epoch < 0 or sample < 0:
            raise ValueError(f"seek({epoch}, {sample}): epoch and sample must be >= 0")
        self._seek(int(epoch), int(sample), HadSet(int(epoch)))

    def _seek(self, epoch: int, sample: int, had: HadSet) -> None:
        """seek(), in relaxed order after the samples ``had`` (``sample`` of them)."""
        self._open().seek(epoch, sample, had.bits())
        self._in_epoch = False
        self._position.moved(epoch, sample, had)

    def state_dict(self) -> Dict[str, Any]:
        """``{"epoch", "sample"}`` (relaxed order: also ``"order"``, ``"had"``): where the next
        iteration resumes (see the module doc)."""
        return self._position.state()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes at a :meth:`state_dict` position: call it before iterating. KeyError or
        ValueError for a state that is not one (``_resume_state.Position.loaded`` says which)."""
        at = self._position.loaded(state, self.endpoint)
        if at is not None:
            self._seek(*at)

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Tells the server this Loader wants no more data. Batches already out stay valid."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def _open(self) -> Any:
        if self._consumer is None:
            raise _batchcast.BatchcastError(
                f"the Loader on {getattr(self, 'endpoint', '?')} is closed; create a new one"
            )
        return self._consumer

    # -- conversion --------------------------------------------------------------------------

    @staticmethod
    def _converter(framework: str, copy: Optional[DeviceCopy]) -> Callable[["Loader", Any], Any]:
        """Returns the function turning a native batch into the user's structure of tensors."""
        if framework == "torch":
            import torch
            from torch.utils.dlpack import from_dlpack

            assert copy is not None

            def tensors(batch: Any) -> list:
                out = [from_dlpack(c) for c in batch.capsules(copy.stream(batch))]
                for i, dtype in enumerate(batch.dtypes):
                    if dtype == "bool":  # bool travels as uint8 (DLPack 0.6 has no bool)
                        out[i] = out[i].view(torch.bool)
                return copy(batch, out)

        elif framework == "numpy":
            import numpy

            def tensors(batch: Any) -> list:
                out = []
                for t in batch.tensors():
                    if t.dtype == "bfloat16":
                        raise _batchcast.BatchcastError(
                            f"tensor '{t.name}' is bfloat16, which NumPy lacks; use "
                            "framework='torch' (or 'dlpack')"
                        )
                    a = numpy.from_dlpack(t)
                    out.append(a.view(numpy.bool_) if t.dtype == "bool" else a)
                return out

        else:

            def tensors(batch: Any) -> list:
                return batch.tensors()

        def convert(loader: "Loader", batch: Any) -> Any:
            key = (batch.names, batch.dtypes)
            shape = loader._layouts.get(key)
            if shape is None:
                shape = loader._layouts[key] = Loader._shaper(batch.names)
            return shape(tensors(batch))

        return convert

    @staticmethod
    def _shaper(names: Tuple[str, ...]) -> Callable[[list], Any]:
        kind, order = _structure(names)
        if kind == "bare":
            return lambda ts: ts[0]
        if kind == "tuple":
            if order == list(range(len(names))):
                return tuple
            return lambda ts: tuple(ts[i] for i in order)  # type: ignore[union-attr]
        return lambda ts: dict(zip(names, ts))
