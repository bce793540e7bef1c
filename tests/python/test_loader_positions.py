"""batchcast.Loader's positions (docs/stream.md, "Positions") against real servers: a late joiner
gets the whole epoch by regeneration with the same bytes, a resumed loader reads the same next
samples, loaders catching up together in lockstep, a refused position, leaving an epoch early.

Run: .venv/bin/python -m pytest tests/python/test_loader_positions.py
"""

from __future__ import annotations

import threading
from typing import Dict, List

import numpy
import pytest
import torch

import batchcast
from conftest import synthetic_rows
from loader_common import SAMPLE_BYTES, serve


def one_image_per_class(root, classes: int = 30) -> str:
    """An ImageFolder of `classes` classes of one noise JPEG each: the label names the sample."""
    from PIL import Image

    rng = numpy.random.default_rng(7)
    for k in range(classes):
        folder = root / f"c{k:02d}"
        folder.mkdir(parents=True)
        pixels = rng.integers(0, 256, (30, 40, 3), dtype=numpy.uint8)
        Image.fromarray(pixels).save(folder / "x.jpg", quality=90)
    return str(root)


def by_label(batches) -> Dict[int, bytes]:
    """{label: augmented bytes} of an epoch, asserting every label comes once."""
    out: Dict[int, bytes] = {}
    for x, y in batches:
        for row, label in zip(x, y.tolist()):
            assert label not in out, f"sample {label} came twice in one epoch"
            out[label] = row.numpy().tobytes()
    return out


def test_a_loader_joining_mid_epoch_gets_the_whole_epoch_with_the_same_bytes(
        endpoint, batchcast_bin, tmp_path):
    data = one_image_per_class(tmp_path / "data")
    with batchcast.serve(data=data, endpoint=endpoint, batch_size=2, epochs=2, image_size=16,
                         ring=4, workers=2, seed=3) as server:
        a = batchcast.Loader(endpoint, timeout=30)
        first = iter(a)
        # a received chunk 4 of 15, so the ring of 4 holds neither chunk 0 nor epoch 1's start
        # (a's cursor is at most chunk 7: a asks for 2 ahead).
        head = [(x.clone(), y.clone()) for x, y in (next(first) for _ in range(5))]
        b = batchcast.Loader(endpoint, timeout=30)
        epochs: Dict[str, List] = {}

        def read_a() -> None:
            epochs["a"] = [head + [(x.clone(), y.clone()) for x, y in first],
                           [(x.clone(), y.clone()) for x, y in a]]

        def read_b() -> None:
            epochs["b"] = [[(x.clone(), y.clone()) for x, y in b] for _ in range(2)]

        threads = [threading.Thread(target=read_a), threading.Thread(target=read_b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert server.wait(20) == 0
        for e in range(2):
            mine, theirs = by_label(epochs["a"][e]), by_label(epochs["b"][e])
            assert sorted(theirs) == list(range(30)), f"b's epoch {e} is not whole"
            assert theirs == mine, f"b's epoch {e} differs from a's in some sample's bytes"
        assert b.stats.skipped == 0
        a.close()
        b.close()


def test_a_resumed_loader_reads_the_same_next_samples_and_bytes(
        endpoint, batchcast_bin, tmp_path):
    data = one_image_per_class(tmp_path / "data")
    with batchcast.serve(data=data, endpoint=endpoint, batch_size=2, epochs=None, image_size=16,
                         ring=4, workers=2, seed=3):
        a = batchcast.Loader(endpoint, batch_size=4, timeout=30)
        for _ in a:
            pass
        it = iter(a)
        for _ in range(3):
            next(it)
        assert a._open().position == (1, 12), "the checkpoint: epoch 1 after 3 batches of 4"
        continuation = [(x.clone(), y.clone()) for x, y in it]
        stop = threading.Event()

        def keep_reading() -> None:  # the stream moves on: epoch 1 leaves the ring
            while not stop.is_set():
                for _ in a:
                    if stop.is_set():
                        break

        reader = threading.Thread(target=keep_reading)
        reader.start()
        try:
            b = batchcast.Loader(endpoint, batch_size=4, timeout=30)
            b._open().seek(1, 12)
            resumed = [(x.clone(), y.clone()) for x, y in b]
            b.close()  # a may wait for b's catch-up (stall_policy=wait): let it go first
        finally:
            stop.set()
            reader.join(30)
        assert [y.tolist() for _, y in resumed] == [y.tolist() for _, y in continuation]
        assert by_label(resumed) == by_label(continuation)
        a.close()


def test_loaders_catching_up_together_in_lockstep_keeping_every_batch_never_stall(
        endpoint, batchcast_bin):
    # Trainers started together mid-epoch: three loaders of one thread join at once, each catches
    # up on chunks regenerated for it alone, and the user reads them in lockstep, keeping every
    # batch, while a leader reads on. A consumer copies a private chunk as it arrives and
    # releases its slot (client/chunk_copy.h), so neither kept batches nor loaders waiting for
    # their turn pin the slots the server keeps for catching up. When each kept its first batches
    # as views of its private chunks, the joiners took all of those slots and the stream
    # stalled (the loaders' timeout raised TimeoutError).
    with serve(endpoint, samples=400, batch=4, epochs=2, ring=16) as server:
        loaders = [batchcast.Loader(endpoint, timeout=30)]
        lead = loaders[0]._open()
        head = []
        for _ in range(40):  # chunk 40 of 100: the ring of 16 lost the epoch's start
            head += torch.from_dlpack(lead.next().tensors()[1]).tolist()
        loaders += [batchcast.Loader(endpoint, timeout=30) for _ in range(3)]
        consumers = [loader._open() for loader in loaders]
        kept: List[List] = [[] for _ in consumers]  # every batch, alive until the end
        labels: List[List[List[int]]] = [[[], []] for _ in consumers]  # per consumer, per epoch

        def read(k: int, epoch: int) -> bool:
            batch = consumers[k].next()
            if batch is None:  # its epoch ended
                return False
            x, y = (torch.from_dlpack(t) for t in batch.tensors())
            assert torch.equal(x, synthetic_rows(y, SAMPLE_BYTES)), \
                "payload does not match its label"
            labels[k][epoch] += y.tolist()
            kept[k].append(batch)
            return True

        def in_lockstep(members: List[int], epoch: int) -> None:
            reading = list(members)
            while reading:  # one batch of each in turn, as zip() over the loaders does
                reading = [k for k in reading if read(k, epoch)]

        # The leader goes on in a thread of its own: it runs at most the ring ahead of the
        # joiners' merge chunks (stall_policy=wait), so it must not wait for the user's turn.
        errors: List[BaseException] = []

        def lead_epoch() -> None:
            try:
                while read(0, 0):
                    pass
            except BaseException as e:  # noqa: B036 - recorded for the assertion
                errors.append(e)

        leader = threading.Thread(target=lead_epoch)
        leader.start()
        in_lockstep([1, 2, 3], 0)
        leader.join(60)
        assert not leader.is_alive() and not errors, errors
        in_lockstep([0, 1, 2, 3], 1)  # then all four, on the shared stream

        whole = head + labels[0][0]
        assert sorted(whole) == list(range(400))
        for k in (1, 2, 3):
            assert labels[k][0] == whole, f"joiner {k} did not get epoch 0 whole, in order"
            assert labels[k][1] == labels[0][1], f"joiner {k} differs in epoch 1"
            assert kept[k][0].copied, "a private chunk's batch is a private copy"
        assert not kept[0][0].copied, "the leader's first kept batch is a zero-copy view"
        assert server.wait(20) == 0
        with open(server.log_path) as log:
            caught_up = log.read().count("chunks regenerated for it until it reaches the stream")
        assert caught_up == 3, "each joiner caught up on private chunks"
        for loader in loaders:
            loader.close()


def test_a_refused_position_is_an_error_the_loader_survives(endpoint):
    epoch = [(torch.full((2, 3), i, dtype=torch.uint8), torch.arange(2)) for i in range(6)]
    producer = batchcast.Producer(epoch, endpoint, ring=2)
    serving = threading.Thread(target=producer.run, kwargs={"epochs": 3})
    serving.start()
    try:
        loader = batchcast.Loader(endpoint, timeout=30)
        for _ in loader:
            pass
        consumer = loader._open()
        consumer.seek(0, 0)  # gone from a ring of 2, and this Producer cannot regenerate
        with pytest.raises(batchcast.PositionUnavailableError, match="epoch 0 sample 0"):
            consumer.next()
        consumer.seek(2, 0)  # ahead: waited for
        assert [int(x[0, 0]) for x, _ in loader] == list(range(6))
        loader.close()
    finally:
        producer.stop()
        serving.join(30)
        producer.close()


def test_leaving_an_epoch_early_seeks_to_the_next_without_draining(endpoint, batchcast_bin):
    with serve(endpoint, samples=64, batch=8, epochs=2, ring=4) as server:
        loader = batchcast.Loader(endpoint, batch_size=8, timeout=30)
        consumer = loader._open()  # the native consumer: what the Loader drives
        consumer.next()
        consumer.next()  # two batches of epoch 0, then the user leaves the epoch
        assert consumer.position == (0, 16)
        consumer.seek(consumer.position[0] + 1, 0)  # what a new iteration after a break does
        assert consumer.position == (1, 0)
        labels: List[int] = []
        while (batch := consumer.next()) is not None:
            assert batch.epoch == 1
            labels += numpy.from_dlpack(batch.tensors()[1]).tolist()
        assert sorted(labels) == list(range(64)), "epoch 1, whole"
        stats = consumer.stats()
        assert stats["skipped"] == 0
        assert stats["batches"] == 2 + 8, "the rest of epoch 0 was never read"
        loader.close()
        assert server.wait(20) == 0
