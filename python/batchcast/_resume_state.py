"""A Loader's position and the state its ``state_dict()`` keeps of it (docs/stream.md, "Order").

:class:`Position`: where the Loader's next iteration starts, ``(epoch, sample)``, and in relaxed
order the samples (dataset indices) it yielded in that epoch, a :class:`HadSet`: the server chose
their order, so only that set says what is left of the epoch. Its state is ``{"epoch", "sample"}``,
in relaxed order with ``"order": "relaxed"`` and ``"had"``; :meth:`Position.loaded` checks a state
for ``load_state_dict()``, the server checking the set against its shard again.

``"had"`` is text: the set as a bitset (bit i of byte k: index 8k + i, the byte order of the
wire's HadSamples words), its trailing zero bytes cut, zlib-compressed, then base64. Why: a
bitset costs one bit per dataset index whatever the set (ImageNet's 1.28 M: 160 KB at most),
where a list of indices costs 4 to 8 bytes per sample had (5 MB half-way through that epoch);
zlib shrinks it to little where it is sparse or nearly full (early or late in an epoch, or one
rank's share of the dataset); and text keeps the state a plain dict that json and torch.save both
store as it is.

Thread-safety: none (the Loader's thread). Ownership: plain values.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from typing import Any, Dict, Optional, Sequence, Tuple

__all__ = ["HadSet", "ORDERS", "Position"]

ORDERS = ("exact", "relaxed")  # a Loader's orders (order=None: the server's default)


class HadSet:
    """Dataset indices had in epoch ``epoch`` (None: no epoch yet, an empty set)."""

    def __init__(self, epoch: Optional[int] = None, bits: bytes = b"") -> None:
        self.epoch = epoch
        self._bits = bytearray(bits)

    def add(self, epoch: int, indices: Sequence[int]) -> None:
        """Adds the samples of a batch of ``epoch``; a batch of another epoch starts a new set."""
        if epoch != self.epoch:
            self.epoch, self._bits = epoch, bytearray()
        bits = self._bits
        end = (max(indices, default=-1) >> 3) + 1
        if end > len(bits):
            bits.extend(bytes(end - len(bits)))
        for i in indices:
            bits[i >> 3] |= 1 << (i & 7)

    def bits(self) -> bytes:
        """The bitset (what Consumer.seek's ``had`` takes)."""
        return bytes(self._bits)

    def __len__(self) -> int:
        return int.from_bytes(self._bits, "little").bit_count()

    def encode(self) -> str:
        """The state's text of the set (the module doc says why this encoding)."""
        packed = zlib.compress(bytes(self._bits).rstrip(b"\0"), 9)
        return base64.b64encode(packed).decode("ascii")

    @classmethod
    def decode(cls, epoch: int, text: Any) -> "HadSet":
        """The set :meth:`encode` wrote, of ``epoch``; ValueError if ``text`` is not one."""
        if not isinstance(text, str):
            raise ValueError(f"'had' is a {type(text).__name__}, not the text state_dict() wrote")
        try:
            return cls(epoch, zlib.decompress(base64.b64decode(text, validate=True)))
        except (binascii.Error, zlib.error) as e:
            raise ValueError(f"'had' is not the text state_dict() wrote ({e})") from None


class Position:
    """Where a Loader's next iteration starts: sample ``sample`` of epoch ``epoch`` (None before
    the first batch: wherever the stream is); ``relaxed``: the server serves it in relaxed order,
    and the position keeps the samples yielded in its epoch (:meth:`had`)."""

    def __init__(self, relaxed: bool) -> None:
        self.relaxed = relaxed
        self.epoch: Optional[int] = None
        self.sample = 0
        self._had = HadSet()

    def yielded(self, batch: Any) -> None:
        """``batch`` (a native Batch) was yielded: the position is the sample after it."""
        self.epoch, self.sample = int(batch.epoch), int(batch.sample_start) + int(batch.size)
        samples = batch.samples
        if samples:
            self._had.add(self.epoch, samples)

    def epoch_ended(self) -> None:
        if self.epoch is not None:
            self.epoch, self.sample = self.epoch + 1, 0

    def moved(self, epoch: int, sample: int, had: HadSet) -> None:
        """A seek: sample ``sample`` of ``epoch``, after the samples ``had`` (relaxed order)."""
        self.epoch, self.sample, self._had = epoch, sample, had

    def had(self, epoch: Optional[int] = None) -> HadSet:
        """The samples yielded in ``epoch`` (the position's) before the position."""
        epoch = self.epoch if epoch is None else epoch
        return self._had if self._had.epoch == epoch else HadSet(epoch)

    def state(self) -> Dict[str, Any]:
        """What ``state_dict()`` returns (the module doc)."""
        state: Dict[str, Any] = {"epoch": self.epoch, "sample": self.sample}
        if self.relaxed:
            state.update(order="relaxed", had=self.had().encode())
        return state

    def loaded(self, state: Dict[str, Any], endpoint: str) -> Optional[Tuple[int, int, HadSet]]:
        """The (epoch, sample, samples had) ``load_state_dict(state)`` seeks; None for a state
        taken before the first batch. KeyError for a state that lacks a key, ValueError for one
        inside an epoch of the other order (the samples had there say nothing of this one's), or
        whose ``had`` is not the text :meth:`state` wrote or not ``sample`` samples."""
        order = state.get("order", "exact")
        relaxed = order == "relaxed"
        missing = ({"epoch", "sample", "had"} if relaxed else {"epoch", "sample"}) - set(state)
        if missing:
            raise KeyError(f"Loader.load_state_dict: the state lacks {sorted(missing)}; pass "
                           "what Loader.state_dict() returned")
        if order not in ORDERS:
            raise ValueError(f"Loader.load_state_dict: the state's order {order!r} is not one of "
                             f"{', '.join(ORDERS)}")
        if state["epoch"] is None:
            return None
        epoch, sample = int(state["epoch"]), int(state["sample"])
        if epoch < 0 or sample < 0:
            raise ValueError(f"Loader.load_state_dict: epoch {epoch} sample {sample}: both must "
                             "be >= 0")
        if relaxed != self.relaxed and sample:
            raise ValueError(
                f"Loader.load_state_dict: the state is a position inside epoch {epoch} (sample "
                f"{sample}) of a Loader in {order} order, and the server at {endpoint} serves "
                f"this Loader in {'relaxed' if self.relaxed else 'exact'} order; make the Loader "
                f"with order={order!r}, or load a state of its own order"
            )
        if not relaxed:
            return epoch, sample, HadSet(epoch)
        try:
            had = HadSet.decode(epoch, state["had"])
        except ValueError as e:
            raise ValueError(f"Loader.load_state_dict: {e}") from None
        if len(had) != sample:
            raise ValueError(
                f"Loader.load_state_dict: the state's 'had' lists {len(had)} samples of epoch "
                f"{epoch}, its 'sample' says {sample}; pass what Loader.state_dict() returned, "
                "unchanged"
            )
        return epoch, sample, had
