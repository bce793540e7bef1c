"""Views (docs/views.md): several transforms of one stream, every sample decoded once for all.

Real `batchcast serve` processes over a real JPEG ImageFolder, real Loaders (views_common.py):
views up front and added at attach, identical bytes for one view's consumers, refused views,
Loader.set_view. The oracle of a view's bytes is the view's own ImagePipeline on the sample's file.

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
from conftest import segment_of, watch_endpoint
from views_common import (CHUNK, CLASSES, PER_CLASS, check_view, folder,  # noqa: F401 (fixture)
                          read, read_cpu, read_in_threads, serve, serve_gpu, transform)


def test_views_up_front_each_equal_its_own_pipeline(folder, endpoint):
    views = {"own": None, "center": "size=40,crop=center,output=float32",
             "small": {"size": 32, "flip": 1.0, "scale": (0.3, 1.0), "seed": 9}}
    with serve(folder, endpoint, views=[views["center"], views["small"]], min_consumers=3):
        loaders = {n: batchcast.Loader(endpoint, view=v, timeout=60, framework="torch")
                   for n, v in views.items()}
        results = read_in_threads(loaders, 2)
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
        results = read_in_threads(loaders, 2)
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


@pytest.mark.parametrize("pool", ["host", pytest.param("gpu", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: torch.cuda is not available"))])
def test_a_view_added_while_another_loader_keeps_a_batch_unread_gets_whole_epochs(
        folder, endpoint, pool):
    """The other trainer holds a batch and reads nothing more (validation, say): the chunks
    made before the new view existed hold nobody back, and the new view reads on; on a GPU pool
    its arenas are made at attach (the default ring of 8 slots)."""
    start, read_ = (serve, read) if pool == "host" else (serve_gpu, read_cpu)
    with start(folder, endpoint, epochs=2, min_consumers=1):
        own = batchcast.Loader(endpoint, timeout=60)
        head = next(iter(own))
        late = batchcast.Loader(endpoint, view="size=24,crop=center", timeout=60)
        check_view(folder, "size=24,crop=center", read_(late, 2))
        del head
        own.close()
        late.close()


def test_set_view_switches_at_the_next_epoch_every_sample_once(folder, endpoint):
    """Progressive resizing: Loader.set_view mid-epoch takes effect at the next epoch; the
    epoch under way finishes in the old view, the next is read whole in the new one, and a
    trainer of the old view goes on undisturbed."""
    with serve(folder, endpoint, epochs=3, min_consumers=2, ring=4):
        other = batchcast.Loader(endpoint, timeout=60)
        results: Dict[str, List] = {}
        t = threading.Thread(target=lambda: results.update(other=read(other, 3)))
        t.start()
        loader = batchcast.Loader(endpoint, timeout=60)
        samples = []
        for k, (x, y) in enumerate(loader):  # epoch 0, in the server's view
            if k == 1:
                loader.set_view("size=28,crop=center")
            samples += [(x[i].numpy().copy(), int(y[i])) for i in range(len(y))]
        epochs = [samples] + read(loader, 2)  # epochs 1 and 2, in the new view
        t.join(120)
        check_view(folder, None, epochs[:1])
        check_view(folder, "size=28,crop=center", epochs[1:], first_epoch=1)
        check_view(folder, None, results["other"])
        loader.set_view(None)  # no further epoch: nothing to read, nothing raised
        loader.close()
        other.close()


def test_set_view_after_a_break_starts_the_next_epoch_in_the_new_view(folder, endpoint):
    with serve(folder, endpoint, epochs=2, min_consumers=1, ring=4):
        loader = batchcast.Loader(endpoint, timeout=60)
        for _ in loader:
            break  # epoch 0 left after its first batch
        loader.set_view("size=20")
        check_view(folder, "size=20", read(loader, 1), first_epoch=1)
        loader.close()
