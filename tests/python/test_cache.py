"""The decoded cache (`serve --cache decoded`, DataLoader(share_cache=); docs/views.md, "Decoded
cache") against real servers and JPEG files: every view of a cached sample is byte for byte the
view's pipeline on the cached image (the file decoded whole and shrunk, stored losslessly as a
PNG here), in every epoch; later epochs read no file (they are served after the files are
deleted); a budget holds what fits and decodes the rest from the file; nothing is left in
/dev/shm; bad options fail with their reason; a bad file is reported once.

Run: .venv/bin/python -m pytest tests/python/test_cache.py
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from typing import Dict, List

import numpy as np
import pytest

import batchcast
from batchcast import _batchcast
from views_common import CHUNK, folder, read, transform  # noqa: F401  (folder: a fixture)

EVAL_VIEW = "size=40,crop=center"


def options_of(view: str) -> "_batchcast.PipelineOptions":
    return _batchcast.View.resolve(view, _batchcast.View(transform())).options


def from_cached_image(path: str, side: int, view: str, epoch: int, index: int) -> np.ndarray:
    """The view's own pipeline on the cached image of `path`, as a lossless PNG."""
    from PIL import Image

    png = io.BytesIO()
    Image.fromarray(_batchcast.decode_shrunk(path, side)).save(png, format="PNG")
    return _batchcast.ImagePipeline(options_of(view)).process_bytes(png.getvalue(), path, epoch,
                                                                    index)


def from_file(path: str, view: str, epoch: int, index: int) -> np.ndarray:
    return _batchcast.ImagePipeline(options_of(view)).process(path, epoch, index)


def serve_cached(root: str, endpoint: str, **kw):
    """One worker: with two, a sample of the next epoch may be decoded while its first decode is
    still filling the cache (both correct; the counts below would then depend on timing)."""
    return batchcast.serve(root, endpoint, CHUNK, transform=transform(), shuffle=False, workers=1,
                           cache="decoded", **kw)


def read_in_turn(endpoint: str, epochs: int, between=lambda: None) -> Dict[str, List]:
    """Each epoch read by a Loader of the server's own view ("") and one of EVAL_VIEW in turn,
    `between()` after each epoch; their epochs by view."""
    loaders = {"": batchcast.Loader(endpoint, batch_size=CHUNK, timeout=60),
               EVAL_VIEW: batchcast.Loader(endpoint, batch_size=CHUNK, timeout=60,
                                           view=EVAL_VIEW)}
    out: Dict[str, List] = {view: [] for view in loaders}
    try:
        for _ in range(epochs):
            for view, loader in loaders.items():
                out[view] += read(loader, 1)
            between()
    finally:
        for loader in loaders.values():
            loader.close()
    return out


def cache_segments() -> list:
    return [n for n in os.listdir("/dev/shm") if n.startswith("batchcast-cache-")]


def test_views_come_from_the_cached_image_and_later_epochs_read_no_file(folder, endpoint,
                                                                       tmp_path):
    root = str(tmp_path / "photos")
    shutil.copytree(folder, root)
    entries = _batchcast.Dataset.image_folder(root).entries
    with serve_cached(root, endpoint, epochs=3, cache_side=100, views=[EVAL_VIEW],
                      metrics_dir=str(tmp_path / "m")) as server:
        def after_the_first_epoch() -> None:
            if os.path.isdir(root):
                assert not cache_segments(), "the cache's segment is unlinked as it is made"
                shutil.rmtree(root)  # every sample is cached once the first epoch is read

        epochs = read_in_turn(endpoint, 3, after_the_first_epoch)
        assert server.wait(30) == 0
    shutil.copytree(folder, root)  # the reference reads the files
    for view, per_epoch in epochs.items():
        for epoch, samples in enumerate(per_epoch):
            assert len(samples) == len(entries)
            for index, (pixels, label) in enumerate(samples):
                path, want_label = entries[index]
                assert label == want_label
                want = from_cached_image(path, 100, view or transform_view(), epoch, index)
                assert np.array_equal(pixels, want), \
                    f"view {view!r}, epoch {epoch}, sample {index}: not the cached image's view"
    summary = json.load(open(tmp_path / "m" / "summary.json"))
    cache = summary["cache"]
    assert cache["images"] == len(entries)
    assert cache["misses"] == len(entries) and cache["hits"] == 2 * len(entries)
    assert summary["samples_decoded"] == 3 * len(entries)


def transform_view() -> str:
    return _batchcast.View(transform()).text()


def test_a_late_joiner_and_a_resumed_reader_read_the_cached_images(folder, endpoint, tmp_path):
    """After the first epoch filled the cache and the files are gone, a reader that joins late
    (its catch-up chunks regenerated for it alone) and one resumed mid-epoch read every sample
    from the cache, in their own view."""
    root = str(tmp_path / "photos")
    shutil.copytree(folder, root)
    entries = _batchcast.Dataset.image_folder(root).entries
    with serve_cached(root, endpoint, epochs=3, cache_side=100) as server:
        first = batchcast.Loader(endpoint, batch_size=CHUNK, timeout=60)
        read(first, 1)
        shutil.rmtree(root)
        late = batchcast.Loader(endpoint, batch_size=CHUNK, timeout=60, view=EVAL_VIEW)
        late.load_state_dict({"epoch": 1, "sample": 2 * CHUNK})  # resumed inside epoch 1
        resumed = read(late, 1)[0]
        rest = read(first, 2)
        whole = read(late, 1)[0]  # epoch 2, whole
        first.close()
        late.close()
        assert server.wait(30) == 0
    shutil.copytree(folder, root)
    assert [i for _, i in resumed] == [entries[k][1] for k in range(2 * CHUNK, len(entries))]
    for epoch, samples, start in ((1, resumed, 2 * CHUNK), (2, whole, 0)):
        for k, (pixels, _) in enumerate(samples):
            index = start + k
            want = from_cached_image(entries[index][0], 100, EVAL_VIEW, epoch, index)
            assert np.array_equal(pixels, want), (epoch, index)
    assert all(len(e) == len(entries) for e in rest)


def test_a_budget_keeps_what_fits_and_decodes_the_rest_from_the_file(folder, endpoint,
                                                                     tmp_path):
    entries = _batchcast.Dataset.image_folder(folder).entries
    budget = 3 * 64 * 86 * 3  # about three images at 64 px
    with serve_cached(folder, endpoint, epochs=2, cache_side=64, cache_memory=budget,
                      metrics_dir=str(tmp_path / "m")) as server:
        loader = batchcast.Loader(endpoint, batch_size=CHUNK, timeout=60)
        first, second = read(loader, 2)
        loader.close()
        assert server.wait(30) == 0
    cache = json.load(open(tmp_path / "m" / "summary.json"))["cache"]
    assert 1 <= cache["images"] < len(entries) and cache["bytes"] <= cache["capacity_bytes"]
    assert cache["capacity_bytes"] == budget
    view = transform_view()
    from_cache = 0
    for index, (pixels, _) in enumerate(second):
        path = entries[index][0]
        cached = np.array_equal(pixels, from_cached_image(path, 64, view, 1, index))
        assert cached or np.array_equal(pixels, from_file(path, view, 1, index)), \
            f"sample {index}: neither the cached image's view nor the file's"
        from_cache += cached
    assert from_cache == cache["images"], "the second epoch made from the cache what it holds"
    assert cache["hits"] == cache["images"]  # the first epoch filled, the second hit
    assert cache["misses"] == 2 * len(entries) - cache["images"]
    assert len(first) == len(entries)


def test_a_view_larger_than_the_cached_images_is_decoded_from_the_files_and_said(
        folder, endpoint, tmp_path, batchcast_bin):
    entries = _batchcast.Dataset.image_folder(folder).entries
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [batchcast_bin, "serve", "--data", folder, "--endpoint", endpoint, "--batch-size",
             str(CHUNK), "--no-shuffle", "--epochs", "2", "--workers", "1", "--image-size", "56",
             "--output", "uint8", "--seed", "7", "--view", EVAL_VIEW, "--cache", "decoded",
             "--cache-side", "50"], stdout=out, stderr=out)
        try:
            epochs = read_in_turn(endpoint, 2)
            assert proc.wait(30) == 0
        finally:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert text.count("larger than the decoded cache's images") == 1, text[-3000:]
    assert "--cache-side 56" in text
    for epoch in range(2):
        for index, (path, _) in enumerate(entries):
            assert np.array_equal(epochs[""][epoch][index][0],
                                  from_file(path, transform_view(), epoch, index))
            assert np.array_equal(epochs[EVAL_VIEW][epoch][index][0],
                                  from_cached_image(path, 50, EVAL_VIEW, epoch, index))


def test_bad_options_fail_with_their_reason(batchcast_bin, folder):
    run = subprocess.run([batchcast_bin, "serve", "--synthetic", "10", "--cache", "decoded"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "--synthetic has none: drop --cache" in run.stderr
    run = subprocess.run([batchcast_bin, "serve", "--data", folder, "--cache", "sometimes"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "sometimes" in run.stderr and "decoded" in run.stderr
    import torch.utils.data
    import torchvision

    dataset = torchvision.datasets.ImageFolder(folder, transform=torchvision.transforms.ToTensor())
    with pytest.raises(ValueError, match="'sideways' is not one of decoded, off"):
        batchcast.DataLoader(dataset, batch_size=4, share="cache-bad", share_cache="sideways")
    with pytest.raises(ValueError, match="without share= there is no stream"):
        batchcast.DataLoader(dataset, batch_size=4, share_cache="decoded")


def test_a_bad_file_is_reported_once_and_skipped_every_epoch(folder, endpoint, tmp_path,
                                                            batchcast_bin):
    root = str(tmp_path / "photos")
    shutil.copytree(folder, root)
    entries = _batchcast.Dataset.image_folder(root).entries
    bad = entries[4][0]
    with open(bad, "r+b") as f:  # cut: no end-of-image marker
        f.truncate(os.path.getsize(bad) // 2)
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [batchcast_bin, "serve", "--data", root, "--endpoint", endpoint, "--batch-size",
             str(CHUNK), "--no-shuffle", "--epochs", "3", "--workers", "2", "--image-size", "56",
             "--cache", "decoded", "--on-error", "skip"], stdout=out, stderr=out)
        try:
            loader = batchcast.Loader(endpoint, batch_size=CHUNK, timeout=60)
            for samples in read(loader, 3):
                assert len(samples) == len(entries)  # replaced, as without a cache
            loader.close()
            assert proc.wait(30) == 0
        finally:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert text.count("skipped bad sample") == 1 and bad in text, text[-3000:]
    assert "3 bad samples skipped" in text, text[-3000:]


@pytest.mark.parametrize("decoder", ["nvjpeg", "mixed", "cpu"])
def test_a_gpu_pool_makes_its_views_from_the_cache(folder, endpoint, tmp_path, decoder):
    """On the GPU: the kernel crops every view from the cached image (within the GPU resize's
    tolerance of the CPU pipeline on that image), and later epochs read no file."""
    from views_common import read_cpu, serve_gpu, needs_gpu  # noqa: F401

    import torch
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda is not available")
    root = str(tmp_path / "photos")
    shutil.copytree(folder, root)
    entries = _batchcast.Dataset.image_folder(root).entries
    with serve_gpu(root, endpoint, decoder=decoder, epochs=2, cache="decoded", cache_side=100,
                   workers=1,
                   metrics_dir=str(tmp_path / "m")) as server:
        loader = batchcast.Loader(endpoint, batch_size=CHUNK, timeout=60)
        first = read_cpu(loader, 1)[0]
        shutil.rmtree(root)
        second = read_cpu(loader, 1)[0]
        loader.close()
        assert server.wait(30) == 0
    shutil.copytree(folder, root)
    view = transform_view()
    for epoch, samples in enumerate((first, second)):
        assert len(samples) == len(entries)
        for index, (pixels, label) in enumerate(samples):
            assert label == entries[index][1]
            want = from_cached_image(entries[index][0], 100, view, epoch, index)
            assert np.abs(pixels.astype(np.float32) - want).mean() < 3.0, (epoch, index)
    cache = json.load(open(tmp_path / "m" / "summary.json"))["cache"]
    assert cache["images"] == len(entries) and cache["hits"] == len(entries)
