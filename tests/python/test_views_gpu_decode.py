"""Views on a GPU pool that decodes on the GPU (`serve --decoder nvjpeg|mixed`, docs/views.md):
nvJPEG decodes each image once, one crop/resize/normalise kernel per view writes the view's slot.

The oracle of an nvJPEG view's bytes is a one-view nvJPEG server whose transform is the view
(same seed, same unshuffled order): byte for byte, whatever other views the server has. A mixed
server's chunk is the CPU pipeline's bytes (decoded on the CPU) or nvJPEG's (within its
tolerance), in every view alike.

The drop-in (`DataLoader(share=KEY, pin_memory=True)`, which decodes into a GPU pool with the
mixed decoder) joins such a pool as a view and follows a transform changed between epochs there; a
transform nvJPEG cannot resize is refused naming the interpolation.

Run on the GPU machine: pytest -q tests/python/test_views_gpu_decode.py (each test that serves
skips without a GPU or without nvJPEG in the build; the refusals and the drop-in's decision run
everywhere).
"""

from __future__ import annotations

import re
from typing import Dict, List

import numpy as np
import pytest
import torch
import torch.utils.data
import torchvision
import torchvision.transforms as T

import batchcast
from batchcast import _batchcast
from batchcast._fingerprint import decoding_of, fingerprint, joins_as_view, view_of
from batchcast._torchvision_plan import plan
from batchcast.dataloader import share_paths
from conftest import watch_endpoint
from test_dataloader import new_key  # noqa: F401 (a fixture)
from views_common import (CHUNK, CLASSES, PER_CLASS, expected, folder,  # noqa: F401 (fixture)
                          in_threads, late_view_beside_own, needs_gpu, read_cpu, serve_gpu,
                          train_epochs, transform)

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
    one = (transform() if view is None
           else _batchcast.View.resolve(view, _batchcast.View(transform())).options)
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


# --- the drop-in: DataLoader(share=KEY, pin_memory=True) on a GPU pool -------------------------

NEAREST = T.InterpolationMode.NEAREST
needs_nvjpeg_gpu = pytest.mark.skipif(
    not (torch.cuda.is_available() and _batchcast.has_nvjpeg),
    reason="needs a CUDA GPU and a build with nvJPEG (DataLoader(pin_memory=True) decodes into "
           "a GPU pool there with the mixed decoder; runs on the GPU machine)")


def compose(size: int, interpolation=T.InterpolationMode.BILINEAR) -> T.Compose:
    return T.Compose([T.RandomResizedCrop(size, interpolation=interpolation),
                      T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])


def test_the_dropin_takes_a_bilinear_transform_as_a_gpu_pools_view_and_refuses_another(folder):
    """The drop-in's decision, on every machine (plans for a GPU are pure functions): beside a
    share decoding into a GPU pool on cuda:0, a pin_memory trainer of another bilinear size reads a
    view of its stream; one of a nearest resize is refused naming the interpolation and the fix;
    a trainer without pin_memory decodes another way (a stream field). A host pool's stream
    makes any recognised transform, a GPU pool's the bilinear ones."""
    def trainer(tf: T.Compose, gpu: bool = True):
        ds = torchvision.datasets.ImageFolder(folder, tf)
        p = plan(ds, dict(batch_size=CHUNK, shuffle=True), seed=3,
                 device="cuda:0" if gpu else None, nvjpeg=gpu)
        prints = fingerprint(torch.utils.data.DataLoader(ds, batch_size=CHUNK, shuffle=True), 3)
        prints["decoding"] = decoding_of(p)
        return prints, p

    running, stream = trainer(compose(64))
    assert (stream.device, stream.decoder, stream.gpu_refused) == ("cuda:0", "mixed", "")
    gpu = running["decoding"]
    assert gpu == "native mixed decoder, pool on cuda:0"
    mine, small = trainer(compose(40))
    view = view_of("k", mine, running, small)
    assert view == _batchcast.View(small.transform).text(with_seed=False)
    resolved = _batchcast.View.resolve(view, _batchcast.View(stream.transform)).options
    assert (resolved.image_size, resolved.interpolation) == (40, "bilinear")
    assert view_of("k", running, running, stream) == ""

    nearest_prints, nearest = trainer(compose(40, NEAREST))
    assert (nearest.device, nearest.gpu_refused) == (
        "cpu", "interpolation NEAREST: decoding on a GPU (nvJPEG) resizes bilinearly")
    with pytest.raises(ValueError, match=r"DataLoader\(share='k'\) cannot join the stream of "
                       r"that key\. transform: its pool \(native mixed decoder, pool on cuda:0\) "
                       r"cannot make this one as a view: interpolation NEAREST: decoding on a GPU "
                       r"\(nvJPEG\) resizes bilinearly; to join: use InterpolationMode.BILINEAR "
                       r"in this transform, or pin_memory=False in every trainer of this key\."):
        view_of("k", nearest_prints, running, nearest)

    host_prints, host = trainer(compose(40), gpu=False)
    with pytest.raises(ValueError, match=r"decoding: running 'native mixed decoder, pool on "
                       r"cuda:0', this process 'native cpu decoder, pool on cpu'.*the same "
                       r"pin_memory"):
        view_of("k", host_prints, running, host)

    # Following a changed transform (the trainer's own plans against its stream's decoding).
    host_pool = host_prints["decoding"]
    assert joins_as_view(small, gpu) and joins_as_view(small, host_pool)
    assert joins_as_view(nearest, host_pool) and not joins_as_view(nearest, gpu)
    assert not joins_as_view(host, gpu) and not joins_as_view(None, host_pool)


@needs_nvjpeg_gpu
def test_dropin_trainers_of_two_sizes_on_a_gpu_pool_each_train_on_whole_epochs(folder, new_key):
    """Two pin_memory=True trainers of one key, RandomResizedCrop(64) and (40): the second joins
    the first's GPU pool (mixed decoder) as a view (no ValueError); each trains on CUDA batches of its
    own size, every epoch whole with every label right (an unshuffled stream: the dataset's own
    order), decoded by one producer."""
    key = new_key()
    device = f"cuda:{torch.cuda.current_device()}"
    big, small = (batchcast.DataLoader(torchvision.datasets.ImageFolder(folder, compose(size)),
                                       batch_size=CHUNK, pin_memory=True, share=key)
                  for size in (64, 40))
    assert big.decoding == small.decoding == f"native mixed decoder, pool on {device}"
    results = in_threads({"big": lambda: train_epochs(big, 64, 2, CLASSES, device),
                          "small": lambda: train_epochs(small, 40, 2, CLASSES, device)},
                         timeout=180)
    targets = torchvision.datasets.ImageFolder(folder).targets
    for name in ("big", "small"):
        assert results[name] == [targets, targets], name
    log = open(share_paths(key)["log"]).read()
    assert log.count(f"native pipeline (mixed decoder, pool on {device})") == 1, log[-2000:]
    assert "view 1:" in log, log[-2000:]
    big.close()
    small.close()


@needs_nvjpeg_gpu
def test_a_gpu_pool_refuses_a_dropin_nearest_resize_naming_it_and_goes_on(folder, new_key):
    """The GPU decoders resize bilinearly: a second pin_memory trainer with a nearest resize, and a
    trainer of the share switching to one, each get a ValueError naming the interpolation and
    the fix at that iteration; the stream and its readers go on (the refused trainer reads its
    next epoch whole once its transform is bilinear again)."""
    key = new_key()
    ds = torchvision.datasets.ImageFolder(folder, compose(64))
    first = batchcast.DataLoader(ds, batch_size=CHUNK, pin_memory=True, share=key)
    assert sum(len(y) for _, y in first) == CLASSES * PER_CLASS
    why = r"interpolation NEAREST: decoding on a GPU \(nvJPEG\) resizes bilinearly"
    fix = r"use InterpolationMode.BILINEAR in this transform, or pin_memory=False"
    other = batchcast.DataLoader(torchvision.datasets.ImageFolder(folder, compose(40, NEAREST)),
                                 batch_size=CHUNK, pin_memory=True, share=key)
    with pytest.raises(ValueError, match=r"cannot make this one as a view: " + why
                                         + "; to join: " + fix):
        iter(other)
    other.close()
    ds.transform = compose(40, NEAREST)
    with pytest.raises(ValueError, match=r"the dataset's new transform cannot be made by the "
                                         r"share's pool \(native mixed decoder, pool on "
                                         r"cuda:\d+\): " + why + "; " + fix):
        iter(first)
    ds.transform = compose(40)
    batches = [(x.shape, y.cpu()) for x, y in first]
    assert {shape[1:] for shape, _ in batches} == {(3, 40, 40)}
    assert torch.cat([y for _, y in batches]).tolist() == ds.targets
    first.close()
