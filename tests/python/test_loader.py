"""batchcast.Loader against real `batchcast serve --synthetic` servers: batch sizes, waiting and
its log, len, kept batches and held slots, in-place writes, NumPy through DLPack, a killed or
stopped server, Ctrl-C, timeouts and bad arguments (positions: test_loader_positions.py).

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
from loader_common import SAMPLE_BYTES, serve


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
    config = batchcast.server.serve_config(None, endpoint, 8, synthetic=16,
                                           sample_bytes=SAMPLE_BYTES, epochs=0)
    server = batchcast.server.launch(config, log=str(log), binary=batchcast_bin)
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
