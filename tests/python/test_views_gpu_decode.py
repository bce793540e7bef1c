"""Views on a GPU pool that decodes on the GPU (`serve --decoder nvjpeg|mixed`, docs/views.md):
nvJPEG decodes each image once, one crop/resize/normalise kernel per view writes the view's slot.

The oracle of an nvJPEG view's bytes is a one-view nvJPEG server whose transform is the view
(same seed, same unshuffled order): byte for byte, whatever other views the server has. A mixed
server's chunk is the CPU pipeline's bytes (decoded on the CPU) or nvJPEG's (within its
tolerance), in every view alike.

Run on the GPU machine: pytest -q tests/python/test_views_gpu_decode.py (each test that serves
skips without a GPU or without nvJPEG in the build; the refusal runs everywhere).
"""

from __future__ import annotations

import re
from typing import Dict, List

import numpy as np
import pytest

import batchcast
from batchcast import _batchcast
from conftest import watch_endpoint
from test_views import (CLASSES, PER_CLASS, expected, folder, in_threads,  # noqa: F401 (fixture)
                        late_view_beside_own, needs_gpu, read_cpu, serve_gpu, transform)

SAMPLES = CLASSES * PER_CLASS
# A float view of its own seed, a uint8 eval view that always flips, a planar uint8 view.
VIEWS = ["size=40,output=float32,seed=9", "size=32,crop=center,flip=1", "size=36,layout=chw"]


def read_views(endpoint: str, views: List, epochs: int) -> Dict:
    """Each view (None: the server's own) read by a Loader of its own, all at once."""
    loaders = {v: batchcast.Loader(endpoint, view=v, timeout=60) for v in views}
    try:
        return in_threads({v: (lambda l=l: read_cpu(l, epochs)) for v, l in loaders.items()})
    finally:
        for loader in loaders.values():
            loader.close()


def one_view_server(folder: str, endpoint: str, view, decoder: str, epochs: int = 1) -> List:
    """The epochs of a one-view server whose transform is `view` (None: the test's transform)."""
    one = transform() if view is None else _batchcast.resolve_view(view, transform())
    with serve_gpu(folder, endpoint, transform_=one, decoder=decoder, epochs=epochs):
        with batchcast.Loader(endpoint, timeout=60) as loader:
            return read_cpu(loader, epochs)


def assert_same_bytes(shared: List, alone: List, view) -> None:
    assert [s[1] for s in shared] == [s[1] for s in alone], view
    for index, (x, y) in enumerate(zip(shared, alone)):
        assert x[0].shape == y[0].shape and np.array_equal(x[0], y[0]), \
            f"view {view!r}, sample {index}: not the one-view nvJPEG server's bytes"


@needs_gpu
def test_nvjpeg_pool_views_each_equal_a_one_view_nvjpeg_server(folder, endpoint):
    """Three views besides the server's own, one nvJPEG decode per image: each view's bytes are
    exactly those of a one-view nvJPEG server whose transform is the view."""
    with serve_gpu(folder, endpoint, views=VIEWS, decoder="nvjpeg", min_consumers=4):
        results = read_views(endpoint, [None] + VIEWS, 1)
    assert results[VIEWS[0]][0][0][0].shape == (3, 40, 40)
    assert results[VIEWS[0]][0][0][0].dtype == np.float32
    assert results[VIEWS[1]][0][0][0].shape == (32, 32, 3)
    assert results[VIEWS[2]][0][0][0].shape == (3, 36, 36)
    assert results[None][0][0][0].shape == (56, 56, 3)
    for k, view in enumerate([None] + VIEWS):
        alone = one_view_server(folder, watch_endpoint(f"{endpoint}.one{k}"), view, "nvjpeg")
        assert_same_bytes(results[view][0], alone[0], view)
    # Same crops and flips as the host pipeline (a wrong crop or a missed flip costs tens of
    # levels): nvJPEG's decode and box-filter downscale differ from libjpeg-turbo's by a few levels
    # (test_cuda.py: under 2 on larger photos; these are small, so more of each is downscaled).
    for index, (pixels, _) in enumerate(results[VIEWS[1]][0]):
        want = expected(folder, VIEWS[1], 0, index)
        assert np.abs(pixels.astype(np.float32) - want).mean() < 3.0, index


@needs_gpu
def test_nvjpeg_pool_consumers_of_two_views_each_read_whole_epochs(folder, endpoint):
    entries = _batchcast.Dataset.image_folder(folder).entries
    view = "size=24,crop=center,output=float16"
    with serve_gpu(folder, endpoint, views=[view], decoder="nvjpeg", epochs=2, min_consumers=2):
        results = read_views(endpoint, [None, view], 2)
    for name, shape in ((None, (56, 56, 3)), (view, (3, 24, 24))):
        for e, samples in enumerate(results[name]):
            assert len(samples) == SAMPLES, (name, e)
            assert [label for _, label in samples] == [label for _, label in entries], (name, e)
            assert all(pixels.shape == shape for pixels, _ in samples), (name, e)
    # The two epochs draw different crops (the draws depend on the epoch).
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(*results[None]))


@needs_gpu
def test_nvjpeg_pool_late_joiner_of_a_view_reads_its_views_bytes(folder, endpoint):
    """A Loader of a view that attaches while the server's own reader is mid-epoch catches up
    through private chunks made in its view alone, then reads the shared stream: both epochs
    are the one-view server's bytes, and the own reader loses nothing."""
    view = VIEWS[0]
    with serve_gpu(folder, endpoint, views=[view], decoder="nvjpeg", epochs=2, min_consumers=1):
        results = late_view_beside_own(endpoint, view)
    assert results["own"] == [SAMPLES, SAMPLES]
    alone = one_view_server(folder, watch_endpoint(f"{endpoint}.one"), view, "nvjpeg", epochs=2)
    for e in range(2):
        assert_same_bytes(results["late"][e], alone[e], (view, e))


@needs_gpu
def test_mixed_pool_views_are_the_cpu_pipelines_bytes_or_nvjpegs(folder, endpoint):
    """--decoder mixed with views: a chunk decoded on the CPU is every view's own pipeline, byte
    for byte; one decoded by nvJPEG is within its tolerance. One worker and a ring of 8 make
    engine chunks likely; nothing asserted depends on it."""
    views = ["size=40,seed=9", "size=32,crop=center,flip=1"]  # uint8 HWC, as the transform
    with serve_gpu(folder, endpoint, views=views, decoder="mixed", min_consumers=3, workers=1,
                   ring=8) as server:
        results = read_views(endpoint, [None] + views, 1)
        assert server.wait(30) == 0, server.log_tail()
        log = server.log_tail(50)
    counts = re.search(r"--decoder mixed: (\d+) samples decoded on the CPU, (\d+) on the GPU", log)
    assert counts, log
    on_cpu, on_engine = int(counts.group(1)), int(counts.group(2))
    assert on_cpu + on_engine == SAMPLES
    for view in [None] + views:
        samples = results[view][0]
        assert len(samples) == SAMPLES, view
        wants = [expected(folder, view, 0, index) for index in range(SAMPLES)]
        exact = sum(np.array_equal(pixels, want) for (pixels, _), want in zip(samples, wants))
        assert exact >= on_cpu, (view, exact, on_cpu, on_engine)
        for index, ((pixels, _), want) in enumerate(zip(samples, wants)):
            assert pixels.shape == want.shape
            assert np.abs(pixels.astype(np.float32) - want).mean() < 3.0, (view, index)
    print(f"mixed with views: {on_cpu} samples on the CPU, {on_engine} on nvJPEG")


@pytest.mark.parametrize("decoder", ["nvjpeg", "mixed"])
def test_gpu_decoding_refuses_a_view_it_cannot_resize_naming_the_decoder(folder, endpoint,
                                                                          decoder):
    # Checked with the other options, before any GPU is looked for: runs on every build.
    with pytest.raises(batchcast.BatchcastError,
                       match=rf"view 'size=32,interpolation=nearest': --decoder {decoder} "
                             r"resizes bilinearly"):
        batchcast.serve(folder, endpoint, 5, transform=transform(), device="cuda:0",
                        decoder=decoder, views=["size=32,interpolation=nearest"])
