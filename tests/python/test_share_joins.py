"""Who joins a share key's stream: trainers of other batch sizes, of their own augmentation seed,
of one folder named another way; and the refusal of those that cannot, naming only what
differs (python/batchcast/_fingerprint.py, docs/views.md).

Real share producers (the native server over a real JPEG ImageFolder, or the dataset's Python
code), real Loaders, each trainer reading in its own thread as collocated trainers do. The
folder has one image per class, so a label names its sample: an epoch's labels show that every
sample came exactly once, and in which order.

Run: .venv/bin/python -m pytest tests/python/test_share_joins.py
"""

from __future__ import annotations

import os
import shutil
import threading
from typing import Any, Dict, List

import pytest
import torch
import torchvision
import torchvision.transforms as T
from torch.utils.data import Dataset

import batchcast
from batchcast import _batchcast, _torchvision_plan
from batchcast.dataloader import share_paths
from conftest import photo_like
from test_dataloader import Numbers, new_key  # noqa: F401 (new_key: a fixture)

SAMPLES, CHUNK, SIZE = 21, 5, 24


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    from PIL import Image

    root = tmp_path_factory.mktemp("joins") / "data"
    for i in range(SAMPLES):
        os.makedirs(root / f"c{i:02d}")
        Image.fromarray(photo_like(64 + 9 * i, 48 + 5 * i, seed=i)).save(
            root / f"c{i:02d}" / "img.jpg", quality=90)
    return str(root)


@pytest.fixture
def share():
    """share(dataset, **DataLoader arguments): a DataLoader(share=) closed after the test,
    whatever it asserted (its producer then exits: nothing is left for the leak check)."""
    made: List[batchcast.DataLoader] = []

    def make(dataset, **kw) -> batchcast.DataLoader:
        made.append(batchcast.DataLoader(dataset, **kw))
        return made[-1]

    yield make
    for loader in made:
        loader.close()


def compose(size: int = SIZE, *middle: Any) -> T.Compose:
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), *middle,
                      T.PILToTensor()])


def images(root: str, transform: Any = None) -> torchvision.datasets.ImageFolder:
    return torchvision.datasets.ImageFolder(root, transform or compose())


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def read(loader, epochs: int, first=None) -> List[List[Any]]:
    """Stream epochs 0, 1... as (labels, images) batches, the images copied. Each is asked for
    by position (as a resumed trainer does), since a trainer iterating anew reads the stream's
    next epoch, and the stream may have gone on since another trainer's first epoch."""
    out = []
    for epoch in range(epochs):
        if epoch or first is None:
            loader.load_state_dict({"epoch": epoch, "sample": 0})
            first = iter(loader)
        out.append([(y.tolist(), x.clone()) for x, y in first])
    return out


def read_in_threads(loaders: Dict[str, Any], epochs: int, first: Dict[str, Any] = None,
                    timeout: float = 120) -> Dict[str, List[List[Any]]]:
    results: Dict[str, Any] = {}
    first = first or {}

    def run(name: str) -> None:
        results[name] = read(loaders[name], epochs, first.get(name))

    threads = [threading.Thread(target=run, args=(name,)) for name in loaders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert set(results) == set(loaders), f"readers that failed: {set(loaders) - set(results)}"
    return results


def labels(epoch: List[Any]) -> List[int]:
    return [label for batch, _ in epoch for label in batch]


def by_sample(epoch: List[Any]) -> Dict[int, torch.Tensor]:
    return {label: x[i] for batch, x in epoch for i, label in enumerate(batch)}


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_trainers_of_other_batch_sizes_join_one_key_with_torchs_epochs(folder, new_key, share,
                                                                       native):
    """Beside the trainer that started the key (batch 5), trainers of batch 8 (drop_last or
    not) and 3 join its stream: each gets torch's len() and batch sizes for its own batch size
    and drop_last, every sample of every epoch once, in the stream's order, with the same
    bytes as the others (one view)."""
    key = new_key()
    shapes = {"first": (CHUNK, False), "eight_dropping": (8, True), "eight": (8, False),
              "three": (3, False)}
    loaders = {name: share(images(folder), batch_size=b, drop_last=d, shuffle=True,
                           native=native, timeout=60, share=key)
               for name, (b, d) in shapes.items()}
    assert all(loader.native is native for loader in loaders.values())
    loaders["first"].load_state_dict({"epoch": 0, "sample": 0})
    started = iter(loaders["first"])  # its producer's chunks: batch 5
    got = read_in_threads(loaders, 2, {"first": started})
    stream = got["first"]
    assert all(sorted(labels(e)) == list(range(SAMPLES)) for e in stream)
    assert labels(stream[0]) != labels(stream[1]), "shuffled per epoch"
    for name, (b, drop) in shapes.items():
        torchs = torch.utils.data.DataLoader(range(SAMPLES), batch_size=b, drop_last=drop)
        assert len(loaders[name]) == len(torchs), name
        for epoch, batches in enumerate(got[name]):
            assert [len(y) for y, _ in batches] == [len(y) for y in torchs], (name, epoch)
            seen = labels(batches)
            assert seen == labels(stream[epoch])[:len(seen)], (name, epoch)
            mine, theirs = by_sample(batches), by_sample(stream[epoch])
            assert all(torch.equal(x, theirs[i]) for i, x in mine.items()), (name, epoch)
            assert all(x.shape == (3, SIZE, SIZE) for x in mine.values())


def test_augment_seed_gives_a_trainer_its_own_draws_in_the_streams_order(folder, new_key, share):
    """Trainers of one key with augment_seed=7 (batch 5 and 4) and =8 beside one without: all
    read the stream's order; each seed's trainers get the same bytes, which are exactly the
    native pipeline's with that seed (the stream's own seed for the trainer without); two views
    are added, one per seed."""
    key = new_key()
    ds = images(folder)

    def make(seed, batch_size=CHUNK):
        return share(ds, batch_size=batch_size, shuffle=True, generator=seeded(3),
                     augment_seed=seed, timeout=60, share=key)

    loaders = {"stream": make(None), "seven": make(7), "seven_too": make(7, 4), "eight": make(8)}
    got = read_in_threads(loaders, 2)
    log = open(share_paths(key)["log"]).read()
    plan = _torchvision_plan.plan(ds, dict(batch_size=CHUNK, shuffle=True), seed=3)
    pipelines = {"stream": _batchcast.ImagePipeline(plan.transform)}
    for name, seed in (("seven", 7), ("eight", 8)):
        text = _batchcast.View(plan.transform).text(with_seed=False) + f",seed={seed}"
        pipelines[name] = _batchcast.ImagePipeline(
            _batchcast.View.resolve(text, _batchcast.View(plan.transform)).options)
    pipelines["seven_too"] = pipelines["seven"]
    for epoch in range(2):
        order = labels(got["stream"][epoch])
        assert sorted(order) == list(range(SAMPLES))
        for name, epochs in got.items():
            assert labels(epochs[epoch]) == order, (name, epoch)
            for i, x in by_sample(epochs[epoch]).items():
                path = ds.samples[i][0]
                want = torch.from_numpy(pipelines[name].process(path, epoch, i))
                assert torch.equal(x, want), (name, epoch, i)
    own = [by_sample(got[name][0]) for name in ("stream", "seven", "eight")]
    for a, b in ((0, 1), (1, 2), (0, 2)):
        assert sum(not torch.equal(own[a][i], own[b][i]) for i in range(SAMPLES)) > SAMPLES // 2
    assert "view 1:" in log and "view 2:" in log and "view 3:" not in log, log[-3000:]


def test_a_trainer_starting_the_key_with_augment_seed_makes_its_view_the_streams_own(
        folder, new_key, share):
    """Without a generator, the trainer that starts the key with augment_seed=7 seeds the
    stream with it: its draws are the stream's own (no second view made for it), and a later
    trainer with augment_seed=7 reads the same bytes."""
    key = new_key()
    ds = images(folder)
    first = share(ds, batch_size=CHUNK, shuffle=True, augment_seed=7, timeout=60, share=key)
    second = share(ds, batch_size=3, shuffle=True, augment_seed=7, timeout=60, share=key)
    got = read_in_threads({"first": first, "second": second}, 1)
    log = open(share_paths(key)["log"]).read()
    plan = _torchvision_plan.plan(ds, dict(batch_size=CHUNK, shuffle=True), seed=7)
    pipeline = _batchcast.ImagePipeline(plan.transform)
    for name in ("first", "second"):
        for i, x in by_sample(got[name][0]).items():
            assert torch.equal(x, torch.from_numpy(pipeline.process(ds.samples[i][0], 0, i)))
    assert "view 1:" not in log, log[-3000:]


def test_augment_seed_is_refused_where_it_cannot_be_a_view(folder):
    with pytest.raises(ValueError, match=r"this pipeline runs in Python \(native=False\)"):
        batchcast.DataLoader(images(folder), batch_size=4, augment_seed=1, native=False,
                             share="unused")
    with pytest.raises(ValueError, match=r"without share= torch's workers draw from generator"):
        batchcast.DataLoader(images(folder), batch_size=4, augment_seed=1)
    with pytest.raises(ValueError, match=r"augment_seed=-1: an integer in 0..2\*\*64-1"):
        batchcast.DataLoader(images(folder), batch_size=4, augment_seed=-1, share="unused")


def test_one_folder_named_three_ways_is_one_stream(folder, new_key, share, tmp_path,
                                                   monkeypatch):
    """An absolute root, a relative one and a symlink to it are one folder: their trainers
    read one stream (one order, the same bytes), no ValueError."""
    link = tmp_path / "link"
    link.symlink_to(folder, target_is_directory=True)
    monkeypatch.chdir(os.path.dirname(folder))
    key = new_key()
    roots = {"absolute": folder, "relative": os.path.basename(folder), "symlink": str(link)}
    loaders = {name: share(images(root), batch_size=CHUNK, shuffle=True, timeout=60, share=key)
               for name, root in roots.items()}
    got = read_in_threads(loaders, 1)
    order = labels(got["absolute"][0])
    assert sorted(order) == list(range(SAMPLES))
    for name in roots:
        assert labels(got[name][0]) == order, name
        theirs = by_sample(got["absolute"][0])
        assert all(torch.equal(x, theirs[i]) for i, x in by_sample(got[name][0]).items()), name


def collate_samples(batch):
    """A collate_fn of the user's own (as the share sees it: not torch's default)."""
    return torch.utils.data.default_collate(batch)


def test_a_refusal_names_each_field_that_differs_once_and_what_would_join(
        folder, new_key, share, tmp_path):
    key = new_key()
    first = share(images(folder), batch_size=CHUNK, shuffle=True, generator=seeded(3), share=key)
    next(iter(first))

    def refusal(dataset, **kw) -> str:
        kw.setdefault("generator", seeded(3))
        loader = share(dataset, batch_size=CHUNK, shuffle=True, share=key, **kw)
        with pytest.raises(ValueError) as e:
            iter(loader)
        return str(e.value)

    # A transform batchcast cannot make natively: that step, once; not the whole transform.
    jitter = refusal(images(folder, compose(SIZE, T.ColorJitter(0.4, 0.4, 0.4))))
    assert jitter.count("ColorJitter") == 1 and "RandomResizedCrop" not in jitter, jitter
    assert "transform: this process's does not run natively" in jitter, jitter
    assert "to join: without that step it reads the stream as a view" in jitter, jitter
    assert "decoding" not in jitter and "root" not in jitter, jitter
    # Another folder, and another transform with it: the folder alone (a transform joins).
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    root = refusal(images(str(copy), compose(16)))
    assert f"root: running {os.path.realpath(folder)!r}, this process {str(copy)!r}" in root
    assert "to join: the same folder" in root and "transform" not in root, root
    assert "decoding" not in root, root
    # Another shuffle seed: the order is the stream's; augment_seed is what joins.
    seed = refusal(images(folder), generator=seeded(7))
    assert "shuffle seed: running 3, this process 7" in seed, seed
    assert "pass no generator, or one seeded 3" in seed and "augment_seed=N" in seed, seed
    assert seed.count("running") == 1, seed


def test_batch_size_is_a_stream_field_only_under_a_custom_collate_fn(new_key, share):
    key = new_key()
    first = share(Numbers(), batch_size=4, collate_fn=collate_samples, share=key)
    next(iter(first))
    other = share(Numbers(), batch_size=6, collate_fn=collate_samples, share=key)
    with pytest.raises(ValueError) as e:
        iter(other)
    message = str(e.value)
    assert "batch_size: running 4, this process 6" in message, message
    assert "the batches of a custom collate_fn cannot be cut into another size" in message
    assert message.count("running") == 1, message
