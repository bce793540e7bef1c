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
from conftest import photo_like, segment_of, watch_endpoint

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
        assert os.path.exists(segment_of(endpoint) + ".v1")
        assert os.path.exists(segment_of(endpoint) + ".v2")
        loaders = {n: batchcast.Loader(endpoint, view=v, timeout=60, framework="torch")
                   for n, v in views.items()}
        results = in_threads(loaders, 2)
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
