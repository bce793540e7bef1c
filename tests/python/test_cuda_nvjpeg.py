"""nvJPEG decoding from Python (``batchcast serve --device cuda:0 --decoder nvjpeg|mixed``) read by
Loader consumer processes: agreement with the CPU decoder, the mixed decoder's bytes and whole
epochs, other formats through the CPU decode, float output, bad files skipped and counted.

GPU tests are skipped (with the reason) where torch sees no CUDA device or the build has no
CUDA/nvJPEG support; the command-line error of a pool without a GPU is tested everywhere.
Run on the GPU machine (scripts/README.md): python3 -m pytest tests/python/test_cuda_nvjpeg.py
"""

from __future__ import annotations

import json
import os
import re
import textwrap

import numpy as np
import pytest
import torch

import batchcast
from conftest import photo_like, watch_endpoint
from cuda_common import needs_gpu, serve_or_skip


MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)

DUMP = textwrap.dedent(
    """
    import sys, torch, batchcast
    xs, ys = [], []
    for x, y in batchcast.Loader(sys.argv[1], timeout=60):
        xs.append(x.cpu())
        ys.append(y.cpu())
    torch.save((torch.cat(xs), torch.cat(ys)), sys.argv[2])
    """
)


@pytest.fixture()
def jpeg_folder(tmp_path):
    """An ImageFolder of varied JPEGs: sizes, 4:2:0/4:4:4, progressive, grayscale, CMYK."""
    from PIL import Image

    root = tmp_path / "jpegs"
    kinds = [
        (500, 375, {}), (375, 500, {"subsampling": 0}), (1024, 683, {}), (300, 300, {}),
        (640, 480, {"progressive": True}), (333, 222, {"subsampling": 1}), (800, 600, {}),
        (256, 700, {}), (450, 450, {"gray": True}), (420, 300, {"cmyk": True}),
    ]
    for i, (w, h, opts) in enumerate(kinds * 3):
        img = Image.fromarray(photo_like(w, h, i))
        if opts.pop("gray", False):
            img = img.convert("L")
        if opts.pop("cmyk", False):
            img = img.convert("CMYK")
        path = root / f"class{i % 3}" / f"{i:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        img.save(path, "JPEG", quality=90, **opts)
    return str(root)


def dump(run_py, endpoint, path, consumers=1):
    procs = [run_py(DUMP, endpoint, f"{path}.{k}") for k in range(consumers)]
    outs = []
    for k, p in enumerate(procs):
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
        outs.append(torch.load(f"{path}.{k}"))
    return outs


@needs_gpu
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_nvjpeg_agrees_with_the_cpu_decoder(jpeg_folder, batchcast_bin, run_py, tmp_path, train):
    common = dict(data=jpeg_folder, batch_size=8, image_size=96, output="uint8", shuffle=False,
                  seed=5, device="cuda:0", extra_args=[] if train else ["--eval"])
    results = {}
    for decoder in ("cpu", "nvjpeg"):
        ep = watch_endpoint(f"ipc:///tmp/batchcast-test-nvj-{decoder}-{os.getpid()}.sock")
        with serve_or_skip(endpoint=ep, decoder=decoder, min_consumers=2, **common) as server:
            # Two consumers of the same server: the very same bytes.
            (x, y), (x2, y2) = dump(run_py, ep, str(tmp_path / decoder), consumers=2)
            assert server.wait(30) == 0, server.log_tail()
        assert torch.equal(x, x2) and torch.equal(y, y2)
        results[decoder] = (x, y)
    (cpu_x, cpu_y), (gpu_x, gpu_y) = results["cpu"], results["nvjpeg"]
    assert gpu_x.shape == cpu_x.shape == (30, 96, 96, 3) and gpu_x.dtype == torch.uint8
    assert torch.equal(gpu_y, cpu_y)  # same order, same labels
    diff = (gpu_x.float() - cpu_x.float()).abs()
    per_image = diff.flatten(1).mean(1)
    print(f"nvJPEG vs CPU ({'train' if train else 'eval'}): mean |diff| {diff.mean():.2f}, "
          f"worst image {per_image.max():.2f}, p99 {diff.flatten().kthvalue(int(diff.numel() * 0.99)).values:.0f}")
    # Same crops and flips (a wrong crop or a missed flip costs tens of levels on these images);
    # decoders differ in IDCT, chroma upsampling and downscale filter by a few levels.
    # H100: mean 0.40 (eval) / 0.37 (train), worst image 0.57, p99 2 levels.
    assert diff.mean() < 1.0
    assert per_image.max() < 2.0


@needs_gpu
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_mixed_decoder_serves_the_cpu_decoders_bytes_or_nvjpegs(jpeg_folder, batchcast_bin,
                                                                run_py, tmp_path, train):
    # --decoder mixed: each chunk is decoded either by the CPU pipeline (then bit-identical to
    # --decoder cpu, normalisation included) or by nvJPEG (then within nvJPEG's tolerance); the
    # server counts both, and every sample is one or the other. Two consumers that read as fast
    # as they can and one worker make the consumers wait, and so the engine take chunks, likely;
    # nothing asserted depends on it.
    common = dict(data=jpeg_folder, batch_size=8, image_size=96, output="float32", shuffle=False,
                  seed=5, device="cuda:0", workers=1, ring=8,
                  extra_args=[] if train else ["--eval"])
    results, logs = {}, {}
    for decoder in ("cpu", "mixed"):
        ep = watch_endpoint(f"ipc:///tmp/batchcast-test-mix-{decoder}-{os.getpid()}.sock")
        with serve_or_skip(endpoint=ep, decoder=decoder, min_consumers=2, **common) as server:
            (x, y), (x2, y2) = dump(run_py, ep, str(tmp_path / decoder), consumers=2)
            assert server.wait(30) == 0, server.log_tail()
            logs[decoder] = server.log_tail(50)
        assert torch.equal(x, x2) and torch.equal(y, y2)
        results[decoder] = (x, y)
    (cpu_x, cpu_y), (mix_x, mix_y) = results["cpu"], results["mixed"]
    assert mix_x.shape == cpu_x.shape == (30, 3, 96, 96) and torch.equal(mix_y, cpu_y)
    counts = re.search(r"--decoder mixed: (\d+) samples decoded on the CPU, (\d+) on the GPU",
                       logs["mixed"])
    assert counts, logs["mixed"]
    on_cpu, on_engine = int(counts.group(1)), int(counts.group(2))
    assert on_cpu + on_engine == 30
    exact = sum(torch.equal(a, b) for a, b in zip(mix_x, cpu_x))
    assert exact >= on_cpu, (exact, on_cpu, on_engine)
    levels = ((mix_x - cpu_x) * STD * 255).abs()  # back to 0-255 levels
    assert levels.flatten(1).mean(1).max() < 2.0  # nvJPEG's samples: as in the test above
    print(f"mixed ({'train' if train else 'eval'}): {on_cpu} on the CPU ({exact} exact), "
          f"{on_engine} on nvJPEG")


FLAT_IMAGES, FLAT_CLASSES, FLAT_EPOCHS = 64, 4, 3

READ_FLAT = textwrap.dedent(
    """
    import json, sys, batchcast
    # Every batch as it comes, on the GPU: each image's mean level and spread, and its label.
    loader = batchcast.Loader(sys.argv[1], timeout=60)
    epochs = []
    for _ in range(int(sys.argv[2])):
        seen = []
        for x, y in loader:
            f = x.float().flatten(1)
            seen += zip(f.mean(1).tolist(), (f.max(1).values - f.min(1).values).tolist(),
                        y.tolist())
        epochs.append(seen)
    print(json.dumps(epochs))
    """
)


@needs_gpu
def test_mixed_decoder_with_one_fast_consumer_reads_whole_epochs_with_every_label_right(
        tmp_path, batchcast_bin, run_py):
    # --decoder mixed with 2 workers and one consumer that reads as fast as it can: the consumer
    # waits on the stream, so the engine decodes whole chunks while the workers decode others
    # themselves, each chunk's upload on its own side's lane. Image i is a flat grey of level
    # 20 + 3 i in class i % 4, so its pixels name it whichever side decoded it: every epoch must
    # hold each image exactly once, whole (flat), with its own label. The split is printed, not
    # asserted (it depends on timing); what is asserted holds for any split.
    from PIL import Image

    root = tmp_path / "flat"
    for i in range(FLAT_IMAGES):
        level = 20 + 3 * i
        path = root / f"class{i % FLAT_CLASSES}" / f"{i:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (1024 + 8 * i, 768), (level, level, level)).save(path, "JPEG", quality=95)
    ep = watch_endpoint(f"ipc:///tmp/batchcast-test-mixflat-{os.getpid()}.sock")
    with serve_or_skip(data=str(root), endpoint=ep, batch_size=8, image_size=96, output="uint8",
                       seed=7, device="cuda:0", decoder="mixed", workers=2,
                       epochs=FLAT_EPOCHS) as server:
        reader = run_py(READ_FLAT, ep, str(FLAT_EPOCHS))
        out, err = reader.communicate(timeout=120)
        assert reader.returncode == 0, err.decode()
        assert server.wait(30) == 0, server.log_tail()
        log = server.log_tail(50)
    counts = re.search(r"--decoder mixed: (\d+) samples decoded on the CPU, (\d+) on the GPU", log)
    assert counts, log
    on_cpu, on_engine = int(counts.group(1)), int(counts.group(2))
    assert on_cpu + on_engine == FLAT_IMAGES * FLAT_EPOCHS, log
    epochs = json.loads(out)
    assert len(epochs) == FLAT_EPOCHS
    for e, seen in enumerate(epochs):
        images = []
        for mean, spread, label in seen:
            assert spread <= 4, (e, mean, spread)  # one image, not parts of two
            i = round((mean - 20) / 3)
            assert abs(mean - (20 + 3 * i)) <= 1.2, (e, mean)
            assert label == i % FLAT_CLASSES, (e, i, label)
            images.append(i)
        assert sorted(images) == list(range(FLAT_IMAGES)), (e, sorted(images))
    print(f"mixed, one consumer, 2 workers: {on_cpu} samples on the CPU, {on_engine} on nvJPEG")


@needs_gpu
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_nvjpeg_serves_other_formats_through_the_cpu_decode(tmp_path, batchcast_bin, run_py,
                                                            train):
    # nvJPEG reads JPEG only: PNG (RGB, gray, palette, RGBA, 16-bit), BMP, TIFF, WebP and PPM
    # samples are decoded whole on the CPU (as --decoder cpu decodes them), then cropped and
    # resized by the same GPU kernel; nothing is refused, and they agree with --decoder cpu.
    from PIL import Image

    root = tmp_path / "formats"
    kinds = [("png", "RGB"), ("png", "L"), ("png", "P"), ("png", "RGBA"), ("png", "I;16"),
             ("bmp", "RGB"), ("tiff", "RGB"), ("webp", "RGB"), ("ppm", "RGB"), ("jpg", "RGB")]
    for i, (ext, mode) in enumerate(kinds * 2):
        img = Image.fromarray(photo_like(320 + 16 * i, 240 + 8 * i, i))
        if mode == "I;16":
            img = Image.fromarray(np.asarray(img.convert("L"), dtype=np.uint16) * 3 // 2)
        elif mode == "P":
            img = img.quantize(64)
        elif mode != "RGB":
            img = img.convert(mode)
        path = root / f"class{i % 2}" / f"{i:03d}.{ext}"
        path.parent.mkdir(parents=True, exist_ok=True)
        img.save(path, **({"lossless": True} if ext == "webp" else {}))
    common = dict(data=str(root), batch_size=4, image_size=64, output="uint8", shuffle=False,
                  seed=3, device="cuda:0", extra_args=[] if train else ["--eval"])
    results = {}
    for decoder in ("cpu", "nvjpeg"):
        ep = watch_endpoint(f"ipc:///tmp/batchcast-test-nvfmt-{decoder}-{os.getpid()}.sock")
        with serve_or_skip(endpoint=ep, decoder=decoder, **common) as server:
            ((x, y),) = dump(run_py, ep, str(tmp_path / decoder))
            assert server.wait(30) == 0, server.log_tail()
            log = server.log_tail(50)
            assert " 0 bad samples skipped" in log and "skipped bad sample" not in log, log
        results[decoder] = (x, y)
    (cpu_x, cpu_y), (gpu_x, gpu_y) = results["cpu"], results["nvjpeg"]
    assert gpu_x.shape == cpu_x.shape == (20, 64, 64, 3) and torch.equal(gpu_y, cpu_y)
    per_image = (gpu_x.float() - cpu_x.float()).abs().flatten(1).mean(1)
    print(f"other formats, nvjpeg vs cpu ({'train' if train else 'eval'}): per-image mean "
          f"|diff| {[round(v, 2) for v in per_image.tolist()]}")
    # CPU-decoded samples differ only by the GPU kernel's bilinear rounding against
    # cv::resize's fixed point (a wrong crop, flip or channel order costs tens of levels).
    assert per_image.max() < 1.0


@needs_gpu
def test_nvjpeg_float_output_is_the_normalised_uint8(jpeg_folder, batchcast_bin, run_py, tmp_path):
    outs = {}
    for output in ("uint8", "float32"):
        ep = watch_endpoint(f"ipc:///tmp/batchcast-test-nvf-{output}-{os.getpid()}.sock")
        with serve_or_skip(data=jpeg_folder, endpoint=ep, batch_size=16, image_size=64,
                           output=output, seed=1, device="cuda:0", decoder="nvjpeg") as server:
            (outs[output],) = dump(run_py, ep, str(tmp_path / output))
            assert server.wait(30) == 0, server.log_tail()
    u8, f32 = outs["uint8"][0], outs["float32"][0]
    assert f32.shape == (30, 3, 64, 64) and f32.dtype == torch.float32
    want = (u8.permute(0, 3, 1, 2).float() / 255 - MEAN) / STD
    assert torch.allclose(f32, want, atol=1e-6)


@needs_gpu
@pytest.mark.parametrize("decoder", ["nvjpeg", "mixed"])
def test_nvjpeg_bad_files_are_skipped_and_counted(jpeg_folder, batchcast_bin, run_py, tmp_path,
                                                  decoder):
    # mixed: the files are checked before the split, so the same files are refused whichever
    # side decodes their chunk.
    bad = os.path.join(jpeg_folder, "class0")
    with open(os.path.join(jpeg_folder, "class0", "000.jpg"), "rb") as f:
        data = f.read()
    with open(os.path.join(bad, "truncated.jpg"), "wb") as f:
        f.write(data[: len(data) // 2])
    with open(os.path.join(bad, "text.jpg"), "wb") as f:
        f.write(b"not an image at all")
    ep = watch_endpoint(f"ipc:///tmp/batchcast-test-nvbad-{os.getpid()}.sock")
    with serve_or_skip(data=jpeg_folder, endpoint=ep, batch_size=8, image_size=32, seed=2,
                       device="cuda:0", decoder=decoder, extra_args=["--on-error", "skip"]) as server:
        ((x, y),) = dump(run_py, ep, str(tmp_path / "bad"))
        assert server.wait(30) == 0, server.log_tail()
        log = server.log_tail(50)
    assert x.shape[0] == 32  # every position served
    # Each failed attempt counts: a bad file drawn again as a replacement counts again.
    skipped = re.search(r"(\d+) bad samples skipped", log)
    assert skipped and int(skipped.group(1)) >= 2, log
    assert "truncated JPEG" in log and "not an image (unrecognised file signature)" in log, log


def test_nvjpeg_without_a_gpu_pool_is_a_clear_error(jpeg_folder, batchcast_bin, endpoint):
    with pytest.raises(batchcast.BatchcastError, match=r"add --device cuda:K"):
        batchcast.serve(data=jpeg_folder, endpoint=endpoint, decoder="nvjpeg")
    with pytest.raises(batchcast.BatchcastError, match=r"--decoder: gpu not in \{cpu,mixed,nvjpeg\}"):
        batchcast.serve(data=jpeg_folder, endpoint=endpoint, decoder="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(batchcast.BatchcastError,
                           match=r"no CUDA device is usable|no CUDA support|no nvJPEG"):
            batchcast.serve(data=jpeg_folder, endpoint=endpoint, device="cuda:0", decoder="nvjpeg")
