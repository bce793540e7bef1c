"""batchcast._torchvision_plan: which torchvision ImageFolder pipelines run natively, and that
the native pipeline then yields what torchvision would (labels, order, per-sample pixels for the
same crop box and flip, crop-box statistics); everything else falls back with a logged reason.

Run: .venv/bin/python -m pytest tests/python/test_torchvision_plan.py
"""
import logging
import subprocess

import numpy as np
import pytest
import torch
import torchvision
import torchvision.transforms as T
import torchvision.transforms.functional as F
from PIL import Image

import batchcast
import batchcast._batchcast as bc
from batchcast._torchvision_plan import Fallback, NativePlan, plan
from test_dataloader import new_key  # noqa: F401 (a fixture)
from test_decoders import MEAN, STD, photo, save_jpeg

# Unsorted class names (order is torchvision's sort), mixed sizes and orientations.
SIZES = [(64, 48), (48, 64), (80, 60), (57, 43)]
CLASSES = ["zebra", "Apple", "c10", "c9"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("tvplan") / "data"
    base = photo(90, 70)  # one real photo, cut 16 ways (opening the photo is the slow part)
    for c, name in enumerate(CLASSES):
        for i, (w, h) in enumerate(SIZES):
            save_jpeg(base.crop((c, i, c + w, i + h)), str(root / name / f"img{i}.jpg"))
    return str(root)


def assert_close_to_torchvision(ours, ref, what):
    """Normalised float samples, test_decoders' bound: the native resize has no antialias filter
    (decoders/README.md, Augmentation), so sizes here keep downscales under 1.5x."""
    diff = (ours - ref).abs()
    assert diff.mean() < 0.03 and diff.max() < 0.8, (what, diff.mean(), diff.max())


def train_tf(size=32, interpolation=T.InterpolationMode.BILINEAR):
    return T.Compose([
        T.RandomResizedCrop(size, scale=(0.3, 0.9), ratio=(0.6, 1.6),
                            interpolation=interpolation),
        T.RandomHorizontalFlip(0.3), T.ToTensor(), T.Normalize(MEAN, STD),
    ])


def test_train_pipeline_is_recognised_with_its_parameters(folder):
    ds = torchvision.datasets.ImageFolder(folder, train_tf())
    p = plan(ds, dict(batch_size=8, shuffle=True, drop_last=True, num_workers=4), seed=3)
    assert isinstance(p, NativePlan)
    t = p.transform  # a _batchcast.PipelineOptions: its float fields are C++ floats/doubles
    assert (t.image_size, t.train, t.scale, t.ratio, t.flip_p) == (32, True, [0.3, 0.9],
                                                                   [0.6, 1.6], 0.3)
    assert (t.output, t.interpolation) == ("float32", "bilinear")
    assert (t.mean, t.std) == (pytest.approx(MEAN), pytest.approx(STD))
    assert (p.batch_size, p.shuffle, p.drop_last, t.seed) == (8, True, True, 3)
    assert (p.device, p.decoder) == ("cpu", "cpu")
    gpu = plan(ds, dict(batch_size=8), device="cuda:1", nvjpeg=True)
    assert (gpu.device, gpu.decoder) == ("cuda:1", "mixed")


def test_eval_and_uint8_pipelines_are_recognised(folder):
    ds = torchvision.datasets.ImageFolder(
        folder, T.Compose([T.Resize(40), T.CenterCrop(32), T.PILToTensor()]))
    p = plan(ds, {})
    t = p.transform
    assert (t.train, t.resize_size, t.image_size, t.output, t.uint8_layout, p.batch_size) == (
        False, 40, 32, "uint8", "chw", 1)
    ds.transform = T.Compose([T.Resize([40]), T.CenterCrop((32, 32)), T.PILToTensor(),
                              T.ConvertImageDtype(torch.float32)])
    p = plan(ds, {})
    assert (p.transform.output, p.transform.mean, p.transform.std) == ("float32", [0.0] * 3,
                                                                       [1.0] * 3)


def test_v2_pipeline_is_recognised(folder):
    v2 = pytest.importorskip("torchvision.transforms.v2")  # torchvision >= 0.15
    to_image = getattr(v2, "ToImage", None) or getattr(v2, "ToImageTensor")
    to_float = (v2.ToDtype(torch.float32, scale=True) if hasattr(v2, "ToImage")
                else v2.ConvertDtype(torch.float32))
    ds = torchvision.datasets.ImageFolder(folder, v2.Compose([
        to_image(), v2.RandomResizedCrop(48, antialias=True), v2.RandomHorizontalFlip(),
        to_float, v2.Normalize(MEAN, STD)]))
    p = plan(ds, dict(batch_size=4))
    assert isinstance(p, NativePlan), p
    assert (p.transform.image_size, p.transform.flip_p, p.transform.output) == (48, 0.5,
                                                                                "float32")


def test_labels_and_order_equal_torchvision(folder, endpoint):
    """The native server streams dataset.samples' order and labels; each eval image is
    torchvision's within the pipeline's tolerance."""
    tf = T.Compose([T.Resize(44), T.CenterCrop(40), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = torchvision.datasets.ImageFolder(folder, tf)
    p = plan(ds, dict(batch_size=5, shuffle=False))
    assert isinstance(p, NativePlan)
    with batchcast.serve(endpoint=endpoint, epochs=1, workers=2,
                         config=p.serve_config()) as server:
        loader = batchcast.Loader(endpoint, timeout=30, **p.loader_kwargs())
        batches = [(x.clone(), y.clone()) for x, y in loader]
        loader.close()
        assert server.wait(30) == 0
    images = torch.cat([x for x, _ in batches])
    labels = torch.cat([y for _, y in batches])
    assert labels.tolist() == ds.targets == [label for _, label in ds.samples]
    assert images.dtype == torch.float32 and images.shape == (len(ds), 3, 40, 40)
    for i in range(len(ds)):
        assert_close_to_torchvision(images[i], ds[i][0], ds.samples[i][0])


def test_a_distributed_sampler_shards_as_torch(folder, endpoint):
    """DistributedSampler(drop_last=False) runs natively: the served rank gets exactly torch's
    shard (unshuffled here, so the order is comparable), padding included."""
    from torch.utils.data.distributed import DistributedSampler

    ds = torchvision.datasets.ImageFolder(folder, T.Compose([
        T.Resize(24), T.CenterCrop(24), T.PILToTensor()]))
    sampler = DistributedSampler(ds, num_replicas=3, rank=2, shuffle=False)
    p = plan(ds, dict(batch_size=6, sampler=sampler))
    assert isinstance(p, NativePlan) and (p.rank, p.world_size, p.shuffle) == (2, 3, False)
    with batchcast.serve(endpoint=endpoint, epochs=1, workers=2, config=p.serve_config()) as server:
        loader = batchcast.Loader(endpoint, timeout=30, **p.loader_kwargs())
        labels = torch.cat([y.clone() for _, y in loader]).tolist()
        loader.close()
        assert server.wait(30) == 0
    assert labels == [ds.targets[i] for i in sampler]
    dropping = DistributedSampler(ds, num_replicas=3, rank=0, drop_last=True)
    assert "drop_last=True" in plan(ds, dict(sampler=dropping)).reason


def test_served_training_samples_are_the_plans_pipeline(folder, endpoint):
    """The served transform is the plan's: each served sample (epoch 0, unshuffled: index i)
    is ImagePipeline(plan.transform).process(path_i, 0, i)."""
    ds = torchvision.datasets.ImageFolder(folder, T.Compose([
        T.RandomResizedCrop(24, scale=(0.2, 0.5), ratio=(0.5, 2.0)), T.RandomHorizontalFlip(0.7),
        T.PILToTensor()]))
    p = plan(ds, dict(batch_size=16), seed=5)
    with batchcast.serve(endpoint=endpoint, epochs=1, workers=2, config=p.serve_config()) as server:
        loader = batchcast.Loader(endpoint, timeout=30, **p.loader_kwargs())
        images = torch.cat([x.clone() for x, _ in loader])
        loader.close()
        assert server.wait(30) == 0
    assert images.dtype == torch.uint8 and images.shape == (len(ds), 3, 24, 24)
    pipeline = bc.ImagePipeline(p.transform)
    for i, (path, _) in enumerate(ds.samples):
        np.testing.assert_array_equal(images[i].numpy(), pipeline.process(path, 0, i))


def torchvision_sample(path, g, size, interpolation, tail):
    """torchvision's transform of `path` with the native pipeline's crop box and flip."""
    left, top, w, h = g["crop"]
    img = F.resized_crop(Image.open(path).convert("RGB"), top, left, h, w, [size, size],
                         interpolation)
    return tail(F.hflip(img) if g["flip"] else img)


def test_each_sample_is_torchvision_with_the_same_crop_and_flip(folder):
    ds = torchvision.datasets.ImageFolder(folder, train_tf(48))  # crops of 30..66 px
    p = plan(ds, {}, seed=9)
    pipeline = bc.ImagePipeline(p.transform)
    tail = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
    flips = 0
    for index, (path, _) in enumerate(ds.samples):
        with Image.open(path) as img:
            width, height = img.size
        for epoch in range(3):
            g = pipeline.geometry(width, height, epoch, index)
            flips += g["flip"]
            ours = torch.from_numpy(pipeline.process(path, epoch, index))
            ref = torchvision_sample(path, g, 48, T.InterpolationMode.BILINEAR, tail)
            assert_close_to_torchvision(ours, ref, (path, epoch))
    assert 0 < flips < 3 * len(ds)

    # Nearest and PILToTensor: the same source pixels as PIL, byte for byte.
    ds.transform = T.Compose([T.RandomResizedCrop(32, interpolation=T.InterpolationMode.NEAREST),
                              T.RandomHorizontalFlip(), T.PILToTensor()])
    p = plan(ds, {}, seed=9)
    assert (p.transform.interpolation, p.transform.output) == ("nearest", "uint8")
    pipeline = bc.ImagePipeline(p.transform)
    for index, (path, _) in enumerate(ds.samples):
        with Image.open(path) as img:
            width, height = img.size
        g = pipeline.geometry(width, height, 0, index)
        ref = torchvision_sample(path, g, 32, T.InterpolationMode.NEAREST, T.PILToTensor())
        np.testing.assert_array_equal(pipeline.process(path, 0, index), ref.numpy())


def ks_distance(a, b):
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the two ECDFs."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return np.max(np.abs(np.searchsorted(a, grid, side="right") / len(a)
                         - np.searchsorted(b, grid, side="right") / len(b)))


@pytest.mark.parametrize("scale,ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 1.0), (0.3, 3.0))])
def test_crop_box_statistics_match_torchvision(scale, ratio):
    """Over many draws (fixed seeds: deterministic), area fraction, aspect ratio and position of
    the native boxes follow torchvision's RandomResizedCrop.get_params, fallbacks included."""
    width, height, n = 300, 200, 4000
    pipeline = bc.ImagePipeline(bc.PipelineOptions(image_size=32, scale=scale, ratio=ratio, seed=1))
    ours = np.array([pipeline.geometry(width, height, 0, i)["crop"] for i in range(n)], float)
    torch.manual_seed(1)
    image = torch.empty((3, height, width), dtype=torch.uint8)
    theirs = []
    for _ in range(n):
        top, left, h, w = T.RandomResizedCrop.get_params(image, list(scale), list(ratio))
        theirs.append((left, top, w, h))
    theirs = np.array(theirs, float)

    def features(boxes):
        left, top, w, h = boxes.T
        return {"area": w * h / (width * height), "log aspect": np.log(w / h),
                "centre x": (left + w / 2) / width, "centre y": (top + h / 2) / height}

    # KS critical value for n = m = 4000 at alpha = 0.001: 1.95 * sqrt(2 / n) = 0.044.
    for name, (a, b) in {k: (v, features(theirs)[k]) for k, v in features(ours).items()}.items():
        assert ks_distance(a, b) < 0.044, name


@pytest.mark.parametrize("make,args,why", [
    (lambda root: torchvision.datasets.ImageFolder(
        root, T.Compose([T.RandomResizedCrop(32), T.ColorJitter(0.4), T.ToTensor()])),
     {}, "step 1 ColorJitter"),
    (lambda root: torchvision.datasets.ImageFolder(
        root, T.Compose([T.Resize((32, 40)), T.ToTensor()])), {}, "step 0 Resize"),
    (lambda root: torchvision.datasets.ImageFolder(root, T.RandomResizedCrop(32)), {},
     "ends with a PIL image"),
    (lambda root: torchvision.datasets.ImageFolder(
        root, train_tf(), target_transform=lambda y: y + 1), {}, "target_transform"),
    (lambda root: torchvision.datasets.ImageFolder(root, train_tf()),
     {"sampler": [0, 1]}, "sampler"),
    (lambda root: type("MyFolder", (torchvision.datasets.ImageFolder,), {})(root, train_tf()),
     {}, "dataset MyFolder"),
    (lambda root: torchvision.datasets.ImageFolder(
        root, T.Compose([T.RandomResizedCrop(32, interpolation=T.InterpolationMode.BICUBIC),
                         T.ToTensor()])), {}, "interpolation 'bicubic'"),
])
def test_unrecognised_pipelines_fall_back_and_log_why(folder, caplog, make, args, why):
    with caplog.at_level(logging.WARNING, logger="batchcast.torchvision_plan"):
        p = plan(make(folder), args)
    assert isinstance(p, Fallback) and why in p.reason, p
    assert [r.getMessage() for r in caplog.records] == [
        f"batchcast: the dataset runs in Python, not natively: {p.reason}"]


def test_edited_samples_fall_back(folder):
    ds = torchvision.datasets.ImageFolder(folder, train_tf())
    ds.samples = ds.samples[1:]
    p = plan(ds, {})
    assert isinstance(p, Fallback) and "dataset.samples" in p.reason
    # Same length, one label or path edited: the reason names the first sample that differs.
    for edit in (lambda s: (s[0], s[1] + 1), lambda s: (s[0] + ".bak", s[1])):
        ds = torchvision.datasets.ImageFolder(folder, train_tf())
        ds.samples[3] = edit(ds.samples[3])
        p = plan(ds, {})
        assert isinstance(p, Fallback), p
        assert p.reason.startswith(f"dataset.samples[3] = {ds.samples[3]!r}, the folder scan "
                                   f"has {torchvision.datasets.ImageFolder(folder).samples[3]!r}")


@pytest.mark.parametrize("args,message", [
    (["--std", "0.2,0,0.2"], "--std: must be other than 0 (it divides) (got 0)"),
    (["--scale", "0.5"], "--scale: At least 2 required"),
    (["--flip-p", "2"], "--flip-p: must be in 0..1 (got 2)"),
    (["--scale", "0.9,0.1"], "give the smaller value first"),
    (["--eval", "--image-size", "64", "--resize-size", "32"], "raise --resize-size"),
    (["--interpolation", "nearest", "--decoder", "nvjpeg", "--device", "cuda:0"],
     "--decoder nvjpeg resizes bilinearly"),
])
def test_serve_refuses_bad_transform_options_by_name(folder, batchcast_bin, args, message):
    r = subprocess.run([batchcast_bin, "serve", "--data", folder, *args], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and message in r.stderr, r.stderr


# -- the drop-in: DataLoader(share=) serves a recognised pipeline natively -------------------


def share_log(key):
    with open(batchcast.dataloader.share_paths(key)["log"]) as f:
        return f.read()


def test_dataloader_share_runs_a_recognised_pipeline_natively(folder, new_key, caplog):
    """The drop-in's producer is the native server (its log says so, and so does the trainer:
    once at INFO, and as the loader's `native`/`decoding`): torchvision's labels and order, each
    eval image torchvision's within tolerance, whole epochs; a trainer of the same key that
    turns the native path off is told the streams differ."""
    tf = T.Compose([T.Resize(44), T.CenterCrop(40), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = torchvision.datasets.ImageFolder(folder, tf)
    key = new_key()
    with caplog.at_level(logging.INFO, logger="batchcast"):
        loader = batchcast.DataLoader(ds, batch_size=5, num_workers=2, share=key)
    said = [r.getMessage() for r in caplog.records if r.name == "batchcast"]
    assert said == [f"DataLoader(share={key!r}): samples decoded by the native cpu decoder, "
                    "pool on cpu"], said
    assert loader.native is True and loader.decoding == "native cpu decoder, pool on cpu"
    for epoch in range(2):
        batches = [(x.clone(), y.clone()) for x, y in loader]
        images = torch.cat([x for x, _ in batches])
        labels = torch.cat([y for _, y in batches])
        assert labels.dtype == torch.int64 and labels.tolist() == ds.targets, epoch
        assert images.dtype == torch.float32 and images.shape == (len(ds), 3, 40, 40)
    for i in range(len(ds)):
        assert_close_to_torchvision(images[i], ds[i][0], ds.samples[i][0])
    assert "native pipeline (cpu decoder, pool on cpu)" in share_log(key)
    python = batchcast.DataLoader(ds, batch_size=5, share=key, native=False)
    assert python.native is False and python.decoding == "python"
    with pytest.raises(ValueError, match="decoding: running 'native cpu decoder, pool on cpu', "
                                         "this process 'python'"):
        iter(python)
    python.close()
    loader.close()


def test_dataloader_share_native_training_stream_covers_each_epoch(folder, new_key):
    """Shuffled training epochs through the native path: every sample once per epoch, epochs
    in different orders, and a second trainer of the key reads the same bytes for the same
    epoch (each asks for it by position: trainers of a key do not align their epoch numbers by
    themselves; a late one gets whole epochs from where the stream is)."""
    ds = torchvision.datasets.ImageFolder(folder, T.Compose([
        T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.PILToTensor()]))
    key = new_key()
    first = batchcast.DataLoader(ds, batch_size=4, shuffle=True, share=key)
    second = batchcast.DataLoader(ds, batch_size=4, shuffle=True, share=key)
    orders = []
    for epoch in range(2):
        first.load_state_dict({"epoch": epoch, "sample": 0})
        second.load_state_dict({"epoch": epoch, "sample": 0})
        a = [(x.clone(), y.clone()) for x, y in first]
        b = [(x.clone(), y.clone()) for x, y in second]
        assert len(a) == len(b) == 4
        for (xa, ya), (xb, yb) in zip(a, b):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
        labels = torch.cat([y for _, y in a]).tolist()
        assert sorted(labels) == sorted(ds.targets), epoch
        assert a[0][0].dtype == torch.uint8 and a[0][0].shape == (4, 3, 24, 24)
        orders.append(labels)
    assert orders[0] != orders[1]
    assert "native pipeline" in share_log(key)
    first.close()
    second.close()


def test_dataloader_share_falls_back_to_python_and_logs_why(folder, new_key, caplog):
    ds = torchvision.datasets.ImageFolder(
        folder, T.Compose([T.RandomResizedCrop(24), T.ColorJitter(0.4), T.ToTensor()]))
    key = new_key()
    with caplog.at_level(logging.WARNING, logger="batchcast.torchvision_plan"):
        loader = batchcast.DataLoader(ds, batch_size=8, share=key)
    [line] = [r.getMessage() for r in caplog.records]  # one line, naming the step
    assert line.startswith("batchcast: the dataset runs in Python, not natively: step 1 "
                           "ColorJitter(") and line.endswith(": no native equivalent"), line
    labels = torch.cat([y for _, y in loader]).tolist()
    assert labels == ds.targets
    assert "native" not in share_log(key)
    loader.close()


@pytest.mark.skipif(not (torch.cuda.is_available() and bc.has_nvjpeg),
                    reason="needs a CUDA GPU and a build with nvJPEG (runs on the GPU machine)")
def test_dataloader_share_with_pin_memory_decodes_into_a_gpu_pool(folder, new_key):
    """pin_memory=True says the trainer moves batches to its GPU: the share decodes into a pool
    there (the mixed decoder: CPU workers first, nvJPEG what a trainer waits for) and hands out
    CUDA tensors, in torchvision's labels and order, each image within the nvJPEG path's
    tolerance of torchvision's (the CPU pipeline's bytes are closer still)."""
    tf = T.Compose([T.Resize(44), T.CenterCrop(40), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = torchvision.datasets.ImageFolder(folder, tf)
    key = new_key()
    loader = batchcast.DataLoader(ds, batch_size=4, pin_memory=True, share=key)
    batches = [(x.clone(), y.clone()) for x, y in loader]
    assert all(x.is_cuda and y.is_cuda for x, y in batches)
    labels = torch.cat([y for _, y in batches]).cpu()
    assert labels.tolist() == ds.targets
    images = torch.cat([x for x, _ in batches]).cpu()
    for i in range(len(ds)):
        assert_close_to_torchvision(images[i], ds[i][0], ds.samples[i][0])
    device = f"cuda:{torch.cuda.current_device()}"
    assert f"native pipeline (mixed decoder, pool on {device})" in share_log(key)
    loader.close()


def test_the_plans_settings_are_typed_and_survive_the_spec_file(folder):
    """The plan travels pickled to the share producer: its transform and config come back equal,
    typed, and an unknown or invalid setting is refused naming it."""
    import pickle

    p = plan(torchvision.datasets.ImageFolder(folder, train_tf()), dict(batch_size=8), seed=3)
    back = pickle.loads(pickle.dumps(p))
    assert back.transform == p.transform and back.serve_config() == p.serve_config()
    config = back.serve_config()
    assert (config.transform.image_size, config.batch_size, config.data) == (32, 8, p.root)
    assert config.command_line()[:2] == ["--data", p.root]
    with pytest.raises(TypeError, match="no field 'image_sise'"):
        bc.PipelineOptions(image_sise=32)
    with pytest.raises(batchcast.BatchcastError, match=r"--interpolation: cubic not in"):
        config.transform.interpolation = "cubic"
