"""Views (docs/views.md) under the stream's policies: resume, the stall policy and DDP ranks
work per view as they do for the stream.

Real `batchcast serve` processes (and share producers) over a real JPEG ImageFolder, real
Loaders and DataLoaders. A view's bytes are checked against its own ImagePipeline
(views_common.expected), on unshuffled streams where the k-th sample of an epoch is index k.

Run: .venv/bin/python -m pytest tests/python/test_views_policies.py
"""

from __future__ import annotations

import json
import os
import textwrap
import threading
import uuid
from typing import Dict, List

import pytest

import batchcast
from batchcast.dataloader import share_paths
from conftest import photo_like, watch_endpoint
from views_common import CLASSES, PER_CLASS, check_view, folder, read, serve  # noqa: F401

SAMPLES = CLASSES * PER_CLASS
VIEW = "size=32,crop=center"


def samples_of(batches) -> List:
    """(pixels, label) of every sample of `batches`, copied out of shared memory."""
    return [(x[k].numpy().copy(), int(y[k])) for x, y in batches for k in range(len(y))]


# -- resume --------------------------------------------------------------------------------


def test_a_view_resumes_mid_epoch_from_a_position_the_server_holds(folder, endpoint):
    """A Loader of a view checkpoints mid-epoch and closes; a new Loader of the same view loads
    the checkpoint: together they read the epoch once, in the view's bytes. The ring is large,
    so the position is still in a retained chunk (the shared path of a seek)."""
    with serve(folder, endpoint, epochs=2, ring=64, min_consumers=1):
        keeper = batchcast.Loader(endpoint, timeout=60)  # keeps the server up, reads nothing
        first = batchcast.Loader(endpoint, view=VIEW, timeout=60)
        epoch0 = read(first, 1)
        it = iter(first)
        head = samples_of([next(it), next(it)])
        state = first.state_dict()
        assert state == {"epoch": 1, "sample": 2 * 5}
        first.close()

        resumed = batchcast.Loader(endpoint, view=VIEW, timeout=60)
        resumed.load_state_dict(json.loads(json.dumps(state)))
        tail = samples_of(resumed)
        assert resumed.state_dict() == {"epoch": 2, "sample": 0}
        check_view(folder, VIEW, epoch0)
        check_view(folder, VIEW, [head + tail], first_epoch=1)
        assert len(tail) == SAMPLES - 10
        check_view(folder, None, read(keeper, 2))  # the server's own view, untouched
        resumed.close()
        keeper.close()


def test_a_view_resumes_an_epoch_the_server_no_longer_holds(folder, endpoint):
    """The checkpoint's epoch is long gone from a 4-slot ring (another trainer, of another view,
    read two epochs past it meanwhile; nobody reads the view): the position is regenerated, in
    the view's bytes, and the resumed Loader reads on to the end of the stream."""
    with serve(folder, endpoint, epochs=4, ring=4, min_consumers=1):
        first = batchcast.Loader(endpoint, view=VIEW, timeout=60)
        epoch0 = read(first, 1)
        it = iter(first)
        head = samples_of([next(it), next(it)])
        state = first.state_dict()
        keeper = batchcast.Loader(endpoint, timeout=60)  # another view, from epoch 1 on
        keeper.load_state_dict({"epoch": 1, "sample": 0})
        first.close()
        keeper_epochs = read(keeper, 2)  # epochs 1 and 2
        keeper_it = iter(keeper)
        keeper_epochs.append(samples_of([next(keeper_it)]))  # epoch 3 under way, kept
        resumed = batchcast.Loader(endpoint, view=VIEW, timeout=60)
        resumed.load_state_dict(state)
        tail = samples_of(resumed)
        later = read(resumed, 2)  # epochs 2 and 3, in the view
        check_view(folder, VIEW, epoch0)
        check_view(folder, VIEW, [head + tail], first_epoch=1)
        check_view(folder, VIEW, later, first_epoch=2)
        keeper_epochs[-1] += samples_of(keeper_it)
        check_view(folder, None, keeper_epochs, first_epoch=1)
        resumed.close()
        keeper.close()


# -- stall policy ----------------------------------------------------------------------------


def test_a_paused_view_is_decoupled_and_reads_its_own_view_whole_when_it_resumes(
        folder, endpoint):
    """Two views on one stream, a 4-slot ring: one Loader reads on while the other keeps its
    iterator and reads nothing (validation, a debugger). The paused one holds the stream back,
    is decoupled after its stall bound (1 s), and the reader reads every epoch but the last
    while it is paused: it is not held back for good. Resumed, the paused Loader reads every
    epoch whole, each sample once, in ITS view's bytes (its missed chunks are regenerated in
    its view)."""
    epochs, paused_view, reader_view = 4, "size=24,crop=center", "size=40"
    with serve(folder, endpoint, epochs=epochs, ring=4, min_consumers=2) as server:
        reader = batchcast.Loader(endpoint, view=reader_view, timeout=60, name="reader")
        paused = batchcast.Loader(endpoint, view=paused_view, timeout=60, stall_timeout=1.0,
                                  name="paused")
        resume = threading.Event()
        results: Dict[str, List] = {}
        errors: List[BaseException] = []

        def read_paused() -> None:
            try:
                it = iter(paused)
                head = samples_of([next(it)])
                resume.wait(180)  # while the reader reads epochs 0 .. epochs-2
                results["paused"] = [head + samples_of(it)] + read(paused, epochs - 1)
            except BaseException as e:  # re-raised in the test's thread
                errors.append(e)

        t = threading.Thread(target=read_paused)
        t.start()
        try:
            # The reader's timeout (60 s) raises if the paused Loader held it back for good.
            results["reader"] = read(reader, epochs - 1)
        finally:
            resume.set()
        results["reader"] += read(reader, 1)
        t.join(180)
        if errors:
            raise errors[0]
        assert not t.is_alive()
        check_view(folder, reader_view, results["reader"])
        check_view(folder, paused_view, results["paused"])
        reader.close()
        paused.close()
        assert server.wait(60) == 0
        log = server.log_tail(400)
    assert "'paused'" in log and "decoupled" in log, log
    final = [line for line in log.splitlines() if "decoupling(s))" in line]
    assert final and " 0 decoupling(s)" not in final[-1], log


# -- DDP ranks -------------------------------------------------------------------------------

RANK_CLASSES = 10  # one image per class: a label names its sample
DDP_EPOCHS = 2

TRAINER = textwrap.dedent(
    """
    import json, os, sys, torch, torchvision, batchcast
    import torchvision.transforms as T
    from torch.utils.data import DistributedSampler

    folder, key, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ds = torchvision.datasets.ImageFolder(folder, T.Compose([
        T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(),
        T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]))
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = batchcast.DataLoader(ds, batch_size=2, sampler=sampler, share=key, timeout=120)
    epochs, shapes = [], set()
    for epoch in range({epochs}):
        sampler.set_epoch(epoch)
        labels = []
        for x, y in loader:
            shapes.add(tuple(x.shape[1:]))
            labels += y.tolist()
        epochs.append(labels)
    print(json.dumps({{"native": loader.native, "endpoint": loader.endpoint,
                      "shapes": sorted(shapes), "epochs": epochs}}), flush=True)
    loader.close()
    """
).format(epochs=DDP_EPOCHS)


@pytest.fixture
def one_image_per_class(tmp_path) -> str:
    from PIL import Image

    sizes = [(160, 120), (300, 200), (97, 140), (128, 128), (250, 90)]
    for c in range(RANK_CLASSES):
        os.makedirs(tmp_path / f"class{c:02d}")
        w, h = sizes[c % len(sizes)]
        Image.fromarray(photo_like(w, h, seed=500 + c)).save(
            tmp_path / f"class{c:02d}" / "img.jpg", quality=90)
    return str(tmp_path)


@pytest.fixture
def rank_keys():
    """A fresh share key and its per-rank files; the leak check watches their endpoints (and
    the key's own, which nothing should use), whose lock, state and log files are removed
    afterwards."""
    key = f"test-vddp-{uuid.uuid4().hex[:8]}"
    paths = [share_paths(f"{key}-rank{r}of2") for r in range(2)]
    for p in paths + [share_paths(key)]:
        watch_endpoint(p["endpoint"])
    yield key, paths
    for p in paths + [share_paths(key)]:
        for name in ("lock", "state", "log"):
            try:
                os.unlink(p[name])
            except FileNotFoundError:
                pass


def test_ddp_ranks_share_per_rank_with_a_view_per_crop_size(one_image_per_class, rank_keys,
                                                            run_py):
    """Two trainers per rank on one share key (RANK/WORLD_SIZE as torchrun sets them,
    DistributedSampler(num_replicas=2, rank=r)), differing only in RandomResizedCrop's size:
    the two of a rank read one stream (the same labels in the same order) each in its own size,
    the second size a view of that rank's producer; rank 0 and rank 1 read disjoint shards
    that cover the dataset every epoch."""
    key, paths = rank_keys
    sizes = (48, 32)
    procs = {}
    for rank in range(2):
        for size in sizes:
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                       BATCHCAST_KEEP_SHARE_LOG="1")  # read below, once the producers exited
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (os.path.dirname(os.path.abspath(__file__)),
                            os.environ.get("PYTHONPATH")) if p)
            procs[rank, size] = run_py(TRAINER, one_image_per_class, key, str(size), env=env)
    results = {}
    for (rank, size), p in procs.items():
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err.decode()[-3000:]
        results[rank, size] = json.loads(out.decode().splitlines()[-1])
    for (rank, size), r in results.items():
        assert r["native"], (rank, size)
        assert r["endpoint"] == paths[rank]["endpoint"], "the sharing is per rank"
        assert r["shapes"] == [[3, size, size]], (rank, size, r["shapes"])
    half = RANK_CLASSES // 2
    for rank in range(2):
        a, b = (results[rank, s]["epochs"] for s in sizes)
        assert a == b, f"rank {rank}: both crop sizes read one stream, in one order"
        assert all(len(e) == half for e in a), a
    for epoch in range(DDP_EPOCHS):
        shards = [set(results[r, sizes[0]]["epochs"][epoch]) for r in range(2)]
        assert not shards[0] & shards[1], f"epoch {epoch}: the ranks' shards overlap"
        assert shards[0] | shards[1] == set(range(RANK_CLASSES)), f"epoch {epoch}"
    for rank in range(2):
        log = open(paths[rank]["log"]).read()
        assert log.count("view 1:") == 1, log[-2000:]  # the second size: a view, once
