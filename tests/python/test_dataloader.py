"""batchcast.DataLoader: torch's DataLoader (a subclass); with share=KEY one detached producer.

Run: .venv/bin/python -m pytest tests/python/test_dataloader.py
Datasets live at module level: the share producer unpickles them by importing this module.
"""

from __future__ import annotations

import itertools
import os
import textwrap
import time
import uuid

import pytest
import torch
from torch.utils.data import Dataset, RandomSampler, SequentialSampler

import batchcast
from batchcast.dataloader import share_paths
from conftest import watch_endpoint


class Numbers(Dataset):
    """Sample i is (a row of i, label i): a batch shows which samples it holds."""

    def __init__(self, n: int = 40, transform: str = "none") -> None:
        self.n = n
        self.transform = transform

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((4,), float(i)), i


def labels_of(batches) -> list:
    out = []
    for x, y in batches:
        assert torch.equal(x[:, 0].long(), y)  # whole samples, never mixed up
        out += y.tolist()
    return out


@pytest.fixture
def new_key():
    """Makes fresh share keys whose endpoints the leak check watches; removes their lock,
    state and log files afterwards."""
    keys = []

    def make() -> str:
        key = f"test-{uuid.uuid4().hex[:8]}"
        watch_endpoint(share_paths(key)["endpoint"])
        keys.append(key)
        return key

    yield make
    for key in keys:
        for name in ("lock", "state", "log"):
            try:
                os.unlink(share_paths(key)[name])
            except FileNotFoundError:
                pass


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
            print("epoch", sorted(labels) == list(range(40)), flush=True)
        loader.close()
    """
)


def test_without_share_it_iterates_as_torch():
    loader = batchcast.DataLoader(list(range(10)), batch_size=4, drop_last=True)
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert len(loader) == 2
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_share_is_a_torch_dataloader_with_its_attributes():
    generator = torch.Generator().manual_seed(3)
    loader = batchcast.DataLoader(Numbers(), batch_size=6, shuffle=True, num_workers=2,
                                  drop_last=True, generator=generator, persistent_workers=True,
                                  share="unused")
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert isinstance(loader.sampler, RandomSampler)
    assert (loader.batch_size, loader.num_workers, loader.drop_last) == (6, 2, True)
    assert loader.batch_sampler.batch_size == 6 and loader.generator is generator
    assert loader.persistent_workers and loader.timeout == 0 and loader.share == "unused"
    assert loader.collate_fn is torch.utils.data.default_collate
    assert len(loader) == 6  # no producer is started before iterating
    loader.close()


def test_share_refuses_what_a_stream_cannot_honour():
    with pytest.raises(ValueError, match="batch_sampler"):
        batchcast.DataLoader(Numbers(), batch_sampler=[[0, 1], [2]], share="unused")
    with pytest.raises(ValueError, match="batch_size"):
        batchcast.DataLoader(Numbers(), batch_size=None, share="unused")
    with pytest.raises(ValueError, match="pin_memory_device"):
        batchcast.DataLoader(Numbers(), pin_memory=True, pin_memory_device="xpu", share="unused")
    with pytest.raises(TypeError):  # torch's own check of unknown arguments
        batchcast.DataLoader(Numbers(), share="unused", no_such_argument=1)


def test_shared_len_follows_torch_with_drop_last():
    data = list(range(10))
    for drop_last in (False, True):
        shared = batchcast.DataLoader(data, batch_size=4, drop_last=drop_last, share="unused")
        plain = torch.utils.data.DataLoader(data, batch_size=4, drop_last=drop_last)
        assert len(shared) == len(plain)
        shared.close()


def test_share_two_processes_whole_epochs_and_producer_exits(tmp_path, run_py, new_key):
    key = new_key()
    paths = share_paths(key)
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    run = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
    first = run_py(run, key, "1")
    second = run_py(run, key, "3")
    out1, err1 = first.communicate(timeout=60)
    out2, err2 = second.communicate(timeout=60)
    assert first.returncode == 0, err1.decode()
    assert second.returncode == 0, err2.decode()
    assert out1.decode().split("\n")[:2] == ["len 7", "epoch True"]
    assert out2.decode().split("\n")[:4] == ["len 7", "epoch True", "epoch True", "epoch True"]
    deadline = time.monotonic() + 10  # the producer exits after its grace period
    while os.path.exists(paths["state"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(paths["state"]) and not os.path.exists(paths["lock"])


def test_same_key_with_another_pipeline_is_an_error_naming_the_difference(new_key):
    key = new_key()
    first = batchcast.DataLoader(Numbers(), batch_size=4, share=key)
    it = iter(first)
    next(it)
    other = batchcast.DataLoader(Numbers(transform="flip"), batch_size=5,
                                 sampler=SequentialSampler(range(40)), share=key)
    with pytest.raises(ValueError) as error:
        iter(other)
    message = str(error.value)
    # The transform differs where the stream runs the dataset's Python code: one view only.
    assert "transform: step 0: running none, this process flip" in message, message
    assert "batch_size" not in message, message  # each trainer's own
    assert message.count("running") == 1 and "another share key" in message, message
    other.close()
    first.close()


def test_break_then_iterate_starts_the_next_whole_epoch(new_key):
    key = new_key()
    loader = batchcast.DataLoader(Numbers(), batch_size=4, shuffle=True, share=key)
    for i, _ in enumerate(loader):
        if i == 1:
            break  # what Lightning's sanity check does
    assert loader.state_dict() == {"epoch": 0, "sample": 8}
    assert sorted(labels_of(loader)) == list(range(40))
    assert loader.state_dict() == {"epoch": 2, "sample": 0}  # epoch 1 was whole
    loader.close()


def make(key: str) -> batchcast.DataLoader:
    """A shared loader with a timeout: a failure is an error, not a hang."""
    return batchcast.DataLoader(Numbers(), batch_size=4, shuffle=True, timeout=30, share=key)


def test_a_trainer_starting_mid_epoch_gets_whole_epochs_from_its_first_batch(new_key):
    # The sweep case: the second trainer starts while the first is in epoch 0; it neither
    # idles until epoch 1 nor gets a partial epoch 0 (the producer regenerates what it missed).
    key = new_key()
    with make(key) as first, make(key) as second:
        it1 = iter(first)
        head = labels_of([next(it1) for _ in range(3)])
        it2 = iter(second)  # attaches now, mid-epoch 0
        start = labels_of([next(it2)])
        assert second.state_dict() == {"epoch": 0, "sample": 4}
        # Read in step from here, as two trainers do: the ring bounds how far one can lead.
        epoch0_first, epoch0_second = head, start
        for a, b in itertools.zip_longest(it1, it2):
            epoch0_first += labels_of([a] if a is not None else [])
            epoch0_second += labels_of([b] if b is not None else [])
        assert epoch0_second == epoch0_first and sorted(epoch0_first) == list(range(40))
        pairs = list(zip(first, second))  # epoch 1, read in step (the ring bounds the lead)
        assert labels_of(b for b, _ in pairs) == labels_of(b for _, b in pairs)


@pytest.mark.parametrize("sampler", ["shuffle", "distributed"])
def test_the_producer_regenerates_any_chunk_of_any_epoch(sampler):
    # What late joiners and resumed trainers receive: chunk i of epoch e, rebuilt, equals the
    # stream's; epoch e follows set_epoch(e) (DistributedSampler) or seed + e (shuffle).
    from torch.utils.data import DistributedSampler

    from batchcast._share import pipeline_of
    from batchcast._share_stream import make_stream

    if sampler == "shuffle":
        loader = batchcast.DataLoader(Numbers(), batch_size=6, shuffle=True, share="unused")
    else:
        shard = DistributedSampler(Numbers(), num_replicas=2, rank=1, shuffle=True, seed=5)
        loader = batchcast.DataLoader(Numbers(), batch_size=6, sampler=shard, share="unused")
    stream, regenerate = make_stream(pipeline_of(loader, None)[0])
    epochs = [[y.tolist() for _, y in stream] for _ in range(2)]
    assert epochs[0] != epochs[1]
    if sampler == "distributed":
        for e in range(2):
            shard.set_epoch(e)
            assert sum(epochs[e], []) == list(shard)
    for e in (1, 0):
        for i, labels in enumerate(epochs[e]):
            assert regenerate(e, i)[1].tolist() == labels
    with pytest.raises(IndexError, match="has no chunk"):
        regenerate(0, len(epochs[0]))
    loader.close()
