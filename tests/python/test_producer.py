"""batchcast.Producer serving Python iterables to batchcast.Loader consumers.

Run: .venv/bin/python -m pytest tests/python/test_producer.py
The Producer runs in a thread of the test process (its native calls release the GIL).
"""

from __future__ import annotations

import threading
from typing import Any, List

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import batchcast


class DictSamples(Dataset):
    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.full((2, 3), float(i)), "label": i, "odd": torch.tensor(i % 2 == 1)}


class Unsized:
    """A re-iterable without __len__: the epoch length is known after the first pass."""

    def __iter__(self):
        for i in range(0, 12, 2):
            yield torch.arange(i, i + 2)


def start(producer: batchcast.Producer, epochs: int) -> threading.Thread:
    result: List[Any] = []
    t = threading.Thread(target=lambda: result.append(producer.run(epochs)), daemon=True)
    t.result = result  # type: ignore[attr-defined]
    t.start()
    return t


def test_dict_batches_of_a_torch_dataloader(endpoint):
    source = DataLoader(DictSamples(), batch_size=8, shuffle=True, num_workers=1)
    producer = batchcast.Producer(source, endpoint)
    thread = start(producer, 2)
    loader = batchcast.Loader(endpoint, batch_size=5, timeout=20)
    assert len(loader) == 6
    for _ in range(2):
        seen = []
        for batch in loader:
            assert set(batch) == {"x", "label", "odd"}
            assert batch["x"].shape[1:] == (2, 3) and batch["odd"].dtype == torch.bool
            assert torch.equal(batch["x"][:, 0, 0].long(), batch["label"])
            assert torch.equal(batch["odd"], batch["label"] % 2 == 1)
            seen += batch["label"].tolist()
        assert sorted(seen) == list(range(30))
    with pytest.raises(batchcast.PositionUnavailableError,
                       match="epoch 2 will never be served: .* served epochs 0 to 1"):
        list(loader)  # an epoch after the last one
    thread.join(10)
    assert thread.result == [True]
    assert producer.stats["samples_published"] == 60
    loader.close()
    producer.close()


def test_len_respects_drop_last_of_the_source(endpoint):
    source = DataLoader(list(range(30)), batch_size=8, drop_last=True)
    producer = batchcast.Producer(source, endpoint)
    thread = start(producer, 1)
    loader = batchcast.Loader(endpoint, batch_size=8, timeout=20)
    assert len(loader) == 3 and len(list(loader)) == 3
    thread.join(10)
    loader.close()
    producer.close()


def test_unsized_iterable_of_bare_tensors(endpoint):
    # ring=2 < 6 batches: the first pass cannot end before the Loader attached.
    producer = batchcast.Producer(Unsized(), endpoint, ring=2)
    thread = start(producer, 2)
    loader = batchcast.Loader(endpoint, batch_size=3, timeout=20)
    with pytest.raises(TypeError, match="unknown"):
        len(loader)
    first = list(loader)
    assert torch.equal(torch.cat(first), torch.arange(12))  # bare tensors, stream order
    second = list(loader)
    assert len(loader) == 4 == len(second)  # known once the first pass ended
    thread.join(10)
    loader.close()
    producer.close()


def test_a_larger_later_batch_names_slot_bytes(endpoint):
    producer = batchcast.Producer([torch.zeros(4, 10), torch.zeros(400, 10)], endpoint)
    with pytest.raises(ValueError, match=r"slot_bytes=16000"):
        producer.run(1)
    producer.close()


def test_bad_batches_are_explained(endpoint):
    with pytest.raises(TypeError, match="not a tensor"):
        batchcast.Producer([(torch.zeros(2), "text")], endpoint).run(1)
    with pytest.raises(batchcast.BatchcastError, match="dimension 0"):
        batchcast.Producer([(torch.zeros(2), torch.zeros(3))], endpoint).run(1)
    with pytest.raises(TypeError, match="re-iterable"):
        batchcast.Producer(iter([torch.zeros(2)]), endpoint)


def test_regenerate_gives_a_loader_joining_mid_epoch_the_whole_epoch(endpoint):
    batches = [(torch.full((2, 3), i, dtype=torch.uint8), torch.arange(2)) for i in range(8)]
    asked: List[Any] = []

    def regenerate(epoch: int, index: int) -> Any:
        asked.append((epoch, index))
        return batches[index]

    producer = batchcast.Producer(batches, endpoint, ring=4, regenerate=regenerate)
    serving = threading.Thread(target=producer.run, kwargs={"epochs": 2})
    serving.start()
    try:
        a = batchcast.Loader(endpoint, timeout=30)
        first = iter(a)
        # a received chunk 4: chunk 0 is gone from the ring of 4, epoch 1's start not there yet
        head = [int(x[0, 0]) for x, _ in (next(first) for _ in range(5))]
        b = batchcast.Loader(endpoint, timeout=30)
        seen = {}

        def read_a() -> None:
            seen["a"] = [head + [int(x[0, 0]) for x, _ in first], [int(x[0, 0]) for x, _ in a]]

        def read_b() -> None:
            seen["b"] = [[int(x[0, 0]) for x, _ in b] for _ in range(2)]

        threads = [threading.Thread(target=read_a), threading.Thread(target=read_b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert seen["b"] == [list(range(8))] * 2, "b got whole epochs from its first batch"
        assert seen["a"] == [list(range(8))] * 2
        assert (0, 0) in asked and producer.stats["chunks_regenerated"] == len(asked)
        a.close()
        b.close()
    finally:
        serving.join(30)
        producer.close()
