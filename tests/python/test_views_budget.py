"""One memory budget for a stream and its views (docs/memory.md, "A view added later"): a real
`batchcast serve` with a ring sized by --ring-memory, Loaders joining with two more views, and
the stream's pools in /dev/shm (allocated blocks, as the kernel counts them) within the budget.

Run: .venv/bin/python -m pytest tests/python/test_views_budget.py
"""

from __future__ import annotations

import glob
import os
import struct
import threading
import time
from typing import List

import batchcast
from conftest import segment_of
from views_common import CLASSES, PER_CLASS, check_view, folder, in_threads, read  # noqa: F401
from views_common import transform

BATCH = 2  # 11 chunks an epoch: a ring of 12 slots fits the epoch and the producer's lead
VIEWS = ["size=16", "size=24"]


def slot_bytes(pool: str) -> int:
    """A pool's slot size, from its header (shm/slot_pool.h: PoolHeader)."""
    with open(pool, "rb") as f:
        _, _, _, _, _, size, _ = struct.unpack("<QIIIIQQ", f.read(40))
    return size


def allocated(endpoint: str) -> int:
    """Bytes of /dev/shm the server's pools (view 0's and every view's) take now."""
    total = 0
    for path in glob.glob(segment_of(endpoint) + "*"):
        try:
            total += os.stat(path).st_blocks * 512
        except FileNotFoundError:
            pass
    return total


def serve(folder: str, endpoint: str, **kw):
    return batchcast.serve(folder, endpoint, BATCH, transform=transform(), shuffle=False,
                           workers=2, **kw)


def test_views_added_later_share_the_streams_memory_budget(folder, endpoint):
    with serve(folder, endpoint, epochs=1, ring=8):
        own_slot = slot_bytes(segment_of(endpoint))
    budget = 12 * own_slot
    with serve(folder, endpoint, epochs=3, ring_memory=budget) as server:
        own = batchcast.Loader(endpoint, timeout=60)
        it = iter(own)
        head = [next(it), next(it)]  # the ring holds chunks when the views join
        views = [batchcast.Loader(endpoint, view=v, timeout=60) for v in VIEWS]
        samples: List[int] = []
        reading = threading.Event()
        reading.set()

        def sample() -> None:
            while reading.is_set():
                samples.append(allocated(endpoint))
                time.sleep(0.05)

        def rest_of_own() -> List[int]:
            first = sum(len(y) for _, y in head) + sum(len(y) for _, y in it)
            return [first] + [sum(len(y) for _, y in own) for _ in range(2)]

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            work = {"own": rest_of_own}
            work.update({v: (lambda l=l: read(l, 3)) for v, l in zip(VIEWS, views)})
            results = in_threads(work)
        finally:
            reading.clear()
            sampler.join()
        pools = [segment_of(endpoint)] + [f"{segment_of(endpoint)}.v{i}" for i in (1, 2)]
        one_slot_each = sum(slot_bytes(p) for p in pools)
        # The retired slots' memory is given back once their chunks went: the last reading, and
        # a fresh one once the server's loop has passed (each pass frees what went).
        final = allocated(endpoint)
        for _ in range(100):
            if final <= budget + one_slot_each:
                break
            time.sleep(0.05)
            final = allocated(endpoint)
        with open(server.log_path) as f:
            log = f.read()
        own.close()
        for loader in views:
            loader.close()

    assert results["own"] == [CLASSES * PER_CLASS] * 3
    for v in VIEWS:
        check_view(folder, v, results[v])
    assert samples, "the pools were never measured"
    assert final <= budget + one_slot_each, (
        f"the stream's pools take {final} B of /dev/shm, over the budget {budget} B "
        f"plus one slot of each view ({one_slot_each} B); measured {samples}")
    assert "the ring shrank to" in log, log
