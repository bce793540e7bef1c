"""Where a share producer logs, and which logs stay (README.md, _share_producer.py):
``/tmp/batchcast-<uid>-<key>.log``, removed when the producer exits because nobody reads it any
more, kept (and named in the error the trainer sees) when it failed or was stopped.

Run: .venv/bin/python -m pytest tests/python/test_share_logs.py
Datasets live at module level: the share producer unpickles them by importing this module.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch
from torch.utils.data import Dataset

import batchcast
from batchcast.dataloader import share_paths
from test_dataloader import Numbers, new_key  # noqa: F401 (new_key: a fixture)
from test_faults import wait_gone

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class BrokenAt(Dataset):
    """Sample 7 raises, as a corrupt file would."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int):
        if i == 7:
            raise RuntimeError("sample 7 is broken")
        return torch.full((2,), float(i)), i


def logged(path: str, text: str, timeout: float = 30) -> bool:
    """Whether ``text`` is (or comes within ``timeout`` s) in the log at ``path``: the trainer
    may hear of a failure before the producer has written it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path) as f:
            if text in f.read():
                return True
        time.sleep(0.05)
    return False


def producer_pid(paths) -> int:
    with open(paths["state"]) as f:
        return int(json.load(f)["pid"])


def test_the_readme_says_where_a_share_producer_logs():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert "`/tmp/batchcast-<uid>-<key>.log`" in readme
    assert share_paths("k")["log"] == f"/tmp/batchcast-{os.getuid()}-k.log"


def test_a_producer_that_exits_cleanly_removes_its_log(new_key):
    key = new_key()
    paths = share_paths(key)
    loader = batchcast.DataLoader(Numbers(), batch_size=4, shuffle=True, share=key)
    assert sorted(y for _, b in loader for y in b.tolist()) == list(range(40))
    pid = producer_pid(paths)
    assert os.path.exists(paths["log"])  # while it serves
    loader.close()
    assert wait_gone(pid, 30)
    assert not os.path.exists(paths["log"])


def test_a_failed_producer_keeps_its_log_and_the_trainers_error_names_it(new_key):
    key = new_key()
    paths = share_paths(key)
    loader = batchcast.DataLoader(BrokenAt(), batch_size=4, share=key)
    with pytest.raises(batchcast.BatchcastError) as e:
        list(loader)
    assert "sample 7 is broken" in str(e.value)
    assert f"the share producer's log is kept: {paths['log']}" in str(e.value)
    loader.close()
    assert logged(paths["log"], "RuntimeError: sample 7 is broken")


def test_a_producer_stopped_by_a_signal_keeps_its_log_and_the_trainers_error_names_it(new_key):
    key = new_key()
    paths = share_paths(key)
    loader = batchcast.DataLoader(Numbers(), batch_size=4, share=key)
    batches = iter(loader)
    next(batches)
    pid = producer_pid(paths)
    os.kill(pid, signal.SIGTERM)
    assert wait_gone(pid, 30)
    with pytest.raises(batchcast.ServerGoneError) as e:
        list(batches)
    assert f"the share producer's log is kept: {paths['log']}" in str(e.value)
    assert logged(paths["log"], "signal 15, stopping")
    loader.close()
