"""Every exit path of every process that owns a pool leaves no segment and no socket file, and
a trainer learns why a server failed or what it is waiting for.

Owners and their exits (python/batchcast/producer.py, _exit_guard.py, _share_producer.py,
server/serve/serve.cpp):
- ``batchcast serve``: normal end, SIGINT, SIGTERM, SIGHUP (exit 0), stream failure (exit 1
  after --fail-linger; the failure is recorded in ``<socket path>.failed``);
- ``batchcast.Producer``: normal end, exception in the iterable (Loaders get it), SIGTERM
  (exit 143), SIGHUP (129), SIGINT (KeyboardInterrupt);
- the share producer of ``DataLoader(share=)``: last trainer leaves, SIGTERM, SIGHUP.
SIGKILL cannot be caught: the promise (docs/safety.md) is that the next server on the endpoint
removes what was left; test_faults_churn.py checks it.

Run: .venv/bin/python -m pytest tests/python/test_faults.py
"""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import textwrap
import time
import uuid

import pytest

import batchcast
from batchcast.dataloader import share_paths
from conftest import segment_of, watch_endpoint

# A Producer serving until stopped. SIGHUP and SIGINT get their default actions first, as in a
# terminal: a test runner may have started us with them ignored, and ignored stays ignored.
PRODUCER = textwrap.dedent(
    """
    import signal, sys, torch, batchcast
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    class Failing:
        def __iter__(self):
            for i in range(3):
                yield torch.full((4, 8), float(i))
            raise RuntimeError("sample 12 is unreadable")

    endpoint, mode = sys.argv[1], sys.argv[2]
    if mode == "fail":
        batchcast.Producer(Failing(), endpoint, ring=2, fail_linger=float(sys.argv[3])).run(1)
    else:
        data = [torch.full((4, 8), float(i)) for i in range(4)]
        batchcast.Producer(data, endpoint, ring=2).run(1 if mode == "once" else None)
    """
)


def leftovers(endpoint: str) -> list:
    return [p for p in (segment_of(endpoint), endpoint[len("ipc://"):]) if os.path.exists(p)]


def wait_gone(pid: int, timeout: float) -> bool:
    """True once `pid` (not our child) no longer exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def serve_argv(binary: str, endpoint: str, *extra: str) -> list:
    return [binary, "serve", "--endpoint", endpoint, "--synthetic", "64", "--sample-bytes", "16",
            "--batch-size", "8", "--ring", "2", "--workers", "1", *extra]


# -- batchcast serve ---------------------------------------------------------------------------


def test_serve_normal_end_leaves_nothing(endpoint, batchcast_bin):
    with batchcast.serve(synthetic=64, sample_bytes=16, endpoint=endpoint, batch_size=8,
                         ring=2, workers=1, binary=batchcast_bin) as server:
        with batchcast.Loader(endpoint, timeout=60) as loader:
            assert sum(len(b[0]) for b in loader) == 64
        assert server.wait(60) == 0, server.log_tail()
    assert leftovers(endpoint) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_serve_stops_cleanly_on_a_signal(endpoint, batchcast_bin, signum):
    with batchcast.serve(synthetic=64, sample_bytes=16, endpoint=endpoint, batch_size=8,
                         ring=2, workers=1, epochs=None, binary=batchcast_bin) as server:
        with batchcast.Loader(endpoint, timeout=60) as loader:
            next(iter(loader))  # serving
            server.process.send_signal(signum)
            assert server.wait(60) == 0, server.log_tail()
    assert leftovers(endpoint) == []


@pytest.fixture
def truncated_first(tmp_path):
    """An ImageFolder whose first file (in order) is a truncated JPEG."""
    from PIL import Image

    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    for i in range(1, 6):
        Image.new("RGB", (40, 30), (i * 40, 80, 120)).save(root / "a" / f"{i:03d}.jpg")
    whole = (root / "a" / "001.jpg").read_bytes()
    (root / "a" / "000.jpg").write_bytes(whole[: len(whole) // 2])
    return str(root)


def image_argv(binary, endpoint, data, linger):
    return [binary, "serve", "--endpoint", endpoint, "--data", data, "--no-shuffle",
            "--batch-size", "2", "--image-size", "16", "--ring", "2", "--workers", "1",
            "--fail-linger", str(linger)]


def test_trainer_attaching_to_a_failed_server_learns_why(endpoint, batchcast_bin,
                                                         truncated_first):
    config = batchcast.server.serve_config(
        truncated_first, endpoint, 2, shuffle=False, image_size=16, ring=2, workers=1,
        fail_linger=600)
    server = batchcast.server.launch(config, log="/dev/null", ready_timeout=None,
                                     binary=batchcast_bin)
    try:
        start = time.monotonic()
        # Told at the welcome or by the record (whichever comes first): both name the file.
        with pytest.raises(batchcast.BatchcastError, match=r"^server failed: .*000\.jpg"):
            with batchcast.Loader(endpoint, timeout=60) as loader:
                next(iter(loader))
        assert time.monotonic() - start < 30  # the server fails at its first file
        assert server.process.poll() is None, "the server lingers with its error"
    finally:
        rc = server.stop()
    assert rc == 1, "a failed stream exits 1 even when a signal ends the linger"
    assert leftovers(endpoint) == []


def test_trainer_after_a_failed_server_exited_learns_why(endpoint, batchcast_bin,
                                                         truncated_first):
    done = subprocess.run(image_argv(batchcast_bin, endpoint, truncated_first, 0),
                          capture_output=True, timeout=120)
    assert done.returncode == 1, done.stderr.decode()
    assert leftovers(endpoint) == []
    record = endpoint[len("ipc://"):] + ".failed"
    assert stat.S_IMODE(os.stat(record).st_mode) == 0o600
    start = time.monotonic()
    with pytest.raises(batchcast.BatchcastError,
                       match=r"^server failed: .*000\.jpg: ") as info:
        batchcast.Loader(endpoint, timeout=60)
    assert time.monotonic() - start < 5
    assert record in str(info.value)
    # The next server on the endpoint clears the record: its trainers are not told of it.
    with batchcast.serve(synthetic=16, sample_bytes=16, endpoint=endpoint, batch_size=8,
                         ring=2, workers=1, binary=batchcast_bin):
        assert not os.path.exists(record)
        with batchcast.Loader(endpoint, timeout=60) as loader:
            assert sum(len(b[0]) for b in loader) == 16


SERVE_PARENT = textwrap.dedent(
    """
    import signal, sys, time, batchcast
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    endpoint, how = sys.argv[1], sys.argv[2]
    server = batchcast.serve(synthetic=64, sample_bytes=16, endpoint=endpoint, batch_size=8,
                             ring=2, workers=1, epochs=None)
    print(server.pid, flush=True)
    if how == "signal":
        with server:
            while True:
                time.sleep(0.1)  # where a signal's SystemExit unwinds the with block
    # how == "exit": the interpreter exits with the server still running
    """
)


@pytest.mark.parametrize("how, rc", [("signal", 128 + signal.SIGTERM), ("exit", 0)])
def test_serve_context_stops_its_server_when_the_parent_ends(endpoint, run_py, how, rc):
    parent = run_py(SERVE_PARENT, endpoint, how)
    child = int(parent.stdout.readline())
    if how == "signal":
        parent.send_signal(signal.SIGTERM)
    assert parent.wait(60) == rc, parent.stderr.read().decode()
    assert wait_gone(child, 60)
    assert leftovers(endpoint) == []


@pytest.mark.skipif(os.getuid() != 0, reason="making a file of another user needs root")
def test_a_failure_record_of_another_user_is_ignored(endpoint):
    record = endpoint[len("ipc://"):] + ".failed"
    with open(record, "w") as f:
        f.write("forged")
    os.chown(record, 12345, 12345)
    with pytest.raises(batchcast.TimeoutError, match="^no server yet: "):
        batchcast.Loader(endpoint, timeout=0.5)


# -- the waiting trainer -----------------------------------------------------------------------


def test_a_waiting_trainer_says_so_and_then_no_server_yet(endpoint, caplog):
    caplog.set_level(logging.WARNING, logger="batchcast")  # Python's default level shows it
    with pytest.raises(batchcast.TimeoutError, match="^no server yet: "):
        batchcast.Loader(endpoint, timeout=4)
    waiting = [r for r in caplog.records
               if r.name == "batchcast" and "waiting for a batchcast server at" in r.getMessage()]
    assert waiting and endpoint in waiting[0].getMessage()
    assert waiting[0].levelno == logging.WARNING
    assert "nothing answers there" in waiting[0].getMessage()


# -- batchcast.Producer ------------------------------------------------------------------------


def start_producer(run_py, endpoint, mode="forever", *args):
    """A Producer process, serving (a Loader got a batch) by the time this returns."""
    p = run_py(PRODUCER, endpoint, mode, *args)
    loader = batchcast.Loader(endpoint, timeout=60)
    next(iter(loader))
    return p, loader


def test_producer_normal_end_leaves_nothing(endpoint, run_py):
    p, loader = start_producer(run_py, endpoint, "once")
    # The first iteration broke after a batch: the next one asks for epoch 1, never served.
    with pytest.raises(batchcast.PositionUnavailableError, match="epoch 1 will never be served"):
        for _ in loader:
            pass
    loader.close()
    assert p.wait(60) == 0, p.stderr.read().decode()
    assert leftovers(endpoint) == []


@pytest.mark.parametrize("signum, rc", [(signal.SIGTERM, 128 + signal.SIGTERM),
                                        (signal.SIGHUP, 128 + signal.SIGHUP),
                                        (signal.SIGINT, None)])
def test_producer_releases_its_pool_on_a_signal(endpoint, run_py, signum, rc):
    p, loader = start_producer(run_py, endpoint)
    p.send_signal(signum)
    code = p.wait(60)
    err = p.stderr.read().decode()
    if rc is None:
        assert "KeyboardInterrupt" in err, err
    else:
        assert code == rc, err
    assert leftovers(endpoint) == []
    with pytest.raises(batchcast.ServerGoneError, match="^server gone: "):
        for _ in loader:
            pass
    loader.close()


def test_producer_fails_the_stream_when_its_iterable_raises(endpoint, run_py):
    p = run_py(PRODUCER, endpoint, "fail", "600")
    with pytest.raises(batchcast.BatchcastError,
                       match="^server failed: RuntimeError: sample 12 is unreadable"):
        with batchcast.Loader(endpoint, timeout=60) as loader:
            for _ in loader:
                pass
    # It lingers; a trainer attaching now is told too.
    with pytest.raises(batchcast.BatchcastError, match="^server failed: RuntimeError"):
        with batchcast.Loader(endpoint, timeout=60) as late:
            next(iter(late))
    assert p.poll() is None
    p.send_signal(signal.SIGTERM)  # ends the linger
    assert p.wait(60) == 128 + signal.SIGTERM
    assert leftovers(endpoint) == []


def test_producer_exception_exits_after_the_linger(endpoint, run_py):
    p = run_py(PRODUCER, endpoint, "fail", "0.2")
    assert p.wait(60) == 1
    assert "sample 12 is unreadable" in p.stderr.read().decode()
    assert leftovers(endpoint) == []
    with pytest.raises(batchcast.BatchcastError, match="^server failed: RuntimeError: sample 12"):
        batchcast.Loader(endpoint, timeout=60)


# -- the share producer ------------------------------------------------------------------------


@pytest.fixture
def share():
    key = f"test-faults-{uuid.uuid4().hex[:8]}"
    paths = share_paths(key)
    watch_endpoint(paths["endpoint"])
    yield key, paths
    for name in ("lock", "state", "log"):
        try:
            os.unlink(paths[name])
        except FileNotFoundError:
            pass


def share_files(paths) -> list:
    return [paths[n] for n in ("socket", "lock", "state") if os.path.exists(paths[n])]


def start_share(key, paths):
    loader = batchcast.DataLoader(list(range(40)), batch_size=4, share=key)
    it = iter(loader)
    next(it)  # the producer serves
    with open(paths["state"]) as f:
        pid = int(json.load(f)["pid"])
    return loader, it, pid


def test_share_producer_exits_when_the_last_trainer_leaves(share, run_py):
    key, paths = share
    trainer = run_py(textwrap.dedent("""
        import json, sys, batchcast
        loader = batchcast.DataLoader(list(range(40)), batch_size=4, share=sys.argv[1])
        next(iter(loader))
        with open(loader.paths["state"]) as f:
            print(json.load(f)["pid"], flush=True)
    """), key)
    pid = int(trainer.stdout.readline())
    assert trainer.wait(60) == 0, trainer.stderr.read().decode()
    assert wait_gone(pid, 60)
    assert leftovers(paths["endpoint"]) == [] and share_files(paths) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_share_producer_stops_cleanly_on_a_signal(share, signum):
    key, paths = share
    loader, it, pid = start_share(key, paths)
    os.kill(pid, signum)
    assert wait_gone(pid, 60)
    assert leftovers(paths["endpoint"]) == [] and share_files(paths) == []
    with pytest.raises(batchcast.ServerGoneError):
        for _ in it:
            pass
    loader.close()

