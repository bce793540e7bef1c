"""The share producer's start-up (python/batchcast/_share.py, _share_producer.py).

A recognised torchvision pipeline's producer starts when the DataLoader is made, so that its
start-up overlaps the trainer's, and it serves that loader's first iteration; it runs the native
server without importing torch (nor unpickling the dataset), while a Python pipeline's producer
does import it (the check can fail). A producer that no Loader ever read exits as soon as the
trainer that started it closed its loader, dropped it, or died, instead of waiting out its
start-up timeout; and leaves nothing behind.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import textwrap

import pytest
import torchvision
import torchvision.transforms as T

import batchcast
from test_dataloader import new_key  # noqa: F401 (a fixture)
from test_decoders import photo, save_jpeg
from test_faults import leftovers, share_files, wait_gone

# Far beyond the producer's reaction (a pipe's end of file, polled every 0.1 s) and below its
# start-up timeout (120 s), where a producer that missed its trainers' exit would end.
EXIT_BOUND_S = 60


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("startup") / "data"
    base = photo(90, 70)
    for c in range(2):
        for i in range(4):
            save_jpeg(base.crop((c, i, c + 48, i + 40)), str(root / f"c{c}" / f"img{i}.jpg"))
    return str(root)


def dataset(folder):
    return torchvision.datasets.ImageFolder(folder, T.Compose([
        T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor()]))


def producer_pid(paths) -> int:
    with open(paths["state"]) as f:
        return int(json.load(f)["pid"])


def maps_torch(pid: int) -> bool:
    """Whether process `pid` has torch's library mapped (it imported torch)."""
    with open(f"/proc/{pid}/maps") as f:
        return "libtorch" in f.read()


@pytest.mark.parametrize("native", [True, False])
def test_a_native_share_producer_starts_with_the_loader_and_never_imports_torch(
        folder, new_key, native):
    key = new_key()
    loader = batchcast.DataLoader(dataset(folder), batch_size=4, share=key, native=native)
    assert loader.native is native
    paths = loader.paths
    if native:  # started by the constructor: the first iteration reads this one
        started = producer_pid(paths)
        assert not wait_gone(started, 0.1)
    else:
        assert not os.path.exists(paths["state"])  # the dataset is pickled at iter, as torch's
    labels = [y for _, y in loader]
    assert sorted(sum((y.tolist() for y in labels), [])) == [0] * 4 + [1] * 4
    pid = producer_pid(paths)
    if native:
        assert pid == started
    assert maps_torch(pid) is not native
    with open(paths["log"]) as f:
        log = f.read()
    assert ("torch not imported" in log) is native, log
    loader.close()
    assert wait_gone(pid, EXIT_BOUND_S)


@pytest.mark.parametrize("how", ["close", "drop"])
def test_the_producer_of_a_loader_closed_unread_exits(folder, new_key, how, monkeypatch):
    monkeypatch.setenv("BATCHCAST_KEEP_SHARE_LOG", "1")  # read below: a clean exit removes it
    key = new_key()
    loader = batchcast.DataLoader(dataset(folder), batch_size=4, share=key)
    paths = loader.paths
    pid = producer_pid(paths)
    if how == "close":
        loader.close()
    else:
        del loader
        gc.collect()
    assert wait_gone(pid, EXIT_BOUND_S)
    assert leftovers(paths["endpoint"]) == [] and share_files(paths) == []
    with open(paths["log"]) as f:
        assert "the trainer that started it left before reading" in f.read()


def test_the_producer_of_a_trainer_killed_before_reading_exits(folder, new_key, run_py):
    key = new_key()
    trainer = run_py(textwrap.dedent("""
        import json, sys, time, torchvision, batchcast
        import torchvision.transforms as T
        tf = T.Compose([T.RandomResizedCrop(24), T.ToTensor()])
        data = torchvision.datasets.ImageFolder(sys.argv[2], tf)
        loader = batchcast.DataLoader(data, batch_size=4, share=sys.argv[1])
        with open(loader.paths["state"]) as f:
            print(json.load(f)["pid"], flush=True)
        time.sleep(600)
    """), key, folder)
    pid = int(trainer.stdout.readline())
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    assert wait_gone(pid, EXIT_BOUND_S)
    paths = batchcast.dataloader.share_paths(key)
    assert leftovers(paths["endpoint"]) == [] and share_files(paths) == []


def test_a_second_loader_made_while_the_first_is_unread_keeps_the_producer(folder, new_key):
    """Another trainer that made its loader of the key meanwhile and reads it: the first
    closing unread does not stop the stream the second reads."""
    key = new_key()
    first = batchcast.DataLoader(dataset(folder), batch_size=4, share=key)
    second = batchcast.DataLoader(dataset(folder), batch_size=4, share=key)
    pid = producer_pid(first.paths)
    batches = iter(second)
    next(batches)
    first.close()
    assert len(list(batches)) == 1 and producer_pid(second.paths) == pid
    second.close()
    assert wait_gone(pid, EXIT_BOUND_S)
