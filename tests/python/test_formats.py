"""Every image format torchvision's ImageFolder accepts, served by `batchcast serve` and compared
with torchvision's ImageFolder (PIL's Image.open + convert("RGB")) sample by sample: PNG (RGB,
gray, 1-bit, palette, RGBA, gray + alpha, 16-bit), BMP (RGB, gray, palette), PPM, PGM (8 and 16
bits), TIFF (RGB, gray, RGBA, CMYK, 16-bit), WebP (lossless, lossy, with alpha), JPEG (RGB, gray,
CMYK) and files whose extension names another format (recognised by content).

Tolerance (decoders/README.md, "Other formats"): with no resize involved (the shorter side is
already Resize's size), every sample equals torchvision's exactly; with a resize, they differ by
the bilinear filter only (cv::resize has no antialias filter), as JPEGs do.

Run: .venv/bin/python -m pytest tests/python/test_formats.py
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torchvision
import torchvision.transforms as T
from PIL import Image

import batchcast
import batchcast._batchcast as bc

SIZE = 64  # CenterCrop
RESIZE = 72  # Resize: the shorter side


def picture(width: int, height: int, seed: int) -> np.ndarray:
    """A photo-like RGB array: smooth structure at several scales plus mild noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    channels = []
    for c in range(3):
        wave = 60 * np.sin(x / (7 + 3 * c + seed % 5)) * np.cos(y / (11 + 2 * c))
        channels.append(128 + wave + 50 * (x / width - y / height) + rng.normal(0, 6, x.shape))
    return np.clip(np.stack(channels, axis=-1), 0, 255).astype(np.uint8)


def write_pgm16(path: str, values: np.ndarray) -> None:
    with open(path, "wb") as f:
        f.write(b"P5\n%d %d\n65535\n" % (values.shape[1], values.shape[0]))
        f.write(values.astype(">u2").tobytes())


def make_folder(root: str, shorter: int) -> list[str]:
    """Writes one file per kind (shorter side `shorter`, landscape and portrait alternating) under
    root/<kind's class>/; returns the kinds in ImageFolder order."""
    kinds = {
        # name: (extension, how to make the PIL image from an RGB one, save arguments)
        "png_rgb": ("png", lambda im: im, {}),
        "png_gray": ("png", lambda im: im.convert("L"), {}),
        "png_1bit": ("png", lambda im: im.convert("1"), {}),
        "png_palette": ("png", lambda im: im.quantize(37), {"transparency": 3}),
        "png_rgba": ("png", lambda im: with_alpha(im), {}),
        "png_gray_alpha": ("png", lambda im: with_alpha(im).convert("LA"), {}),
        "png_16bit": ("png", lambda im: gray16(im), {}),
        "bmp_rgb": ("bmp", lambda im: im, {}),
        "bmp_gray": ("bmp", lambda im: im.convert("L"), {}),
        "bmp_palette": ("bmp", lambda im: im.quantize(200), {}),
        "ppm": ("ppm", lambda im: im, {}),
        "pgm": ("pgm", lambda im: im.convert("L"), {}),
        "tiff_rgb": ("tiff", lambda im: im, {"compression": "tiff_lzw"}),
        "tiff_gray": ("tif", lambda im: im.convert("L"), {}),
        "tiff_rgba": ("tiff", lambda im: with_alpha(im), {}),
        "tiff_cmyk": ("tif", lambda im: im.convert("CMYK"), {}),
        "tiff_16bit": ("tiff", lambda im: gray16(im), {}),
        "webp_lossless": ("webp", lambda im: im, {"lossless": True}),
        "webp_lossy": ("webp", lambda im: im, {"quality": 80}),
        "webp_alpha": ("webp", lambda im: with_alpha(im), {"quality": 80}),
        "jpeg_rgb": ("jpg", lambda im: im, {"quality": 90}),
        "jpeg_gray": ("jpeg", lambda im: im.convert("L"), {"quality": 90}),
        "jpeg_cmyk": ("jpg", lambda im: im.convert("CMYK"), {"quality": 90}),
        # Recognised by content: a PNG named .jpg, a JPEG named .png (ImageNet has both kinds).
        "png_named_jpg": ("jpg", lambda im: im, {"format": "PNG"}),
        "jpeg_named_png": ("png", lambda im: im, {"format": "JPEG", "quality": 90}),
    }
    for i, (name, (ext, make, save_args)) in enumerate(kinds.items()):
        w, h = (shorter + 9 + i, shorter) if i % 2 else (shorter, shorter + 13 + i)
        folder = os.path.join(root, name)
        os.makedirs(folder)
        image = make(Image.fromarray(picture(w, h, i)))
        image.save(os.path.join(folder, f"img.{ext}"), **save_args)
    # A 16-bit PGM (Pillow writes none): values up to 400, so some clip in PIL's mode "I".
    os.makedirs(os.path.join(root, "pgm_16bit"))
    gray = np.asarray(Image.fromarray(picture(shorter + 5, shorter, 99)).convert("L"))
    write_pgm16(os.path.join(root, "pgm_16bit", "img.pgm"), gray.astype(np.uint16) * 400 // 255)
    return sorted(os.listdir(root))


def with_alpha(im: Image.Image) -> Image.Image:
    """RGBA with alpha varying from 0 (where the colour must still come through) to 255."""
    alpha = Image.fromarray((np.arange(im.width * im.height) % 256).astype(np.uint8)
                            .reshape(im.height, im.width))
    rgba = im.convert("RGBA")
    rgba.putalpha(alpha)
    return rgba


def gray16(im: Image.Image) -> Image.Image:
    """A 16-bit grayscale image (mode I;16) with values 0..400: PIL clips it to 255 when
    converting, so both sides of the clip are exercised."""
    return Image.fromarray(np.asarray(im.convert("L"), dtype=np.uint16) * 400 // 255)


def torchvision_samples(root: str, resize: int) -> tuple[torch.Tensor, list[int]]:
    tf = T.Compose([T.Resize(resize), T.CenterCrop(SIZE), T.PILToTensor()])
    dataset = torchvision.datasets.ImageFolder(root, transform=tf)
    images = torch.stack([dataset[i][0] for i in range(len(dataset))])  # N, 3, S, S
    return images.permute(0, 2, 3, 1), list(dataset.targets)


def served_samples(root: str, resize: int, endpoint: str) -> tuple[torch.Tensor, torch.Tensor]:
    with batchcast.serve(data=root, endpoint=endpoint, batch_size=4, epochs=1, workers=2,
                         image_size=SIZE, resize_size=resize, train=False, shuffle=False,
                         output="uint8") as server:
        loader = batchcast.Loader(endpoint, timeout=60)
        batches = [(x.clone(), y.clone()) for x, y in loader]
        loader.close()
        assert server.wait(30) == 0, server.log_tail()
    return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])


def test_every_format_equals_torchvision_when_no_resize_is_involved(tmp_path, endpoint):
    root = str(tmp_path / "formats")
    kinds = make_folder(root, RESIZE)
    want, labels = torchvision_samples(root, RESIZE)
    got, got_labels = served_samples(root, RESIZE, endpoint)
    assert got.shape == want.shape == (len(kinds), SIZE, SIZE, 3)
    assert got_labels.tolist() == labels == list(range(len(kinds)))
    wrong = {kind: int((got[i].int() - want[i].int()).abs().max())
             for i, kind in enumerate(kinds) if not torch.equal(got[i], want[i])}
    assert not wrong, f"max level difference from torchvision, by kind: {wrong}"


def test_every_format_is_close_to_torchvision_through_a_resize(tmp_path, endpoint):
    # Shorter side 1.6x Resize's: what differs is the bilinear filter (no antialias), as for JPEGs
    # (mean 1-2 levels here). Pictures with hard edges differ more: the clipped 16-bit ones (about
    # 4 levels), and the dithered 1-bit one most (about 40: pixel-level noise is exactly what an
    # antialias filter smooths), which is left out; the test above shows its decode is exact.
    root = str(tmp_path / "formats")
    kinds = make_folder(root, RESIZE * 8 // 5)
    want, labels = torchvision_samples(root, RESIZE)
    got, got_labels = served_samples(root, RESIZE, endpoint)
    assert got_labels.tolist() == labels
    diff = (got.float() - want.float()).abs().flatten(1).mean(1)
    worst = {kinds[i]: round(float(diff[i]), 2) for i in range(len(kinds))
             if diff[i] >= 5.0 and kinds[i] != "png_1bit"}
    # A wrong channel order, crop, alpha or 16-bit rule costs tens of levels on these pictures.
    assert not worst, f"mean level difference from torchvision above 5, by kind: {worst}"


def test_bad_files_of_every_format_are_refused_naming_the_file(tmp_path):
    pipeline = bc.ImagePipeline(bc.PipelineOptions(image_size=32, train=False, output="uint8"))
    big = Image.fromarray(picture(120, 90, 1))
    for ext, args in (("png", {}), ("bmp", {}), ("ppm", {}), ("tiff", {}), ("webp", {})):
        path = tmp_path / f"whole.{ext}"
        big.save(path, **args)
        data = path.read_bytes()
        cut = tmp_path / f"cut.{ext}"
        cut.write_bytes(data[: len(data) // 2])
        with pytest.raises(Exception, match=rf"cut\.{ext}: .*(truncated|corrupt)"):
            pipeline.process(str(cut))
        # The decompression-bomb guard, from the header, before decoding.
        tight = bc.ImagePipeline(bc.PipelineOptions(image_size=32, train=False, output="uint8",
                                 max_image_pixels=120 * 90 - 1))
        with pytest.raises(Exception, match=rf"whole\.{ext}: .*decompression-bomb guard"):
            tight.process(str(path))
