"""The drop-in's memory budget (docs/memory.md): ``DataLoader(share=, share_memory=...)`` sizes
the stream's ring, and without it the ring never holds more than an epoch behind the producer's
lead. Real share producers over a real JPEG folder; the producer's log says what it reserved.

Run: .venv/bin/python -m pytest tests/python/test_share_memory.py
"""

from __future__ import annotations

import re

import pytest

import batchcast
from batchcast.dataloader import share_paths
from test_dataloader import new_key  # noqa: F401 (a fixture)
from test_share_joins import CHUNK, SAMPLES, folder, images  # noqa: F401 (folder: a fixture)
from test_share_logs import logged

LEAD = 8  # server/serve/ring_size.h, kRingLeadChunks


def ring_slots(folder: str, key: str, **kw) -> int:
    """The ring slots of a stream started by a DataLoader(share=key, **kw), from its log."""
    loader = batchcast.DataLoader(images(folder), batch_size=CHUNK, shuffle=True, share=key,
                                  **kw)
    try:
        assert sum(len(y) for _, y in loader) == SAMPLES
        log = share_paths(key)["log"]
        assert logged(log, "ring: ")
        with open(log) as f:
            return int(re.search(r"ring: (\d+) slots", f.read()).group(1))
    finally:
        loader.close()


def test_the_ring_holds_an_epoch_and_the_lead_or_what_share_memory_buys(folder, new_key,
                                                                          monkeypatch):
    monkeypatch.setenv("BATCHCAST_KEEP_SHARE_LOG", "1")  # read while the producer runs
    epoch_chunks = -(-SAMPLES // CHUNK)
    assert ring_slots(folder, new_key()) == epoch_chunks + LEAD
    # 1 KiB buys less than a slot: the floor of 8 slots, below the 13 an epoch and the lead take.
    assert ring_slots(folder, new_key(), share_memory="1KiB") == 8
    assert ring_slots(folder, new_key(), share_memory=1 << 30) == epoch_chunks + LEAD
    # Inside a sweep, its --share-memory (the environment it gives its trials) is the default.
    monkeypatch.setenv("BATCHCAST_SHARE_MEMORY", "1024")
    assert ring_slots(folder, new_key()) == 8


def test_a_bad_share_memory_is_refused_naming_it(folder):
    with pytest.raises(ValueError, match=r"share_memory='lots': a positive number of bytes"):
        batchcast.DataLoader(images(folder), batch_size=CHUNK, share="never-started",
                             share_memory="lots")
    with pytest.raises(ValueError, match="share_memory= sizes a share=KEY stream"):
        batchcast.DataLoader(images(folder), batch_size=CHUNK, share_memory="1GiB")
