"""batchcast.DataLoader: plain torch without share; with share=KEY one detached producer.

Run: .venv/bin/python -m pytest tests/python/test_dataloader.py
"""

from __future__ import annotations

import os
import textwrap
import time
import uuid

import torch

import batchcast
from conftest import watch_endpoint

TRAINER = textwrap.dedent(
    """
    import sys, time, torch, batchcast
    from torch.utils.data import Dataset

    class Numbers(Dataset):
        def __len__(self):
            return 40
        def __getitem__(self, i):
            return torch.full((4,), float(i)), i

    if __name__ == "__main__":
        key, epochs = sys.argv[1], int(sys.argv[2])
        loader = batchcast.DataLoader(Numbers(), batch_size=6, shuffle=True, num_workers=1,
                                      share=key)
        print("len", len(loader), flush=True)
        for epoch in range(epochs):
            labels = []
            for x, y in loader:
                assert torch.equal(x[:, 0].long(), y)
                labels += y.tolist()
                time.sleep(0.01)
            print("epoch", sorted(labels) == list(range(40)), flush=True)
        loader.close()
    """
)


def test_without_share_it_is_torch():
    loader = batchcast.DataLoader(list(range(10)), batch_size=4, drop_last=True)
    assert type(loader) is torch.utils.data.DataLoader
    assert len(loader) == 2


def test_share_two_processes_whole_epochs_and_producer_exits(tmp_path, run_py):
    key = f"test-{uuid.uuid4().hex[:8]}"
    paths = batchcast.dataloader.share_paths(key)
    watch_endpoint(paths["endpoint"])
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    first = run_py(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')",
                   key, "1")
    time.sleep(1.0)
    second = run_py(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')",
                    key, "3")
    out1, err1 = first.communicate(timeout=30)
    out2, err2 = second.communicate(timeout=30)
    assert first.returncode == 0, err1.decode()
    assert second.returncode == 0, err2.decode()
    assert out1.decode().split("\n")[:2] == ["len 7", "epoch True"]
    assert out2.decode().split("\n")[:4] == ["len 7", "epoch True", "epoch True", "epoch True"]
    deadline = time.monotonic() + 10  # the producer exits after its grace period
    while os.path.exists(paths["state"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(paths["state"]) and not os.path.exists(paths["lock"])
    os.unlink(paths["log"])


def test_shared_len_follows_torch_with_drop_last():
    data = list(range(10))
    for drop_last in (False, True):
        shared = batchcast.DataLoader(data, batch_size=4, drop_last=drop_last, share="unused")
        plain = torch.utils.data.DataLoader(data, batch_size=4, drop_last=drop_last)
        assert len(shared) == len(plain)  # no producer is started before iterating
        shared.close()
