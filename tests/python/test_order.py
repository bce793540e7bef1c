"""The order a consumer reads in (docs/stream.md, "Order"): Loader(order=), DataLoader(
share_order=) and serve's order, against real servers and a real share producer. What is
checked holds in either order: the choice reaches the consumer's settings (its Hello carries
it: tests/cpp/client/session_test.cpp), and every epoch is every sample exactly once.

Run: .venv/bin/python -m pytest tests/python/test_order.py
Datasets live at module level: the share producer unpickles them by importing this module.
"""

from __future__ import annotations

import os
import uuid

import pytest
import torch
from torch.utils.data import Dataset

import batchcast
from batchcast import _batchcast
from batchcast.dataloader import share_paths
from conftest import synthetic_rows, watch_endpoint
from loader_common import SAMPLE_BYTES, serve


class Numbers(Dataset):
    """Sample i is (a row of i, label i)."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        return torch.full((4,), float(i)), i


def epoch_labels(loader, payload) -> list:
    """The sorted labels of one epoch, each batch's payload checked against its labels."""
    labels = []
    for x, y in loader:
        assert torch.equal(x, payload(y)), "payload does not match its label"
        labels += y.tolist()
    return sorted(labels)


def synthetic(y: torch.Tensor) -> torch.Tensor:
    return synthetic_rows(y, SAMPLE_BYTES)


def numbers(y: torch.Tensor) -> torch.Tensor:
    return y.float()[:, None].expand(-1, 4)


def test_a_bad_order_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="^order: 'sideways' is not one of exact, relaxed$"):
        batchcast.Loader("ipc:///tmp/batchcast-test-never.sock", order="sideways")
    with pytest.raises(ValueError,
                       match="^share_order: 'sideways' is not one of exact, relaxed$"):
        batchcast.DataLoader(Numbers(), batch_size=4, share="unused", share_order="sideways")
    with pytest.raises(ValueError, match="share_order= is the order a share=KEY trainer"):
        batchcast.DataLoader(Numbers(), batch_size=4, share_order="relaxed")
    with pytest.raises(ValueError,
                       match="^BATCHCAST_SHARE_ORDER: 'any' is not one of exact, relaxed$"):
        os.environ["BATCHCAST_SHARE_ORDER"] = "any"
        try:
            batchcast.DataLoader(Numbers(), batch_size=4, share="unused")
        finally:
            del os.environ["BATCHCAST_SHARE_ORDER"]
    with pytest.raises(_batchcast.BatchcastError, match=r"--order: sideways not in \{exact,"):
        _batchcast.ServeConfig(order="sideways")  # serve --order: no "server"
    with pytest.raises(_batchcast.BatchcastError, match=r"order='any' not in \{exact,relaxed,"):
        _batchcast.ConsumerOptions(order="any")


def test_loaders_of_each_order_read_every_sample_once_an_epoch(endpoint):
    orders = (None, "exact", "relaxed")
    with serve(endpoint, samples=100, batch=16, epochs=2, min_consumers=3,
               order="relaxed") as server:
        loaders = [batchcast.Loader(endpoint, batch_size=10, timeout=30, order=o)
                   for o in orders]
        assert [l._options.order for l in loaders] == ["server", "exact", "relaxed"]
        for _ in range(2):  # in lockstep: min_consumers holds the start for all three
            for loader in loaders:
                assert epoch_labels(loader, synthetic) == list(range(100))
        for loader in loaders:
            loader.close()
        assert server.wait(20) == 0


@pytest.mark.parametrize("share_order,env,read", [
    ("relaxed", None, "relaxed"),
    (None, "relaxed", "relaxed"),  # batchcast sweep --order, for loaders that give none
    ("exact", "relaxed", "exact"),
    (None, None, "server"),
])
def test_a_share_trainer_reads_in_its_share_order(share_order, env, read, monkeypatch):
    if env is None:
        monkeypatch.delenv("BATCHCAST_SHARE_ORDER", raising=False)
    else:
        monkeypatch.setenv("BATCHCAST_SHARE_ORDER", env)
    key = f"test-{uuid.uuid4().hex[:8]}"
    watch_endpoint(share_paths(key)["endpoint"])
    loader = batchcast.DataLoader(Numbers(), batch_size=4, shuffle=True, timeout=30, share=key,
                                  share_order=share_order)
    try:
        assert epoch_labels(loader, numbers) == list(range(40))
        assert loader._stream._loader._options.order == read
    finally:
        loader.close()
        for name in ("lock", "state", "log"):
            try:
                os.unlink(share_paths(key)[name])
            except FileNotFoundError:
                pass
