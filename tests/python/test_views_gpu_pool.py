"""Views on GPU pools (serve --device cuda:0, decoder cpu; docs/views.md): each view has arenas of
its own on the GPU; its bytes equal a one-view GPU server's, a view added at attach gets whole
epochs, Loader.set_view switches at the next epoch. GPU only: each test skips itself without one
(the GPU decoders' views: test_views_gpu_decode.py).

Run on the GPU machine: pytest -q tests/python/test_views_gpu_pool.py
"""

from __future__ import annotations

import threading
from typing import Dict, List

import numpy as np
import pytest

import batchcast
from batchcast import _batchcast
from conftest import watch_endpoint
from views_common import (CLASSES, PER_CLASS, check_view, expected, folder,  # noqa: F401 (fixture)
                          late_view_beside_own, needs_gpu, read_cpu, serve_gpu, transform)


GPU_VIEWS = ["size=40,output=float32,seed=9", "size=32,crop=center,flip=1"]


@needs_gpu
def test_gpu_pool_views_each_equal_a_one_view_gpu_server(folder, endpoint):
    """Two views on a GPU pool decoded on the CPU, plus the server's own: each view's bytes are
    exactly those of a one-view GPU server whose transform is the view (same crops: the view's
    seed; same order: unshuffled), and a uint8 view exactly its host pipeline's."""
    with serve_gpu(folder, endpoint, views=GPU_VIEWS, min_consumers=3):
        loaders = {v: batchcast.Loader(endpoint, view=v, timeout=60) for v in GPU_VIEWS}
        loaders["own"] = batchcast.Loader(endpoint, timeout=60)
        results: Dict[str, List] = {}
        errors: List[BaseException] = []

        def run(name):
            try:
                results[name] = read_cpu(loaders[name], 1)
            except BaseException as e:  # re-raised below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(n,)) for n in loaders]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for loader in loaders.values():
            loader.close()
        if errors:
            raise errors[0]
    assert results[GPU_VIEWS[0]][0][0][0].shape == (3, 40, 40)
    assert results[GPU_VIEWS[1]][0][0][0].shape == (32, 32, 3)
    check_view(folder, None, results["own"])
    check_view(folder, GPU_VIEWS[1], results[GPU_VIEWS[1]])  # uint8: copied as decoded
    for k, view in enumerate(GPU_VIEWS):
        one = _batchcast.View.resolve(view, _batchcast.View(transform())).options
        ep = watch_endpoint(f"{endpoint}.one{k}")
        with serve_gpu(folder, ep, transform_=one):
            with batchcast.Loader(ep, timeout=60) as loader:
                alone = read_cpu(loader, 1)
        shared = results[view]
        assert [s[1] for s in shared[0]] == [s[1] for s in alone[0]]
        assert all(np.array_equal(x[0], y[0]) for x, y in zip(shared[0], alone[0])), view
    # The float view normalised on the GPU: the host pipeline's within float rounding.
    entries = _batchcast.Dataset.image_folder(folder).entries
    for index, (pixels, _) in enumerate(results[GPU_VIEWS[0]][0]):
        want = expected(folder, GPU_VIEWS[0], 0, index)
        assert np.allclose(pixels, want, atol=1e-5), (index, entries[index][0])


@needs_gpu
@pytest.mark.parametrize("decoder", ["cpu", "nvjpeg"])
def test_gpu_pool_view_added_at_attach_gets_whole_epochs(folder, endpoint, decoder):
    """As on a host pool: a Loader asking mid-epoch for a view the GPU pool does not serve yet
    gets the view's arenas, the epoch it joined regenerated from its start, later epochs shared;
    the server's own reader loses nothing. Its bytes are a one-view GPU server's."""
    view = "size=24,crop=center"
    with serve_gpu(folder, endpoint, epochs=2, min_consumers=1, decoder=decoder):
        results = late_view_beside_own(endpoint, view)
    assert results["own"] == [CLASSES * PER_CLASS] * 2
    one = _batchcast.View.resolve(view, _batchcast.View(transform())).options
    ep = watch_endpoint(f"{endpoint}.one")
    with serve_gpu(folder, ep, transform_=one, epochs=2, decoder=decoder):
        with batchcast.Loader(ep, timeout=60) as loader:
            alone = read_cpu(loader, 2)
    for e in range(2):
        assert [s[1] for s in results["late"][e]] == [s[1] for s in alone[e]]
        assert all(np.array_equal(x[0], y[0]) for x, y in zip(results["late"][e], alone[e])), e
    if decoder == "cpu":  # uint8, decoded on the CPU: the host pipeline's bytes
        check_view(folder, view, results["late"])


@needs_gpu
def test_gpu_pool_set_view_switches_at_the_next_epoch(folder, endpoint):
    with serve_gpu(folder, endpoint, epochs=2, min_consumers=1, ring=4,
                   views=["size=28,output=float32"]):
        loader = batchcast.Loader(endpoint, timeout=60)
        first = read_cpu(loader, 1)
        loader.set_view("size=28,output=float32")
        second = read_cpu(loader, 1)
        loader.close()
    check_view(folder, None, first)
    for index, (pixels, _) in enumerate(second[0]):
        assert np.allclose(pixels, expected(folder, "size=28,output=float32", 1, index),
                           atol=1e-5)
