"""batchcast.Producer: shares any re-iterable of tensor batches through a batchcast server.

One pass over the iterable is one epoch. Each batch is copied once into the server's shared
pool (with the GIL released) and every attached Loader receives it zero-copy::

    loader = torch.utils.data.DataLoader(dataset, batch_size=64, num_workers=4)
    batchcast.Producer(loader, "ipc:///tmp/bc.sock", min_consumers=2).run(epochs=10)

Batches are tuples/lists of tensors (sent as "#0", "#1", ...), dicts of tensors (keyed by
their string keys) or single tensors (sent as "#"); NumPy arrays are accepted too. Dimension 0
is the sample dimension and all tensors of a batch must agree on it. Tensors must be on the
CPU (CUDA batches are not supported yet).

Cleanup: the pool (a /dev/shm segment) and the ipc socket file exist from the first batch
until close(). run() closes them itself when it ends by an exception: KeyboardInterrupt
(SIGINT), SystemExit (SIGTERM and SIGHUP become ``SystemExit(128 + signum)`` while the pool
exists, in the main thread, where they still have their default action: _exit_guard.py),
or an error of the iterable, which first fails the stream so that Loaders get its message
(Loaders that attach during the next ``fail_linger`` seconds too, and for ipc endpoints,
later ones through ``<socket path>.failed``). A pool still open at interpreter exit is closed
then. SIGKILL cannot be caught: the next server on the endpoint, or any batchcast server's
stale-segment sweep, removes what is left (docs/safety.md).
"""

from __future__ import annotations

import threading
import time
from collections import abc
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

from . import _batchcast, _tensor_names
from ._exit_guard import ExitGuard

__all__ = ["Producer"]

_HOST_DEFAULTS = _batchcast.StreamHostOptions()  # the defaults of Producer's arguments
_SLOT_HEADROOM = 1.25  # slots sized from the first batch leave room for larger later ones
_SLOT_ROUND = 4096

_TORCH_DTYPES: dict = {}


def _dtype_name(t: Any) -> str:
    if not _TORCH_DTYPES:
        import torch

        _TORCH_DTYPES.update(
            {
                torch.uint8: "uint8",
                torch.int8: "int8",
                torch.int16: "int16",
                torch.int32: "int32",
                torch.int64: "int64",
                torch.float16: "float16",
                torch.bfloat16: "bfloat16",
                torch.float32: "float32",
                torch.float64: "float64",
                torch.bool: "bool",
            }
        )
    try:
        return _TORCH_DTYPES[t.dtype]
    except KeyError:
        raise TypeError(
            f"dtype {t.dtype} cannot be shared; convert it to one of "
            + ", ".join(sorted(_TORCH_DTYPES.values()))
        ) from None


def _as_tensor(name: str, value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        t = value
    elif type(value).__module__ == "numpy" and hasattr(value, "dtype"):
        t = torch.from_numpy(value)
    else:
        raise TypeError(
            f"batch element {name!r} is a {type(value).__name__}, not a tensor; batches must be "
            "tensors, tuples/lists of tensors or dicts of tensors (no nesting)"
        )
    if t.device.type != "cpu":
        raise TypeError(
            f"tensor {name!r} is on {t.device}; Producer shares CPU tensors only for now "
            "(keep the DataLoader on the CPU: pin_memory=False, no .cuda() in collate_fn)"
        )
    if t.dim() == 0:
        raise ValueError(f"tensor {name!r} is a scalar; dimension 0 must count the samples")
    return t.contiguous()


def _flatten(batch: Any) -> Tuple[List[str], List[Any]]:
    """Names and contiguous CPU tensors of a batch (the wire's structure encoding)."""
    if isinstance(batch, (tuple, list)):
        names = [_tensor_names.tuple_name(i) for i in range(len(batch))]
        values = list(batch)
    elif isinstance(batch, Mapping):
        names = list(batch.keys())
        for k in names:
            if not isinstance(k, str) or not k or k.startswith(_tensor_names.PREFIX):
                raise TypeError(
                    f"dict key {k!r}: keys must be non-empty strings not starting with "
                    f"{_tensor_names.PREFIX!r}"
                )
        values = list(batch.values())
    else:
        names, values = [_tensor_names.BARE], [batch]
    if not names:
        raise ValueError("a batch has no tensors")
    return names, [_as_tensor(n, v) for n, v in zip(names, values)]


def _describe(names: List[str], tensors: List[Any]) -> List[Tuple[str, str, List[int], int]]:
    """The native side's view of a batch: (name, dtype, shape, data_ptr) per tensor."""
    return [(n, _dtype_name(t), list(t.shape), t.data_ptr()) for n, t in zip(names, tensors)]


def _known_epoch_samples(iterable: Any, first_batch_rows: int) -> Optional[int]:
    """Samples per pass when they can be known before the pass: a torch DataLoader's sampler
    length (respecting drop_last), else len(iterable) x the first batch's size."""
    try:
        from torch.utils.data import DataLoader, IterableDataset
    except ImportError:
        DataLoader = None  # type: ignore[assignment,misc]
    if DataLoader is not None and isinstance(iterable, DataLoader):
        if isinstance(iterable.dataset, IterableDataset) or iterable.batch_size is None:
            return None  # custom batch_sampler or stream: measured during the first pass
        n = len(iterable.sampler)  # type: ignore[arg-type]
        bs = iterable.batch_size
        return n // bs * bs if iterable.drop_last else n
    try:
        return len(iterable) * first_batch_rows
    except TypeError:
        return None


class Producer:
    """Serves the batches of ``iterable`` (one pass = one epoch) to every attached Loader.

    Args:
        iterable: re-iterable of batches (a torch DataLoader, a list, ...).
        endpoint: where Loaders connect; None: the default ipc endpoint.
        min_consumers: the stream starts once this many Loaders have attached.
        ring: slots in the shared pool (how far the fastest Loader may run ahead).
        slot_bytes: bytes per slot; None: the first batch's bytes x 1.25, rounded up.
        stall_policy: ``"decouple"`` (default): a Loader that holds the stream back for
            ``stall_timeout`` seconds reads what it missed as chunks regenerated for it
            (``regenerate``; nothing lost) and merges back when it catches up, so a slow or
            paused trainer costs the others at most that; without ``regenerate`` it is
            waited for, as under ``"wait"`` (never skips data); ``"skip"`` leaves behind a
            Loader that took nothing for ``stall_timeout`` seconds (what it misses counted).
        stall_timeout: see stall_policy (a Loader's own ``stall_timeout`` overrides it); a
            stream stalled this long is logged, naming who holds what.
        allow_remote: let a ``tcp://*:PORT`` endpoint listen on every interface.
        fail_linger: when the iterable raises, seconds the stream stays up failed (Loaders
            attaching then get the error) before run() closes it and re-raises; like
            ``batchcast serve --fail-linger``. None: 0 for ipc endpoints, whose failure record
            tells later Loaders why (so a failing script is not held up), 30 for tcp ones.
        regenerate: ``regenerate(epoch, index)`` returns batch ``index`` of pass ``epoch`` again,
            with the same structure and, for the same arguments, the same content as the pass
            yielded (what a seeded sampler over a deterministic dataset gives). With it, a
            Loader that joins mid-epoch, or seeks to a position the ring no longer holds
            (resume), gets the batches it missed produced again for it alone (docs/stream.md,
            "Positions"); it runs on a thread of its own. Needs the epoch's length known
            before the first pass (a sized iterable) and batches of one size but the last.
            None: such a position raises PositionUnavailableError in that Loader.
    """

    def __init__(
        self,
        iterable: Iterable[Any],
        endpoint: Optional[str] = None,
        min_consumers: int = _HOST_DEFAULTS.min_consumers,
        ring: int = _HOST_DEFAULTS.ring_slots,
        slot_bytes: Optional[int] = None,
        stall_policy: str = _HOST_DEFAULTS.stall_policy,
        stall_timeout: float = _HOST_DEFAULTS.stall_timeout,
        allow_remote: bool = _HOST_DEFAULTS.allow_remote,
        fail_linger: Optional[float] = None,
        regenerate: Optional[Callable[[int, int], Any]] = None,
    ) -> None:
        if isinstance(iterable, abc.Iterator):
            raise TypeError(
                "Producer needs a re-iterable (one pass per epoch), not an iterator; pass the "
                "DataLoader or list itself"
            )
        self._iterable = iterable
        # The stream host's options; the first batch fills in its shape (_start).
        self._options = _batchcast.StreamHostOptions(
            endpoint=endpoint or "",
            ring_slots=ring,
            min_consumers=min_consumers,
            stall_policy=stall_policy,
            stall_timeout=stall_timeout,
            allow_remote=allow_remote,
            regenerates=regenerate is not None,
        )
        self._slot_bytes = slot_bytes
        self._fail_linger = fail_linger
        self._regenerate = regenerate
        self._regenerating: Optional[threading.Thread] = None
        self._core: Optional[Any] = None
        self._guard: Optional[ExitGuard] = None
        self._epoch = 0
        self._stopped = False

    # -- serving -----------------------------------------------------------------------------

    def run(self, epochs: Optional[int] = 1) -> bool:
        """Serves ``epochs`` passes (None: until :meth:`stop`), then tells the Loaders the
        stream ended and returns once each got it. Returns False if stopped early. Ending by
        an exception closes the Producer (see the module's Cleanup)."""
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs={epochs}: use an integer >= 1 or None")
        returned = False
        try:
            result = self._serve(epochs)
            returned = True
            return result
        except Exception as e:  # not KeyboardInterrupt/SystemExit (signals): no linger for those
            if self._core is not None and not self._stopped:
                self._fail(f"{type(e).__name__}: {e}")
            raise
        finally:
            if not returned:
                self.close()

    def _serve(self, epochs: Optional[int]) -> bool:
        epoch_samples: Optional[int] = None
        served = 0
        while (epochs is None or served < epochs) and not self._stopped:
            iterator = iter(self._iterable)
            pending = self._first(iterator)
            if self._core is None:
                epoch_samples = _known_epoch_samples(self._iterable, pending[1][0].shape[0])
                self._start(pending, epochs, epoch_samples)
            position = 0
            index = 0
            for batch in self._batches(iterator):
                if not self._publish(pending, index, position, epoch_samples, False):
                    return False
                position += pending[1][0].shape[0]
                index += 1
                pending = batch
            if not self._publish(pending, index, position, epoch_samples, True):
                return False
            position += pending[1][0].shape[0]
            if epoch_samples != position:
                # Unknown (or estimated) before the first pass; exact from now on.
                epoch_samples = position
                self._core.set_epoch_samples(position)
            self._epoch += 1
            served += 1
        if self._stopped or self._core is None:
            return False
        self._core.finish()
        finished = bool(self._core.wait_finished(-1.0))
        if self._regenerating is not None:
            self._regenerating.join()  # its acquire_private() ends with the stream
        return finished

    def stop(self) -> None:
        """Stops serving (any thread): run() returns False soon, Loaders see the server gone."""
        self._stopped = True
        if self._core is not None:
            self._core.stop()

    def close(self) -> None:
        """Stops and removes the shared pool and the endpoint (idempotent)."""
        self.stop()
        if self._regenerating is not None:
            # Its frame holds the stream host: were it still alive at exit, the pool and the socket
            # would never be removed. stop() ends its acquire_private().
            self._regenerating.join()
            self._regenerating = None
        self._core = None
        if self._guard is not None:
            self._guard.release()
            self._guard = None

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- state -------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The endpoint Loaders connect to (resolved once serving started)."""
        if self._core is not None:
            return str(self._core.endpoint)
        return self._options.endpoint or _batchcast.default_endpoint()

    @property
    def epoch(self) -> int:
        """The epoch being produced."""
        return self._epoch

    @property
    def consumers_now(self) -> int:
        return int(self._core.consumers_now) if self._core is not None else 0

    @property
    def consumers_reading(self) -> int:
        """Attached consumers that have not closed (a closed one whose user still holds
        batches stays in consumers_now until it released them)."""
        return int(self._core.consumers_reading) if self._core is not None else 0

    @property
    def consumers_ever(self) -> int:
        return int(self._core.consumers_ever) if self._core is not None else 0

    @property
    def stats(self) -> dict:
        """The stream host's counters (chunks_published, consumers_now, ring_occupied, ...)."""
        return dict(self._core.stats()) if self._core is not None else {}

    # -- internals ---------------------------------------------------------------------------

    def _fail(self, message: str) -> None:
        """Fails the stream with `message` and keeps answering for fail_linger seconds."""
        self._core.fail(message)
        linger = self._fail_linger
        if linger is None:
            linger = 0.0 if self.endpoint.startswith("ipc://") else 30.0
        deadline = time.monotonic() + linger
        while not self._stopped and time.monotonic() < deadline:
            time.sleep(0.1)  # signals interrupt it (their exception ends the linger)

    def _first(self, iterator: Iterator[Any]) -> Tuple[List[str], List[Any]]:
        try:
            return _flatten(next(iterator))
        except StopIteration:
            raise ValueError(
                f"pass {self._epoch} over the iterable yielded no batch; Producer needs a "
                "non-empty re-iterable (one pass per epoch)"
            ) from None

    @staticmethod
    def _batches(iterator: Iterator[Any]) -> Iterator[Tuple[List[str], List[Any]]]:
        for batch in iterator:
            yield _flatten(batch)

    def _start(
        self,
        first: Tuple[List[str], List[Any]],
        epochs: Optional[int],
        epoch_samples: Optional[int],
    ) -> None:
        names, tensors = first
        need = int(_batchcast.chunk_bytes(_describe(names, tensors)))
        slot_bytes = self._slot_bytes
        if slot_bytes is None:
            slot_bytes = -(-int(need * _SLOT_HEADROOM) // _SLOT_ROUND) * _SLOT_ROUND
        elif slot_bytes < need:
            raise ValueError(f"slot_bytes={slot_bytes} is smaller than the first batch ({need} B)")
        self._names = names
        self._options.slot_bytes = slot_bytes
        self._options.chunk_size = int(tensors[0].shape[0])
        self._options.epoch_samples = epoch_samples or 0
        self._options.epochs = epochs or 0
        self._core = _batchcast.StreamHost(self._options)
        self._guard = ExitGuard(self.close)
        if self._regenerate is not None:
            if not epoch_samples:
                raise ValueError(
                    "Producer(regenerate=...) needs the epoch's length before the first pass: "
                    "pass a sized iterable (len() works), or leave regenerate out"
                )
            self._regenerating = threading.Thread(
                target=self._regenerate_loop,
                args=(int(tensors[0].shape[0]), epoch_samples),
                name="batchcast-regenerate",
                daemon=True,
            )
            self._regenerating.start()
        if self._stopped:  # stop() raced with the start
            self._core.stop()

    def _regenerate_loop(self, batch_size: int, epoch_samples: int) -> None:
        """Produces again the chunks Loaders catching up ask for, until the stream is over."""
        core = self._core
        assert self._regenerate is not None and core is not None
        chunks = -(-epoch_samples // batch_size)
        while True:
            lease = core.acquire_private(-1.0)
            if lease is None:
                return
            seq, epoch, index = lease
            try:
                names, tensors = _flatten(self._regenerate(int(epoch), int(index)))
                if names != self._names:
                    raise ValueError(
                        f"regenerate({epoch}, {index}) returned tensors {names} but the "
                        f"stream's batches have {self._names}"
                    )
                core.publish_private(
                    seq,
                    _describe(names, tensors),
                    epoch,
                    index,
                    index * batch_size,
                    epoch_samples,
                    index + 1 == chunks,
                )
            except Exception as e:
                core.fail(f"regenerate({epoch}, {index}) failed: {type(e).__name__}: {e}")
                return

    def _publish(
        self,
        batch: Tuple[List[str], List[Any]],
        index: int,
        position: int,
        epoch_samples: Optional[int],
        epoch_end: bool,
    ) -> bool:
        names, tensors = batch
        if names != self._names:
            raise ValueError(
                f"batch {index} of epoch {self._epoch} has tensors {names} but the first batch "
                f"had {self._names}; every batch must have the same structure"
            )
        described = _describe(names, tensors)
        need = int(_batchcast.chunk_bytes(described))
        slot_bytes = int(self._core.slot_bytes)
        if need > slot_bytes:
            raise ValueError(
                f"batch {index} of epoch {self._epoch} needs {need} bytes but the slots hold "
                f"{slot_bytes} (sized from the first batch); pass Producer(slot_bytes={need}) "
                "or more"
            )
        return bool(
            self._core.publish_chunk(
                described, self._epoch, index, position, epoch_samples or 0, epoch_end
            )
        )
