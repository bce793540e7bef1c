"""decoders/ through the Python module: Dataset against torchvision's ImageFolder, make_dataset,
and decoded pixels against PIL + torchvision transforms.

Run: .venv/bin/python -m pytest tests/python/test_decoders.py
"""
import io
import os

import numpy as np
import pytest
import torch
import torchvision
import torchvision.transforms as T
from PIL import Image, ImageFilter

import batchcast._batchcast as bc

PHOTO = os.environ.get("BATCHCAST_TEST_PHOTO", "/usr/share/backgrounds/mate/nature/Garden.jpg")
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def photo(width, height):
    """An RGB PIL image of width x height cut from a real photo (a gradient if none installed)."""
    if os.path.exists(PHOTO):
        img = Image.open(PHOTO).convert("RGB")
        scale = max(width / img.width, height / img.height) * 1.2
        img = img.resize((int(img.width * scale) + 1, int(img.height * scale) + 1), Image.BILINEAR)
        left, top = (img.width - width) // 2, (img.height - height) // 2
        return img.crop((left, top, left + width, top + height))
    # No photo (a machine without Debian's backgrounds): a photo-like picture, structure at
    # several scales but no pixel-level edges, which downscales without antialiasing would
    # alias far more than a photo's (the tolerance tests assume photo content).
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    r = 128 + 60 * np.sin(x / 7.0) * np.cos(y / 11.0) + 50 * np.sin((x + 2 * y) / 23.0)
    g = 128 + 70 * np.cos(x / 13.0 + y / 17.0) + 30 * np.sin(y / 5.0)
    b = 128 + 90 * np.sin((x - y) / 29.0) + 20 * np.cos(x / 3.7)
    rgb = np.stack([r, g, b], axis=-1).clip(0, 255).astype(np.uint8)
    return Image.fromarray(rgb).filter(ImageFilter.GaussianBlur(0.8))


def save_jpeg(img, path, quality=90):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    img.save(path, "JPEG", quality=quality)


@pytest.fixture()
def tricky_folder(tmp_path):
    root = tmp_path / "data"
    small = photo(64, 48)
    jpeg_names = [
        "a/x2.JPG", "a/x1.jpeg", "a/sub/w.jpg", "a/sub-dir/y.JpEg", "a/sub/deep/z.jpg",
        "B/only.jpg", "a b/c.jpg", "a-b/d.jpg", "a_b/e.jpg", "\u00e9t\u00e9/f.jpg",
        "Z9/g.jpg", "Z10/h.jpg",
    ]
    for name in jpeg_names:
        save_jpeg(small, str(root / name))
    small.save(str(root / "a_b" / "k.PNG"))
    (root / "a" / "notes.txt").write_text("not an image")
    (root / "a_b" / "anim.gif").write_bytes(b"GIF89a")
    (root / "loose.jpg").write_bytes(b"top-level files are not samples")
    return str(root)


def test_image_folder_matches_torchvision(tricky_folder):
    ours = bc.Dataset.image_folder(tricky_folder)
    theirs = torchvision.datasets.ImageFolder(tricky_folder)
    assert ours.classes == theirs.classes
    assert ours.entries == [(p, int(label)) for p, label in theirs.samples]
    assert len(ours) == len(theirs) == 13
    assert ours[0] == tuple(theirs.samples[0])
    assert ours[-1] == tuple(theirs.samples[-1])
    assert ours.first_difference(theirs.samples) == -1
    assert ours.first_difference(theirs.samples[:-1]) == 12, "only shorter: its length"
    assert ours.first_difference(theirs.samples[1:]) == 0
    assert ours.first_difference([*theirs.samples[:5], (theirs.samples[5][0], 99)]) == 5
    assert ours.first_difference([*theirs.samples[:2], "not a pair"]) == 2
    with pytest.raises(IndexError):
        ours[len(ours)]


def test_image_folder_errors_name_the_folder(tmp_path):
    missing = str(tmp_path / "missing")
    with pytest.raises(Exception, match="missing' does not exist"):
        bc.Dataset.image_folder(missing)
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="no class folders"):
        bc.Dataset.image_folder(str(tmp_path / "empty"))


def test_file_list(tmp_path):
    (tmp_path / "list.txt").write_text("# comment\n\nimgs/a.jpg 3\n/abs/b.jpg 1\n")
    d = bc.Dataset.file_list(str(tmp_path / "list.txt"))
    assert d.entries == [(str(tmp_path / "imgs/a.jpg"), 3), ("/abs/b.jpg", 1)]
    assert d.classes == []
    (tmp_path / "bad.txt").write_text("a.jpg 1\nb.jpg x\n")
    with pytest.raises(Exception, match=r"bad.txt:2: label 'x' is not an integer"):
        bc.Dataset.file_list(str(tmp_path / "bad.txt"))


def test_make_dataset_is_an_image_folder(tmp_path):
    if not os.path.isdir("/usr/share/backgrounds/mate"):  # scripts/setup.sh installs them
        pytest.skip("needs Debian's mate-backgrounds photos (apt-get install mate-backgrounds)")
    out = str(tmp_path / "made")
    report = bc.make_dataset(out, source_dir="/usr/share/backgrounds/mate", classes=3,
                             images_per_class=4, seed=1)
    assert report["images"] == 12 and report["classes"] == 3 and report["bytes"] > 0
    theirs = torchvision.datasets.ImageFolder(out)
    assert bc.Dataset.image_folder(out).entries == [(p, int(t)) for p, t in theirs.samples]
    for path, _ in theirs.samples:
        with Image.open(path) as img:
            assert img.format == "JPEG"
            assert 300 <= min(img.size) <= 500


def test_eval_pixels_equal_pil_when_no_resize_is_needed(tmp_path):
    # Shorter side already 256: Resize(256) is the identity, so only decode + crop remain and
    # libjpeg-turbo (ours) and PIL (libjpeg-turbo too) must agree exactly.
    path = str(tmp_path / "e.jpg")
    save_jpeg(photo(300, 256), path)
    options = bc.PipelineOptions(image_size=224, train=False, output="uint8")
    ours = bc.ImagePipeline(options).process(path)
    ref = T.Compose([T.Resize(256), T.CenterCrop(224)])(Image.open(path).convert("RGB"))
    assert ours.shape == (224, 224, 3) and ours.dtype == np.uint8
    np.testing.assert_array_equal(ours, np.asarray(ref))


def test_eval_pixels_close_to_torchvision_with_resize(tmp_path):
    path = str(tmp_path / "e.jpg")
    save_jpeg(photo(500, 375), path)
    ours = bc.ImagePipeline(bc.PipelineOptions(train=False, output="float32")).process(path)
    tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])
    ref = tf(Image.open(path).convert("RGB")).numpy()
    assert ours.shape == ref.shape == (3, 224, 224)
    # cv::resize INTER_LINEAR has no antialias filter; PIL's bilinear does. Small downscale here.
    assert np.abs(ours - ref).mean() < 0.03
    assert np.abs(ours - ref).max() < 0.8


def test_float_outputs_are_torchvision_normalised(tmp_path):
    path = str(tmp_path / "n.jpg")
    save_jpeg(photo(400, 320), path)
    kw = dict(image_size=96, train=True, seed=5)
    u8 = bc.ImagePipeline(bc.PipelineOptions(output="uint8", **kw)).process(path, 2, 7)
    f32 = bc.ImagePipeline(bc.PipelineOptions(output="float32", **kw)).process(path, 2, 7)
    f16 = bc.ImagePipeline(bc.PipelineOptions(output="float16", **kw)).process(path, 2, 7)
    bf16 = bc.ImagePipeline(bc.PipelineOptions(output="bfloat16", **kw)).process(path, 2, 7)
    ref = T.Normalize(MEAN, STD)(T.ToTensor()(Image.fromarray(u8)))
    np.testing.assert_allclose(f32, ref.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(f16, f32.astype(np.float16))
    assert bf16.dtype == np.uint16  # bfloat16 bits
    torch_bf16 = torch.from_numpy(f32).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bf16, torch_bf16)


def test_train_is_deterministic_and_varies(tmp_path):
    path = str(tmp_path / "t.jpg")
    save_jpeg(photo(500, 375), path)
    p = bc.ImagePipeline(bc.PipelineOptions(seed=3))
    a, b, c = p.process(path, 0, 1), p.process(path, 0, 1), p.process(path, 0, 2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    out = np.empty((2, 3, 224, 224), np.float32)
    p.process_into(path, 0, 1, out[1])
    np.testing.assert_array_equal(out[1], a)
    with open(path, "rb") as f:
        np.testing.assert_array_equal(p.process_bytes(f.read(), "t.jpg", 0, 1), a)
    # Statistics of the crops match torchvision's RandomResizedCrop: mean brightness agrees.
    tv = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(MEAN, STD)])
    img = Image.open(path).convert("RGB")
    torch.manual_seed(0)
    tv_mean = np.mean([tv(img).mean().item() for _ in range(64)])
    bc_mean = np.mean([p.process(path, 0, i).mean() for i in range(64)])
    assert abs(tv_mean - bc_mean) < 0.1


def test_bad_samples_name_file_and_reason(tmp_path):
    p = bc.ImagePipeline(bc.PipelineOptions(output="uint8"))
    text = tmp_path / "notes.jpg"
    text.write_text("hello")
    with pytest.raises(Exception, match=f"{text}: not an image"):
        p.process(str(text))
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    with pytest.raises(Exception, match=r"empty file \(0 bytes\)"):
        p.process(str(empty))
    buf = io.BytesIO()
    photo(200, 150).save(buf, "JPEG")
    truncated = tmp_path / "cut.jpg"
    truncated.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(Exception, match="cut.jpg: truncated JPEG"):
        p.process(str(truncated))
    with pytest.raises(Exception, match="missing.jpg: cannot open"):
        p.process(str(tmp_path / "missing.jpg"))
    with pytest.raises(Exception, match=r"int4 not in \{bfloat16,float16,float32,uint8\}"):
        bc.ImagePipeline(bc.PipelineOptions(output="int4"))
