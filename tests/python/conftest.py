"""Shared fixtures of the Python tests of the batchcast package (Loader, Producer, DataLoader).

The tests run against the INSTALLED package (scripts/test.sh installs it into a venv and runs
pytest with that venv's python; PYTHONPATH never points at the sources: run_py puts only this
folder on it, so that its scripts can import the helpers below).

- ``endpoint``: a unique ipc endpoint per test.
- ``batchcast_bin``: the native ``batchcast`` program installed in the package
  (batchcast/_bin/batchcast, or $BATCHCAST_BIN); a missing program fails the test.
- ``batchcast_cli``: the ``batchcast`` console script of the running interpreter's
  environment (what a user types).
- ``run_py``: runs a Python snippet in a subprocess of the same interpreter.
- ``synthetic_rows``: the payload ``serve --synthetic`` writes, to check batches against.
- autouse ``no_leaks``: after each test, no batchcast.<uid>.* segment (nor ipc socket file)
  of the test's endpoints is left, and no batchcast process it started is still alive.
  Only the test's own endpoints are checked: other runs on the machine may use batchcast.
  A failure record (``<socket path>.failed``) outlives its server by design: it is removed.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable, Iterator, List

import pytest

_WATCHED: List[str] = []  # endpoints used by the current test


def segment_of(endpoint: str) -> str:
    """The /dev/shm path of a server's pool on `endpoint` (shm/slot_pool.cpp: FNV-1a)."""
    h = 1469598103934665603
    for c in endpoint.encode():
        h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"/dev/shm/batchcast.{os.getuid()}.{h:016x}"


def watch_endpoint(endpoint: str) -> str:
    """Adds `endpoint` to what the leak check looks at (segment and ipc socket file)."""
    _WATCHED.append(endpoint)
    return endpoint


def _leaked_files() -> List[str]:
    # Other processes of this machine (other test runs) may use batchcast too: look only at
    # the endpoints of this test.
    out = []
    for ep in _WATCHED:
        for path in (segment_of(ep), ep[len("ipc://"):] if ep.startswith("ipc://") else None):
            if path and os.path.exists(path):
                out.append(path)
        out += glob.glob(segment_of(ep) + ".v*")  # the pools of its views
    return out


def _our_processes() -> set:
    """Live processes this test may have started: descendants of pytest running batchcast
    code, and the detached share producers of its endpoints (reparented to init, so not
    descendants)."""
    parents: dict = {}
    cmds: dict = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmds[int(entry)] = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != b"Z":
            parents[int(entry)] = int(fields[1])
    me = os.getpid()

    def descends(pid: int) -> bool:
        for _ in range(64):
            pid = parents.get(pid, 0)
            if pid == me:
                return True
            if pid <= 1:
                return False
        return False

    return {
        pid
        for pid in parents
        if pid != me
        and (_is_our_share_producer(cmds.get(pid, b""))
             or (descends(pid) and b"batchcast" in cmds.get(pid, b"")))
    }


def _is_our_share_producer(cmdline: bytes) -> bool:
    """A share producer names its endpoint on its command line: only those of the watched
    endpoints are this test's (other runs on the machine have their own)."""
    return b"batchcast._share_producer" in cmdline and any(
        ep.encode() in cmdline for ep in _WATCHED)


def synthetic_rows(labels: "torch.Tensor", width: int) -> "torch.Tensor":
    """The payload `serve --synthetic` writes for each sample index (server/produce/synthetic_source.h:
    byte j of sample i = synthetic_byte(i, j)), `width` bytes per row, on the labels' device.
    Scripts started by run_py import it too (`from conftest import synthetic_rows`)."""
    import torch

    i = labels.to(torch.int64).unsqueeze(1)
    j = torch.arange(width, device=labels.device, dtype=torch.int64).unsqueeze(0)
    return (((i * 2654435761 + j * 40503 + (i >> 8)) >> 3) & 0xFF).to(torch.uint8)


def photo_like(width: int, height: int, seed: int) -> "np.ndarray":
    """An RGB uint8 (height, width, 3) image of smooth gradients, low-frequency waves and mild
    noise: JPEG-friendly like a photo, deterministic in ``seed``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = []
    for c in range(3):
        fx, fy, phase = rng.uniform(0.005, 0.05, 2).tolist() + [rng.uniform(0, 6.28)]
        wave = 60 * np.sin(x * fx + y * fy + phase) + 40 * np.cos(x * fy * 0.5 - y * fx + c)
        channels.append(128 + wave + 60 * (x / width - y / height) + rng.normal(0, 4, x.shape))
    return np.clip(np.stack(channels, axis=-1), 0, 255).astype(np.uint8)


def in_threads_per_job_and_rank(read: Callable[[str, int], Any], ranks: int = 2,
                                timeout: float = 120) -> dict:
    """Runs read(job, rank) for jobs "A" and "B" and every rank, each in a thread (the ranks of two
    DDP jobs reading one node-wide server); returns {(job, rank): its result}. A reader that
    raised is missing from the result (threading prints its exception)."""
    results: dict = {}

    def run(job: str, rank: int) -> None:
        results[job, rank] = read(job, rank)

    threads = [threading.Thread(target=run, args=(job, rank))
               for job in "AB" for rank in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results


@pytest.fixture
def endpoint() -> str:
    return watch_endpoint(f"ipc:///tmp/batchcast-test-{uuid.uuid4().hex[:12]}.sock")


@pytest.fixture(scope="session")
def batchcast_bin() -> str:
    from batchcast.server import find_binary

    try:
        return find_binary()
    except FileNotFoundError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def batchcast_cli() -> str:
    path = os.path.join(os.path.dirname(sys.executable), "batchcast")
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} missing: run pytest with the python of a venv where batchcast is "
                    "installed (bash scripts/test.sh does)")
    return path


@pytest.fixture
def run_py():
    """Starts `python -c code args...` (the installed package and this conftest importable);
    returns the Popen."""
    started: List[subprocess.Popen] = []
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)

    def start(code: str, *args: str, **kwargs) -> subprocess.Popen:
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        kwargs.setdefault("env", dict(os.environ, PYTHONPATH=path))
        p = subprocess.Popen([sys.executable, "-c", code, *args], **kwargs)
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def _remove_failure_records() -> None:
    for ep in _WATCHED:
        if ep.startswith("ipc://"):
            try:
                os.unlink(ep[len("ipc://"):] + ".failed")
            except FileNotFoundError:
                pass


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    before = _our_processes()
    _WATCHED.clear()
    yield
    _remove_failure_records()
    deadline = time.monotonic() + 5.0  # detached producers exit after a short grace period
    while True:
        leaked_pids = _our_processes() - before
        leaked_files = _leaked_files()
        if not leaked_pids and not leaked_files:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for pid in leaked_pids:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    pytest.fail(f"leaked after the test: processes {sorted(leaked_pids)}, files {leaked_files}")
