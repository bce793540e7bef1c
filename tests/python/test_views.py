"""Views (docs/views.md): several transforms of one stream, every sample decoded once for all.

Real `batchcast serve` processes over a real JPEG ImageFolder, real Loaders. The oracle of a
view's bytes is the view's own ImagePipeline (options from _batchcast.resolve_view, the rule the
server applies) on the sample's file; streams are served unshuffled so that the k-th sample of
an epoch is dataset index k.

Run: .venv/bin/python -m pytest tests/python/test_views.py
"""

from __future__ import annotations

import os
import threading
from typing import Dict, List

import numpy as np
import pytest
import torch

import batchcast
from batchcast import _batchcast
from batchcast.dataloader import share_paths
from conftest import photo_like, segment_of, watch_endpoint
from test_dataloader import new_key  # noqa: F401 (a fixture)

CLASSES, PER_CLASS, CHUNK = 3, 7, 5  # 21 samples: 5 chunks an epoch, the last of 1


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    from PIL import Image

    root = tmp_path_factory.mktemp("views_folder")
    sizes = [(160, 120), (300, 200), (97, 140), (420, 330), (128, 128), (250, 90), (180, 260)]
    for c in range(CLASSES):
        os.makedirs(root / f"class{c}")
        for i in range(PER_CLASS):
            w, h = sizes[(c + i) % len(sizes)]
            Image.fromarray(photo_like(w, h, seed=c * 100 + i)).save(
                root / f"class{c}" / f"img{i}.jpg", quality=90)
    return str(root)


def transform() -> "_batchcast.PipelineOptions":
    return _batchcast.PipelineOptions(image_size=56, output="uint8", seed=7)


def serve(folder: str, endpoint: str, **kw):
    kw.setdefault("epochs", 2)
    return batchcast.serve(folder, endpoint, CHUNK, transform=transform(), shuffle=False,
                           workers=2, **kw)


def expected(folder: str, view, epoch: int, index: int) -> np.ndarray:
    options = _batchcast.resolve_view(batchcast._views.view_text(view), transform())
    path = _batchcast.Dataset.image_folder(folder).entries[index][0]
    return _batchcast.ImagePipeline(options).process(path, epoch, index)


def read(loader: batchcast.Loader, epochs: int) -> List[List[np.ndarray]]:
    """Every sample of `epochs` epochs, per epoch in order, with its label as the last item."""
    out = []
    for _ in range(epochs):
        samples = []
        for x, y in loader:
            samples += [(x[k].numpy().copy(), int(y[k])) for k in range(len(y))]
        out.append(samples)
    return out


def check_view(folder: str, view, epochs: List[List], first_epoch: int = 0) -> None:
    entries = _batchcast.Dataset.image_folder(folder).entries
    for e, samples in enumerate(epochs, start=first_epoch):
        assert len(samples) == len(entries), f"epoch {e}: {len(samples)} samples"
        for index, (pixels, label) in enumerate(samples):
            assert label == entries[index][1]
            want = expected(folder, view, e, index)
            assert pixels.shape == want.shape and np.array_equal(pixels, want), \
                f"view {view!r}, epoch {e}, sample {index}: not the view's own pipeline's bytes"


def in_threads(loaders: Dict[str, batchcast.Loader], epochs: int) -> Dict[str, List]:
    results: Dict[str, List] = {}
    errors: List[BaseException] = []

    def run(name: str) -> None:
        try:
            results[name] = read(loaders[name], epochs)
        except BaseException as e:  # re-raised below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(n,)) for n in loaders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results


def test_views_up_front_each_equal_its_own_pipeline(folder, endpoint):
    views = {"own": None, "center": "size=40,crop=center,output=float32",
             "small": {"size": 32, "flip": 1.0, "scale": (0.3, 1.0), "seed": 9}}
    with serve(folder, endpoint, views=[views["center"], views["small"]], min_consumers=3):
        loaders = {n: batchcast.Loader(endpoint, view=v, timeout=60, framework="torch")
                   for n, v in views.items()}
        results = in_threads(loaders, 2)
        assert os.path.exists(segment_of(endpoint) + ".v1")
        assert os.path.exists(segment_of(endpoint) + ".v2")
        assert not os.path.exists(segment_of(endpoint) + ".v3"), "one pool per view"
        for n, v in views.items():
            check_view(folder, v, results[n])
            assert results[n][0][0][0].shape == {"own": (56, 56, 3), "center": (3, 40, 40),
                                                 "small": (32, 32, 3)}[n]
        for loader in loaders.values():
            loader.close()
    assert not os.path.exists(segment_of(endpoint) + ".v1"), "a view's pool was left behind"


def test_consumers_of_one_view_get_identical_bytes(folder, endpoint):
    view = "size=48,scale=0.5:1"
    with serve(folder, endpoint, views=[view], min_consumers=3):
        loaders = {"a": batchcast.Loader(endpoint, view=view, timeout=60),
                   # The same view in other words: fields in another order, a dict.
                   "b": batchcast.Loader(endpoint, view={"scale": (0.5, 1), "size": 48},
                                         timeout=60),
                   "own": batchcast.Loader(endpoint, timeout=60)}
        results = in_threads(loaders, 2)
        for a, b in zip(results["a"], results["b"]):
            assert all(np.array_equal(x[0], y[0]) for x, y in zip(a, b))
        check_view(folder, view, results["a"])
        for loader in loaders.values():
            loader.close()


def test_a_view_is_its_own_server_with_that_transform_and_seed(folder, endpoint, tmp_path):
    """A view with a seed of its own is byte for byte what a one-view server of that
    transform and seed serves (shuffled streams: the order is the stream seed's)."""
    def serve_seeded(ep, **kw):
        return batchcast.serve(folder, ep, CHUNK, transform=transform(), workers=2, epochs=1,
                               **kw)

    with serve_seeded(endpoint, views=["size=36,seed=7"]):
        with batchcast.Loader(endpoint, view="size=36,seed=7", timeout=60) as loader:
            shared = read(loader, 1)
    ep2 = watch_endpoint(endpoint + "2")
    one = _batchcast.PipelineOptions(image_size=36, output="uint8", seed=7)
    with batchcast.serve(folder, ep2, CHUNK, transform=one, workers=2, epochs=1):
        with batchcast.Loader(ep2, timeout=60) as loader:
            alone = read(loader, 1)
    assert [s[1] for s in shared[0]] == [s[1] for s in alone[0]]
    assert all(np.array_equal(x[0], y[0]) for x, y in zip(shared[0], alone[0]))


def test_bad_views_are_refused_naming_the_field_and_the_stream_goes_on(folder, endpoint):
    with serve(folder, endpoint, min_consumers=1):
        good = batchcast.Loader(endpoint, timeout=60)
        epoch0 = iter(good)
        first = next(epoch0)
        for view, field in (("size=0", "size must be in 1..16384"),
                            ("interpolation=bicubic", "interpolation 'bicubic' is not one of"),
                            ("crop=none", "crop 'none' is not one of center|random"),
                            ("size=64,scale=0.9:0.2", "scale must satisfy"),
                            ("colour=red", "'colour' is not a view field")):
            with pytest.raises(batchcast.BatchcastError, match="refused this consumer") as e:
                batchcast.Loader(endpoint, view=view, timeout=30)
            assert field in str(e.value), str(e.value)
        with pytest.raises(ValueError, match="'colour'"):
            batchcast.Loader(endpoint, view={"colour": "red"}, timeout=30)
        rest = [first] + list(epoch0)
        assert sum(len(y) for _, y in rest) == CLASSES * PER_CLASS
        assert sum(len(y) for _, y in good) == CLASSES * PER_CLASS  # epoch 1, whole
        good.close()


def test_a_view_added_at_attach_gets_whole_epochs(folder, endpoint):
    """A Loader asking for a view the server does not serve yet, mid-epoch: the view is added,
    the epoch it joined is regenerated for it from its start, later epochs are shared."""
    with serve(folder, endpoint, epochs=3, min_consumers=1, ring=4):
        own = batchcast.Loader(endpoint, timeout=60)
        it = iter(own)
        head = [next(it), next(it)]  # epoch 0 is under way
        late = batchcast.Loader(endpoint, view="size=24,crop=center", timeout=60)
        results: Dict[str, List] = {}

        def rest_of_own():
            samples = sum(len(y) for _, y in head) + sum(len(y) for _, y in it)
            results["own"] = [samples] + [sum(len(y) for _, y in own) for _ in range(2)]

        t = threading.Thread(target=rest_of_own)
        t.start()
        results["late"] = read(late, 3)
        t.join(120)
        assert results["own"] == [CLASSES * PER_CLASS] * 3
        check_view(folder, "size=24,crop=center", results["late"])
        own.close()
        late.close()


def train_epochs(loader, size: int, epochs: int, classes: int) -> List[List[int]]:
    """A real training loop (a small CNN, SGD) over `epochs` epochs; each epoch's labels."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(8, classes))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05)
    seen = []
    for epoch in range(epochs):
        loader.load_state_dict({"epoch": epoch, "sample": 0})
        labels: List[int] = []
        for x, y in loader:
            assert x.shape[1:] == (3, size, size) and x.dtype == torch.float32
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            assert torch.isfinite(loss)
            labels += y.tolist()
        seen.append(labels)
    return seen


def test_dataloaders_of_one_key_with_other_crop_sizes_share_one_stream(folder, new_key):
    """Two trainers' torchvision ImageFolder pipelines differing only in RandomResizedCrop's
    size: the second joins the first's stream as a view (no ValueError), each trains on whole
    shuffled epochs of its own size, in the same order (one stream), decoded by one producer."""
    import torchvision
    import torchvision.transforms as T

    def dataset(size):
        return torchvision.datasets.ImageFolder(folder, T.Compose([
            T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(),
            T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]))

    key = new_key()
    big = batchcast.DataLoader(dataset(64), batch_size=CHUNK, shuffle=True, share=key)
    small = batchcast.DataLoader(dataset(40), batch_size=CHUNK, shuffle=True, share=key)
    assert big.native and small.native
    results: Dict[str, List] = {}
    errors: List[BaseException] = []

    def run(name, loader, size):
        try:
            results[name] = train_epochs(loader, size, 2, CLASSES)
        except BaseException as e:  # re-raised in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=a)
               for a in (("big", big, 64), ("small", small, 40))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    if errors:
        raise errors[0]
    targets = sorted(dataset(40).targets)
    for name in ("big", "small"):
        assert [sorted(e) for e in results[name]] == [targets, targets], name
    assert results["big"] == results["small"], "one stream: the same order for both views"
    assert results["big"][0] != results["big"][1]
    log = open(share_paths(key)["log"]).read()
    assert "view 1:" in log, log[-2000:]
    big.close()
    small.close()


def test_a_share_key_refuses_another_stream_naming_the_stream_field(folder, new_key):
    import torchvision
    import torchvision.transforms as T

    ds = torchvision.datasets.ImageFolder(folder, T.Compose([T.RandomResizedCrop(32),
                                                             T.ToTensor()]))
    key = new_key()
    first = batchcast.DataLoader(ds, batch_size=CHUNK, shuffle=True, share=key)
    it = iter(first)
    next(it)
    other = batchcast.DataLoader(ds, batch_size=CHUNK + 1, shuffle=True, share=key)
    with pytest.raises(ValueError, match=r"batch_size: running 5, this process 6") as e:
        iter(other)
    assert "transform" not in str(e.value).split(". ")[0]
    other.close()
    first.close()
