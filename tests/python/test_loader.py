"""batchcast.Loader against real `batchcast serve --synthetic` servers.

Run: .venv/bin/python -m pytest tests/python/test_loader.py
Synthetic sample i: "#0" = uint8 bytes synthetic_byte(i, j), "#1" = int64 label i.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import textwrap
import threading
import time
from typing import Dict, List

import numpy
import pytest
import torch

import batchcast
from conftest import segment_of, synthetic_rows

SAMPLE_BYTES = 32


def serve(endpoint: str, samples: int = 100, batch: int = 16, epochs: int = 2, **kw):
    return batchcast.serve(synthetic=samples, sample_bytes=SAMPLE_BYTES, endpoint=endpoint,
                           batch_size=batch, epochs=epochs, workers=2, **kw)


def read_epochs(loader: batchcast.Loader, epochs: int, out: List[List[torch.Tensor]]) -> None:
    for _ in range(epochs):
        batches = []
        for x, y in loader:
            assert torch.equal(x, synthetic_rows(y, SAMPLE_BYTES)), \
                "payload does not match its label"
            batches.append((x.clone(), y.clone()))
        out.append(batches)



def remove_killed_server_files(endpoint: str) -> None:
    """A killed server cannot clean up (the next server on the machine would): its pool and
    socket are removed here."""
    for path in (segment_of(endpoint), endpoint[len("ipc://"):]):
        if os.path.exists(path):
            os.unlink(path)


def test_consumers_with_different_batch_sizes_see_each_sample_once(endpoint, batchcast_bin):
    with serve(endpoint, min_consumers=3) as server:
        loaders = [batchcast.Loader(endpoint, batch_size=b, timeout=20) for b in (10, 7, 10)]
        results: Dict[int, List] = {i: [] for i in range(3)}
        threads = [threading.Thread(target=read_epochs, args=(l, 2, results[i]))
                   for i, l in enumerate(loaders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert server.wait(10) == 0
        for i, b in enumerate((10, 7, 10)):
            assert len(results[i]) == 2
            for batches in results[i]:
                assert [len(y) for _, y in batches[:-1]] == [b] * (len(batches) - 1)
        for e in range(2):
            orders = [torch.cat([y for _, y in results[i][e]]).tolist() for i in range(3)]
            assert sorted(orders[0]) == list(range(100))  # every sample once
            assert orders[0] == orders[1] == orders[2]  # in stream order
            for (xa, ya), (xb, yb) in zip(results[0][e], results[2][e]):  # same b: same bytes
                assert torch.equal(xa, xb) and torch.equal(ya, yb)
        for l in loaders:  # an epoch after the last one is never served: raises, naming them
            with pytest.raises(batchcast.PositionUnavailableError,
                               match="epoch 2 will never be served: .* served epochs 0 to 1"):
                list(l)
            l.close()


FROZEN = textwrap.dedent("""
    import os, signal, sys
    import batchcast
    loader = batchcast.Loader(sys.argv[1], timeout=60)
    batches = iter(loader)
    next(batches), next(batches)
    print("read", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # holding its batches: it holds the stream back
""")


def test_a_waiting_loader_names_the_consumer_that_holds_the_stream_back(endpoint, run_py,
                                                                         caplog):
    caplog.set_level(logging.WARNING, logger="batchcast")  # Python's default level shows it
    with serve(endpoint, samples=100000, epochs=1, min_consumers=2, stall_policy="wait"):
        frozen = run_py(FROZEN, endpoint)
        loader = batchcast.Loader(endpoint, timeout=8)
        assert frozen.stdout.readline().strip() == b"read"
        with pytest.raises(batchcast.TimeoutError,
                           match=rf"pid {frozen.pid}\).*holds the stream back"):
            for _ in loader:
                pass
        frozen.kill()
        loader.close()
    said = [r for r in caplog.records if r.name == "batchcast" and
            f"pid {frozen.pid})" in r.getMessage() and "holds the stream back" in r.getMessage()]
    assert said and said[0].levelno == logging.WARNING


def test_a_loader_waiting_for_min_consumers_says_how_many_are_attached(endpoint, caplog):
    caplog.set_level(logging.WARNING, logger="batchcast")
    with serve(endpoint, min_consumers=2):
        with batchcast.Loader(endpoint, timeout=4) as loader:
            with pytest.raises(batchcast.TimeoutError,
                               match="waits for min_consumers not met: 1 of 2 consumers attached"):
                next(iter(loader))
    assert any("min_consumers not met: 1 of 2" in r.getMessage() and
               r.levelno == logging.WARNING for r in caplog.records)


def test_len_is_exact_with_and_without_drop_last(endpoint, batchcast_bin):
    with serve(endpoint, min_consumers=2, epochs=1):
        keep = batchcast.Loader(endpoint, batch_size=7, timeout=20)
        drop = batchcast.Loader(endpoint, batch_size=7, drop_last=True, timeout=20)
        assert (len(keep), len(drop)) == (15, 14)
        counts = {}
        threads = [threading.Thread(target=lambda l=l: counts.__setitem__(id(l), len(list(l))))
                   for l in (keep, drop)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert counts == {id(keep): 15, id(drop): 14}
        assert keep.stats.samples == 100 and drop.stats.samples == 98
        keep.close()
        drop.close()


@pytest.mark.parametrize("ring", [4, 2])
def test_keeping_every_batch_gets_copies_and_never_stalls(endpoint, batchcast_bin, ring):
    with serve(endpoint, samples=200, epochs=1, ring=ring):
        # 13 batches > `ring` slots: would deadlock without copies. With 2 slots, max_held=2
        # zero-copy batches alone would pin the whole ring: the Loader holds at most 1.
        loader = batchcast.Loader(endpoint, timeout=10, max_held=2)
        kept = list(loader)
        labels = torch.cat([y for _, y in kept])
        assert sorted(labels.tolist()) == list(range(200))
        assert all(torch.equal(x, synthetic_rows(y, SAMPLE_BYTES)) for x, y in kept)
        stats = loader.stats
        assert stats.copies > 0 and stats.batches == 13
        loader.close()


def test_slot_is_held_until_the_last_tensor_is_freed(endpoint, batchcast_bin):
    with serve(endpoint, samples=160, epochs=1):
        loader = batchcast.Loader(endpoint, timeout=10, max_held=1)
        it = iter(loader)
        x, y = next(it)
        view = x[2:4]  # a view keeps the batch (and its slot) alive
        del x, y
        gc.collect()
        x2, y2 = next(it)
        assert loader.stats.copies == 1  # the one zero-copy batch allowed is still held
        del view, x2, y2
        gc.collect()
        next(it)
        assert loader.stats.copies == 1  # freed: zero-copy again
        list(it)
        loader.close()


IN_PLACE_READER = textwrap.dedent(
    """
    import sys, torch, batchcast
    from conftest import synthetic_rows
    endpoint, width, write = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "write"
    loader = batchcast.Loader(endpoint, timeout=60)
    batches = 0
    for epoch in range(3):
        for x, y in loader:
            want = synthetic_rows(y, width)
            # Before any write: the server's bytes, also in slots this process wrote into
            # while they held earlier chunks.
            assert torch.equal(x, want), f"epoch {epoch}: batch {batches} is not the server's"
            if write:
                x.mul_(2)  # in place, into the zero-copy batch
                assert torch.equal(x, want * 2)
            batches += 1
            del x, y, want  # the batch is freed: its slot goes back
    assert loader.stats.copies == 0, f"{loader.stats.copies} of {batches} batches were copies"
    print(batches, flush=True)
    """
)


def test_in_place_writes_stay_private(endpoint, batchcast_bin, run_py):
    # Two trainers in their own processes; A doubles every batch in place, B only reads. A ring
    # of 4 slots carries 30 chunks, so A reads many chunks in slots it wrote into before: each
    # must read as the server wrote it, and B must never see A's writes.
    width = 3 * 4096 // 16 + 8  # a chunk spans several pages
    with batchcast.serve(synthetic=160, sample_bytes=width, endpoint=endpoint, batch_size=16,
                         epochs=3, workers=2, ring=4, min_consumers=2):
        a = run_py(IN_PLACE_READER, endpoint, str(width), "write")
        b = run_py(IN_PLACE_READER, endpoint, str(width), "read")
        for p in (a, b):
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()
            assert out.decode().split() == ["30"], (out, err)


def test_numpy_consumer_through_dlpack(endpoint, batchcast_bin):
    with serve(endpoint, samples=40, epochs=1):
        loader = batchcast.Loader(endpoint, batch_size=16, framework="numpy", timeout=10)
        labels = []
        for x, y in loader:
            assert isinstance(x, numpy.ndarray) and x.dtype == numpy.uint8
            assert y.dtype == numpy.int64
            want = synthetic_rows(torch.from_numpy(y.copy()), SAMPLE_BYTES)
            assert numpy.array_equal(x, want.numpy())
            labels += y.tolist()
        assert sorted(labels) == list(range(40))
        loader.close()


def test_killed_server_raises_server_gone(endpoint, batchcast_bin):
    server = serve(endpoint, samples=1000, epochs=0, ring=4)
    try:
        loader = batchcast.Loader(endpoint, batch_size=8, timeout=30)
        next(iter(loader))
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
        start = time.monotonic()
        with pytest.raises(batchcast.ServerGoneError, match="gone"):
            for _ in loader:
                pass
        assert time.monotonic() - start < 5
        loader.close()
    finally:
        server.stop()
        remove_killed_server_files(endpoint)
    assert not os.path.exists(server.log_path), "stop() leaves no server log in /tmp"


def test_stop_keeps_a_log_the_caller_chose(endpoint, batchcast_bin, tmp_path):
    # Only the temporary log serve() made is the Server's to remove: a path the caller passed
    # (a file to keep, or /dev/null, which a root test run once deleted this way) stays.
    log = tmp_path / "server.log"
    argv = [batchcast_bin, "serve"] + batchcast.server.serve_args(
        None, endpoint, 8, synthetic=16, sample_bytes=SAMPLE_BYTES, epochs=0)
    server = batchcast.server.Server(argv, endpoint, str(log))
    server.wait_ready(30)
    server.stop()
    assert log.exists() and "serving on" in log.read_text()


def test_ctrl_c_interrupts_a_blocked_next_quickly(endpoint, batchcast_bin, run_py):
    # min_consumers=2 with one consumer: the stream never starts, next() blocks.
    with serve(endpoint, min_consumers=2):
        code = textwrap.dedent("""
            import signal, sys, time, batchcast
            # As in a terminal: a run started in the background of a non-interactive shell (a CI
            # runner, nohup ... &) inherits SIGINT ignored, and Python then installs no handler.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            loader = batchcast.Loader(sys.argv[1], timeout=60)
            try:
                print("ready", flush=True)  # inside the try: a loaded machine may deliver the
                next(iter(loader))          # signal before next() is entered
            except KeyboardInterrupt:
                print("interrupted", flush=True)
                loader.close()
        """)
        p = run_py(code, endpoint)
        assert p.stdout.readline().strip() == b"ready"
        time.sleep(0.3)
        start = time.monotonic()
        p.send_signal(signal.SIGINT)
        line = p.stdout.readline().strip()
        elapsed = time.monotonic() - start
        assert line == b"interrupted", (p.wait(10), p.stderr.read().decode())
        # Checked every 50 ms; the bound only separates "interrupted" from "waited for the
        # Loader's 60 s timeout", with room for a loaded CI machine.
        assert elapsed < 5.0
        assert p.wait(10) == 0


def test_timeout_and_bad_arguments(endpoint):
    with pytest.raises(batchcast.TimeoutError, match="no batchcast server answered"):
        batchcast.Loader(endpoint, timeout=0.3)
    with pytest.raises(ValueError, match="late_join"):
        batchcast.Loader(endpoint, late_join="later", timeout=0.3)
    assert issubclass(batchcast.TimeoutError, TimeoutError)
    assert issubclass(batchcast.ServerGoneError, batchcast.BatchcastError)
    assert issubclass(batchcast.BatchcastError, RuntimeError)


# --- Positions: late join by regeneration, resume (docs/stream.md, "Positions") ---------------


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


def test_without_a_timeout_a_dead_server_still_raises_server_gone(endpoint, batchcast_bin):
    # min_consumers=2 and one Loader: nothing flows, as at a long epoch boundary. timeout=0
    # waits for as long as the server lives, and no longer.
    server = serve(endpoint, samples=100, epochs=0, ring=4, min_consumers=2)
    try:
        loader = batchcast.Loader(endpoint, batch_size=8, timeout=0)
        errors: List[BaseException] = []
        started = threading.Event()

        def wait_for_data() -> None:
            started.set()
            try:
                next(iter(loader))
            except BaseException as e:  # noqa: B036 - recorded for the assertion
                errors.append(e)

        waiter = threading.Thread(target=wait_for_data)
        waiter.start()
        started.wait(10)
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
        waiter.join(10)
        assert not waiter.is_alive(), "a dead server left the Loader waiting"
        assert len(errors) == 1 and isinstance(errors[0], batchcast.ServerGoneError), errors
        loader.close()
    finally:
        server.stop()
        remove_killed_server_files(endpoint)


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
