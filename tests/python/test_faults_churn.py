"""Churn of Python-side servers: Producers and share producers started, read from, and ended by
SIGTERM or SIGKILL at random, on one endpoint each (the C++ soak test churns consumers of the
native server: tests/cpp/hardening/soak_test.cpp).

What a user relies on (docs/safety.md): after SIGTERM nothing of the server is left in /dev/shm
or /tmp; after SIGKILL the next server on the same endpoint (or share key) removes what was
left, so at the end, after one last clean stop, nothing is left either; a reading trainer gets
"server gone" in both cases, never a hang.

Knobs (environment): BATCHCAST_CHURN_ROUNDS (default 8), BATCHCAST_CHURN_SEED (default: random;
printed, rerun with it to replay the same schedule).

Run: .venv/bin/python -m pytest tests/python/test_faults_churn.py
"""

from __future__ import annotations

import json
import os
import random
import signal
import uuid

import pytest

import batchcast
from batchcast.dataloader import share_paths
from conftest import watch_endpoint
from test_faults import PRODUCER, leftovers, share_files, wait_gone


def batches(loader):
    """Every batch of every epoch."""
    while True:
        yield from loader


def read_until_gone(iterator, limit: int) -> None:
    with pytest.raises(batchcast.ServerGoneError, match="^server gone: "):
        for _ in range(limit):
            next(iterator)


def test_python_servers_churn_under_sigterm_and_sigkill(run_py):
    rounds = int(os.environ.get("BATCHCAST_CHURN_ROUNDS", "8"))
    seed = int(os.environ.get("BATCHCAST_CHURN_SEED", random.randrange(2**32)))
    print(f"churn: seed={seed} rounds={rounds} (replay: BATCHCAST_CHURN_SEED={seed})")
    rng = random.Random(seed)
    endpoint = watch_endpoint(f"ipc:///tmp/batchcast-test-churn-{uuid.uuid4().hex[:12]}.sock")
    key = f"test-churn-{uuid.uuid4().hex[:8]}"
    paths = share_paths(key)
    watch_endpoint(paths["endpoint"])
    try:
        for round_ in range(rounds):
            kind = rng.choice(["producer", "share"])
            signum = rng.choice([signal.SIGTERM, signal.SIGKILL])
            where = f"round {round_} ({kind}, {signal.Signals(signum).name}, seed {seed})"
            if kind == "producer":
                p = run_py(PRODUCER, endpoint, "forever")
                with batchcast.Loader(endpoint, timeout=60) as loader:
                    it = batches(loader)
                    for _ in range(rng.randint(1, 5)):
                        next(it)
                    p.send_signal(signum)
                    p.wait(60)
                    read_until_gone(it, 10_000)
                if signum == signal.SIGTERM:
                    assert leftovers(endpoint) == [], where
            else:
                loader = batchcast.DataLoader(list(range(40)), batch_size=4, share=key)
                it = batches(loader)
                for _ in range(rng.randint(1, 5)):
                    next(it)
                with open(paths["state"]) as f:
                    pid = int(json.load(f)["pid"])
                os.kill(pid, signum)
                assert wait_gone(pid, 60), where
                read_until_gone(it, 10_000)
                loader.close()
                if signum == signal.SIGTERM:
                    assert leftovers(paths["endpoint"]) == [] and share_files(paths) == [], where
        # One last server on each endpoint, stopped cleanly, removes whatever SIGKILL left.
        p = run_py(PRODUCER, endpoint, "forever")
        with batchcast.Loader(endpoint, timeout=60) as loader:
            next(iter(loader))
            p.send_signal(signal.SIGTERM)
            assert p.wait(60) == 128 + signal.SIGTERM
        loader = batchcast.DataLoader(list(range(40)), batch_size=4, share=key)
        next(iter(loader))
        with open(paths["state"]) as f:
            pid = int(json.load(f)["pid"])
        os.kill(pid, signal.SIGTERM)
        assert wait_gone(pid, 60)
        loader.close()
        assert leftovers(endpoint) == [] and leftovers(paths["endpoint"]) == []
        assert share_files(paths) == []
    finally:
        for path in (paths["lock"], paths["state"], paths["log"]):
            if os.path.exists(path):
                os.unlink(path)
