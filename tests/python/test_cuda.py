"""GPU pools from Python: ``batchcast serve --device cuda:0`` (CPU or nvJPEG decoding) and two
Loader consumer processes.

GPU tests are skipped (with the reason) where torch sees no CUDA device or the build has no
CUDA/nvJPEG support; the command-line errors of a machine without a GPU are tested everywhere.
Run on the GPU machine (scripts/README.md): /tmp/v/bin/python -m pytest tests/python/test_cuda.py
Synthetic sample i: "#0" = uint8 bytes synthetic_byte(i, j), "#1" = int64 label i.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import threading

import numpy as np
import pytest
import torch

import batchcast
from conftest import in_threads_per_job_and_rank, photo_like, synthetic_rows, watch_endpoint

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="no CUDA device: torch.cuda is not available")

SAMPLE_BYTES = 2048
SAMPLES_PER_EPOCH = 320

CONSUMER = textwrap.dedent(
    """
    import hashlib, sys, torch, batchcast
    from conftest import synthetic_rows
    loader = batchcast.Loader(sys.argv[1], timeout=60)
    out = []
    for x, y in (batch for _ in range(2) for batch in loader):  # 2 epochs
        assert x.is_cuda and y.is_cuda, (x.device, y.device)
        # Slow work queued on the current stream, then the batch is dropped at once: its slot
        # must not be rewritten before that work has run.
        torch.cuda._sleep(200000)
        want = synthetic_rows(y, x.shape[1])
        same = (x == want).all()
        digest = x.to("cpu", non_blocking=True)
        del x, y
        torch.cuda.current_stream().synchronize()
        assert bool(same), "payload does not match its label"
        out.append(hashlib.sha1(digest.numpy().tobytes()).hexdigest())
    print(len(out), hashlib.sha1(" ".join(out).encode()).hexdigest())
    """
)


@needs_gpu
def test_two_loader_processes_share_gpu_batches(endpoint, batchcast_bin, run_py):
    try:
        server = batchcast.serve(synthetic=300, sample_bytes=SAMPLE_BYTES, endpoint=endpoint,
                                 batch_size=32, epochs=2, workers=2, ring=4, device="cuda:0",
                                 min_consumers=2)
    except Exception as e:  # a CPU-only build refuses --device cuda at once
        if "no CUDA support" in str(e):
            pytest.skip(f"this build has no CUDA support: {e}")
        raise
    with server:
        a = run_py(CONSUMER, endpoint)
        b = run_py(CONSUMER, endpoint)
        out_a, err_a = a.communicate(timeout=120)
        out_b, err_b = b.communicate(timeout=120)
        assert a.returncode == 0, err_a.decode()
        assert b.returncode == 0, err_b.decode()
        assert out_a == out_b
        assert out_a.split()[0] == str(2 * ((300 + 31) // 32)).encode()
        assert server.wait(30) == 0


# --- nvJPEG decoding (serve --decoder nvjpeg) ------------------------------------------------

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


def serve_or_skip(**kwargs):
    try:
        return batchcast.serve(**kwargs)
    except batchcast.BatchcastError as e:
        if "no CUDA support" in str(e) or "no nvJPEG" in str(e):
            pytest.skip(f"this build cannot decode on the GPU: {e}")
        raise


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
    # as they can and one worker make the consumers wait, and so the engine take the rest of the
    # chunks they wait for, likely; nothing asserted depends on it.
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
    # waits on the stream, so the engine decodes the samples of the chunk it waits for that no
    # worker had started, while the workers decode the next chunk themselves (chunks of CPU
    # squares and nvJPEG samples both). Image i is a flat grey of level 20 + 3 i in class
    # i % 4, so its pixels name it whichever side decoded it: every epoch must hold each image
    # exactly once, whole (flat), with its own label. The split is printed, not asserted (it
    # depends on timing); what is asserted holds for any split.
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


# --- device identity: --device by UUID (MIG instances) ------------------------------------------

def test_device_takes_gpu_and_mig_uuids_and_refuses_an_unseen_one_naming_the_fix(endpoint):
    with pytest.raises(batchcast.BatchcastError, match=r"MIG-<uuid> from nvidia-smi -L"):
        batchcast.serve(synthetic=8, endpoint=endpoint, device="MIG-GPU-" + "1" * 8 + "/1/0")
    with pytest.raises(batchcast.BatchcastError, match=r"cuda:K .*MIG-<uuid>"):
        batchcast.serve(synthetic=8, endpoint=endpoint, device="MIG-12")
    # Well formed but not this machine's: refused before anything starts, naming the fix (a
    # CPU-only build says it has no CUDA; a CUDA build lists its devices and the variable).
    unseen = "MIG-11111111-2222-3333-4444-555555555555"
    with pytest.raises(batchcast.BatchcastError,
                       match=rf"no CUDA support|CUDA_VISIBLE_DEVICES={unseen}"):
        batchcast.serve(synthetic=8, endpoint=endpoint, device=unseen)


# --- pin_memory: host pools copied to the GPU from page-locked memory -------------------------

@needs_gpu
def test_loaders_catching_up_together_on_a_gpu_pool_read_intact_copies(endpoint, batchcast_bin):
    # test_loader's lockstep catch-up on a GPU pool: three loaders join mid-epoch at once, catch
    # up on private chunks read in lockstep (the leader in a thread of its own) and keep
    # every batch. Each private chunk is copied device to device as it arrives
    # (client/chunk_copy.h): its slot goes back once the copy has run, its batches wait for the
    # copy on the user's stream, and the copy lives as long as they do.
    server = serve_or_skip(synthetic=400, sample_bytes=SAMPLE_BYTES, endpoint=endpoint,
                           batch_size=4, epochs=2, workers=2, ring=16, device="cuda:0")
    with server:
        loaders = [batchcast.Loader(endpoint, timeout=60)]
        lead = iter(loaders[0])
        head = [y.cpu() for _, y in (next(lead) for _ in range(40))]  # the ring lost chunk 0
        loaders += [batchcast.Loader(endpoint, timeout=60) for _ in range(3)]
        kept = [[[], []] for _ in loaders]  # per loader, per epoch: every batch, kept

        def in_lockstep(epoch: int, batches: dict) -> None:
            while batches:  # one batch of each in turn, as zip() does
                for k, it in list(batches.items()):
                    batch = next(it, None)
                    if batch is None:
                        del batches[k]
                    else:
                        kept[k][epoch].append(batch)

        leader = threading.Thread(target=lambda: kept[0][0].extend(lead))
        leader.start()
        in_lockstep(0, {k: iter(loaders[k]) for k in (1, 2, 3)})
        leader.join(120)
        assert not leader.is_alive()
        in_lockstep(1, {k: iter(loader) for k, loader in enumerate(loaders)})
        torch.cuda.synchronize()
        assert all(x.is_cuda and torch.equal(x, synthetic_rows(y, SAMPLE_BYTES))
                   for per_epoch in kept for x, y in per_epoch[0] + per_epoch[1]), "a bad batch"
        labels = [[torch.cat([y for _, y in batches]).cpu().tolist() for batches in per_epoch]
                  for per_epoch in kept]
        whole = torch.cat(head).tolist() + labels[0][0]
        assert sorted(whole) == list(range(400))
        for k in (1, 2, 3):
            assert labels[k] == [whole, labels[0][1]], f"joiner {k} differs from the leader"
        kept.clear()  # a GPU pool's server exits once every batch is released
        for loader in loaders:
            loader.close()
        assert server.wait(30) == 0
        with open(server.log_path) as log:
            caught_up = log.read().count("chunks regenerated for it until it reaches the stream")
        assert caught_up == 3, "each joiner caught up on private chunks"


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the machine without a GPU")
def test_pin_memory_without_cuda_is_ignored_with_one_log_line(endpoint, batchcast_bin, caplog):
    with batchcast.serve(synthetic=40, sample_bytes=64, endpoint=endpoint, batch_size=16,
                         epochs=1, workers=1) as server:
        with caplog.at_level("INFO", logger="batchcast"):
            loader = batchcast.Loader(endpoint, pin_memory=True, timeout=60)
            batches = [(x.clone(), y.clone()) for x, y in loader]
        loader.close()
        assert server.wait(30) == 0
    notes = [r.getMessage() for r in caplog.records if "pin_memory" in r.getMessage()]
    assert notes == ["pin_memory=True is ignored: no CUDA device is usable"], notes
    assert sum(len(y) for _, y in batches) == 40
    assert all(torch.equal(x, synthetic_rows(y, 64)) for x, y in batches)


@needs_gpu
@pytest.mark.parametrize("batch_size", [32, 48], ids=["views", "copies"])
def test_pin_memory_copies_reach_the_gpu_intact_before_the_slot_is_reused(
        endpoint, batchcast_bin, batch_size):
    # Each copy is queued behind ~30 ms of GPU sleep and nothing waits for the GPU until the
    # end, while the host reads on: a slot released before its copy ran would be rewritten at
    # once in a ring of 3, and the batch copied late would not match its label.
    with batchcast.serve(synthetic=400, sample_bytes=4096, endpoint=endpoint, batch_size=32,
                         epochs=1, workers=2, ring=3) as server:
        loader = batchcast.Loader(endpoint, batch_size=batch_size, device="cuda:0",
                                  pin_memory=True, timeout=60)
        kept = []
        for x, y in loader:
            assert x.is_cuda and y.is_cuda
            kept.append((x, y))
            torch.cuda._sleep(50_000_000)  # the next batch's copy waits behind this
        torch.cuda.synchronize()
        assert all(torch.equal(x, synthetic_rows(y, 4096)) for x, y in kept), "a copy was late"
        seen = sum(len(y) for _, y in kept)
        print(f"batch {batch_size}: {len(kept)} batches, {loader.stats.copies} private copies")
        loader.close()
        assert seen == 400
        assert server.wait(30) == 0


@needs_gpu
def test_pin_memory_page_locks_the_mapping_or_says_why(endpoint, batchcast_bin, capfd):
    from batchcast import _batchcast

    with batchcast.serve(synthetic=64, sample_bytes=256, endpoint=endpoint, batch_size=32,
                         epochs=1, workers=1) as server:
        consumer = _batchcast.Consumer(endpoint, cuda_device=0, pin_memory=True)
        batch = consumer.next()
        pinned, copied = batch.pinned, batch.copied
        del batch
        while consumer.next() is not None:
            pass
        consumer.close()
        assert server.wait(30) == 0
    err = capfd.readouterr().err
    print(f"pool page-locked in place: {pinned}")
    assert not copied
    # Either the read-only mapping was registered, or the consumer said once why not.
    assert pinned or err.count("stays pageable") == 1, err


# --- one server for every GPU of a node (serve --device all) ------------------------------------
# On one GPU these run the same code paths with the pool on that GPU alone; on a multi-GPU
# machine every GPU has consumers of its own.

ON_DEVICE = textwrap.dedent(
    """
    import hashlib, sys, torch, batchcast
    from conftest import synthetic_rows
    device = sys.argv[2]
    torch.cuda.set_device(device)
    loader = batchcast.Loader(sys.argv[1], device=device, timeout=60)
    out, labels = [], []
    for x, y in loader:
        assert x.device == torch.device(device), (x.device, device)
        want = synthetic_rows(y, x.shape[1])
        assert bool((x == want).all()), "payload does not match its label"
        out.append(hashlib.sha1(x.cpu().numpy().tobytes()).hexdigest())
        labels += y.tolist()
    print(len(labels), sorted(labels) == list(range(300)),
          hashlib.sha1(" ".join(out).encode()).hexdigest())
    """
)


@needs_gpu
def test_one_server_on_every_gpu_serves_each_gpus_consumers_the_same_bytes(
        endpoint, batchcast_bin, run_py):
    gpus = torch.cuda.device_count()
    consumers = [f"cuda:{k}" for k in range(gpus) for _ in range(2)]  # two per GPU
    with serve_or_skip(synthetic=300, sample_bytes=SAMPLE_BYTES, endpoint=endpoint,
                       batch_size=32, epochs=1, workers=2, ring=4, device="all",
                       min_consumers=len(consumers)) as server:
        procs = [run_py(ON_DEVICE, endpoint, device) for device in consumers]
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()[-3000:]
            outs.append(out.split())
        assert server.wait(30) == 0, server.log_tail()
        log = server.log_tail(50)
    assert all(o[:2] == [b"300", b"True"] for o in outs), outs  # the whole epoch, each
    assert len({o[2] for o in outs}) == 1, outs  # identical bytes on every GPU
    if gpus > 1:
        assert f"the pool is on {gpus} GPUs" in log, log


@needs_gpu
def test_every_rank_server_on_gpus_gives_each_rank_its_shard_on_its_gpu(endpoint, batchcast_bin):
    # serve --every-rank --device all: rank r's pool is on GPU r mod G; rank r of job A and of job
    # B read the same bytes there, and the two ranks' shards cover the epoch once.
    gpus = torch.cuda.device_count()
    for r in range(2):
        watch_endpoint(batchcast.rank_endpoint(endpoint, r))
    with serve_or_skip(synthetic=SAMPLES_PER_EPOCH, sample_bytes=SAMPLE_BYTES,
                       endpoint=endpoint, batch_size=16, epochs=1, workers=2, ring=4,
                       world_size=2, every_rank=True, min_consumers=2, device="all") as server:
        def read(job: str, rank: int) -> tuple:
            device = f"cuda:{rank % gpus}"
            torch.cuda.set_device(device)
            with batchcast.Loader(endpoint, rank=rank, device=device, timeout=60) as loader:
                xs, ys = [], []
                for x, y in loader:
                    assert x.device == torch.device(device), (x.device, device)
                    assert torch.equal(x, synthetic_rows(y, SAMPLE_BYTES)), "a bad batch"
                    xs.append(x.cpu())
                    ys.append(y.cpu())
                return torch.cat(xs), torch.cat(ys)

        seen = in_threads_per_job_and_rank(read)
        assert server.wait(30) == 0, server.log_tail()
    assert len(seen) == 4, "a reader failed (see its exception above)"
    for rank in range(2):
        assert torch.equal(seen["A", rank][0], seen["B", rank][0])  # the jobs share rank r
    both = torch.cat([seen["A", 0][1], seen["A", 1][1]]).tolist()
    assert sorted(both) == list(range(SAMPLES_PER_EPOCH))  # disjoint shards, the whole epoch
