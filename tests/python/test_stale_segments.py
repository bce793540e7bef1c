"""A server killed with SIGKILL leaves its pool segment in /dev/shm; the next batchcast process
that looks removes it (docs/memory.md, "Segments of a dead server"): a trainer's Loader as it
attaches (even to an endpoint where nothing answers) and as it closes, not only the next server
on the same endpoint."""

import os
import signal
import time

import pytest

import batchcast
from batchcast import _batchcast
from batchcast.server import launch, serve_config
from conftest import segment_of


def _killed_server(endpoint):
    server = launch(serve_config(endpoint=endpoint, batch_size=4, epochs=None, synthetic=64,
                                 sample_bytes=64, workers=1))
    segment = segment_of(endpoint)
    assert os.path.exists(segment)
    os.kill(server.pid, signal.SIGKILL)
    server.process.wait()
    server.stop()  # the guard and the log; the process is gone already
    assert os.path.exists(segment), "SIGKILL leaves the segment (nothing ran in the server)"
    return segment


def test_a_trainer_attaching_anywhere_removes_a_dead_servers_segment(tmp_path):
    segment = _killed_server(f"ipc://{tmp_path}/dead.sock")
    with pytest.raises(_batchcast.TimeoutError):
        batchcast.Loader(f"ipc://{tmp_path}/nobody.sock", timeout=0.5)
    assert not os.path.exists(segment)


def test_a_trainer_leaving_removes_a_dead_servers_segment(tmp_path):
    live = f"ipc://{tmp_path}/live.sock"
    with launch(serve_config(endpoint=live, batch_size=4, epochs=None, synthetic=64,
                             sample_bytes=64, workers=1)) as server:
        loader = batchcast.Loader(live, timeout=30)
        next(iter(loader))
        segment = _killed_server(f"ipc://{tmp_path}/dead.sock")  # dies while the Loader reads
        loader.close()
        assert not os.path.exists(segment)
        assert os.path.exists(segment_of(live)), "a live server's segment stays"
        server.stop()
    deadline = time.monotonic() + 10
    while os.path.exists(segment_of(live)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(segment_of(live))
