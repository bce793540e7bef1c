"""Views (docs/views.md): several transforms of one stream, every sample decoded once for all.

Real `batchcast serve` processes over a real JPEG ImageFolder, real Loaders. The oracle of a
view's bytes is the view's own ImagePipeline (options from _batchcast.View.resolve, the rule the
server applies) on the sample's file; streams are served unshuffled so that the k-th sample of
an epoch is dataset index k.

Run: .venv/bin/python -m pytest tests/python/test_views.py
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Dict, List

import numpy as np
import pytest
import torch

import batchcast
from batchcast import _batchcast
from batchcast.dataloader import share_paths
from conftest import photo_like, segment_of, watch_endpoint
from test_dataloader import new_key  # noqa: F401 (a fixture)

CLASSES, PER_CLASS, CHUNK = 3, 7, 5  # 21 samples: 5 chunks an epoch, the last of 1


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    from PIL import Image

    root = tmp_path_factory.mktemp("views_folder")
    sizes = [(160, 120), (300, 200), (97, 140), (420, 330), (128, 128), (250, 90), (180, 260)]
    for c in range(CLASSES):
        os.makedirs(root / f"class{c}")
        for i in range(PER_CLASS):
            w, h = sizes[(c + i) % len(sizes)]
            Image.fromarray(photo_like(w, h, seed=c * 100 + i)).save(
                root / f"class{c}" / f"img{i}.jpg", quality=90)
    return str(root)


def transform() -> "_batchcast.PipelineOptions":
    return _batchcast.PipelineOptions(image_size=56, output="uint8", seed=7)


def serve(folder: str, endpoint: str, **kw):
    kw.setdefault("epochs", 2)
    return batchcast.serve(folder, endpoint, CHUNK, transform=transform(), shuffle=False,
                           workers=2, **kw)


def expected(folder: str, view, epoch: int, index: int) -> np.ndarray:
    options = _batchcast.View.resolve(batchcast._views.view_text(view),
                                      _batchcast.View(transform())).options
    path = _batchcast.Dataset.image_folder(folder).entries[index][0]
    return _batchcast.ImagePipeline(options).process(path, epoch, index)


def read(loader: batchcast.Loader, epochs: int) -> List[List[np.ndarray]]:
    """Every sample of `epochs` epochs, per epoch in order, with its label as the last item."""
    out = []
    for _ in range(epochs):
        samples = []
        for x, y in loader:
            samples += [(x[k].numpy().copy(), int(y[k])) for k in range(len(y))]
        out.append(samples)
    return out


def check_view(folder: str, view, epochs: List[List], first_epoch: int = 0) -> None:
    entries = _batchcast.Dataset.image_folder(folder).entries
    for e, samples in enumerate(epochs, start=first_epoch):
        assert len(samples) == len(entries), f"epoch {e}: {len(samples)} samples"
        for index, (pixels, label) in enumerate(samples):
            assert label == entries[index][1]
            want = expected(folder, view, e, index)
            assert pixels.shape == want.shape and np.array_equal(pixels, want), \
                f"view {view!r}, epoch {e}, sample {index}: not the view's own pipeline's bytes"


def in_threads(work: Dict[str, Callable[[], Any]], timeout: float = 120) -> Dict[str, Any]:
    """Runs each callable on a thread of its own; their results by name (an error re-raised)."""
    results: Dict[str, Any] = {}
    errors: List[BaseException] = []

    def run(name: str) -> None:
        try:
            results[name] = work[name]()
        except BaseException as e:  # re-raised below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(n,)) for n in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]
    return results


def read_in_threads(loaders: Dict[str, batchcast.Loader], epochs: int) -> Dict[str, List]:
    return in_threads({name: (lambda l=l: read(l, epochs)) for name, l in loaders.items()})


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


def train_epochs(loader, size: int, epochs: int, classes: int,
                 device: str = "cpu") -> List[List[int]]:
    """A real training loop (a small CNN, SGD, on `device`, where the batches must arrive) over
    `epochs` epochs; each epoch's labels."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(8, classes)).to(device)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05)
    seen = []
    for epoch in range(epochs):
        loader.load_state_dict({"epoch": epoch, "sample": 0})
        labels: List[int] = []
        for x, y in loader:
            assert x.shape[1:] == (3, size, size) and x.dtype == torch.float32
            assert x.device == y.device == torch.device(device), (x.device, y.device)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            assert torch.isfinite(loss)
            labels += y.tolist()
        seen.append(labels)
    return seen


def test_dataloaders_of_one_key_with_other_crop_sizes_share_one_stream(folder, new_key):
    """Two trainers' torchvision ImageFolder pipelines differing only in RandomResizedCrop's
    size: the second joins the first's stream as a view (no ValueError), each trains on whole
    shuffled epochs of its own size, in the same order (one stream), decoded by one producer."""
    import torchvision
    import torchvision.transforms as T

    def dataset(size):
        return torchvision.datasets.ImageFolder(folder, T.Compose([
            T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(),
            T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]))

    key = new_key()
    big = batchcast.DataLoader(dataset(64), batch_size=CHUNK, shuffle=True, share=key)
    small = batchcast.DataLoader(dataset(40), batch_size=CHUNK, shuffle=True, share=key)
    assert big.native and small.native
    results = in_threads({"big": lambda: train_epochs(big, 64, 2, CLASSES),
                          "small": lambda: train_epochs(small, 40, 2, CLASSES)}, timeout=180)
    targets = sorted(dataset(40).targets)
    for name in ("big", "small"):
        assert [sorted(e) for e in results[name]] == [targets, targets], name
    assert results["big"] == results["small"], "one stream: the same order for both views"
    assert results["big"][0] != results["big"][1]
    log = open(share_paths(key)["log"]).read()
    assert "view 1:" in log, log[-2000:]
    big.close()
    small.close()


@pytest.mark.parametrize("pin", [False, pytest.param(True, marks=pytest.mark.skipif(
    not (torch.cuda.is_available() and _batchcast.has_nvjpeg),
    reason="needs a CUDA GPU and a build with nvJPEG (pin_memory=True decodes into a GPU pool "
           "there; runs on the GPU machine)"))], ids=["host-pool", "gpu-pool"])
def test_a_dataloader_follows_a_transform_changed_between_epochs(folder, new_key, pin):
    """Progressive resizing through the drop-in: one trainer assigns a smaller RandomResizedCrop
    to its dataset after epoch 0 while another keeps its size on the same key. The first reads
    epochs 1 and 2 whole at the new size, the second is untouched, and both read one stream (the
    same shuffled order), decoded by one producer: on a host pool, and with pin_memory=True on
    a GPU pool (the mixed decoder; the batches on CUDA)."""
    import torchvision
    import torchvision.transforms as T

    def compose(size):
        return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor()])

    key = new_key()
    growing = torchvision.datasets.ImageFolder(folder, compose(64))
    steady = torchvision.datasets.ImageFolder(folder, compose(64))
    loaders = {name: batchcast.DataLoader(ds, batch_size=CHUNK, shuffle=True, pin_memory=pin,
                                          share=key)
               for name, ds in (("growing", growing), ("steady", steady))}
    decoder = "mixed" if pin else "cpu"
    assert all(loader.decoding.startswith(f"native {decoder}") for loader in loaders.values())
    sizes = {"growing": [64, 40, 40], "steady": [64, 64, 64]}

    def run(name: str) -> List[List[int]]:
        labels = []
        for epoch, size in enumerate(sizes[name]):
            if name == "growing":
                growing.transform = compose(size)
            seen = []
            for x, y in loaders[name]:
                assert x.is_cuda == y.is_cuda == pin, (name, epoch, x.device)
                assert x.shape[1:] == (3, size, size), (name, epoch, x.shape)
                seen += y.tolist()
            labels.append(seen)
        return labels

    labels = in_threads({name: (lambda n=name: run(n)) for name in loaders}, timeout=180)
    targets = sorted(growing.targets)
    for name in loaders:
        assert [sorted(e) for e in labels[name]] == [targets] * 3, name
    assert labels["growing"] == labels["steady"], "one stream: the same order in both views"
    log = open(share_paths(key)["log"]).read()
    assert log.count("view 1:") == 1, log[-2000:]  # 40 px: one view, added once
    for loader in loaders.values():
        loader.close()


def test_a_python_share_refuses_a_changed_transform_naming_it(folder, new_key):
    """A share decoding in Python runs the dataset its producer took at the first iteration: a
    transform assigned later would be ignored in silence, so the next iteration refuses it."""
    import torchvision
    import torchvision.transforms as T

    ds = torchvision.datasets.ImageFolder(folder, T.Compose([T.Resize(28), T.CenterCrop(28),
                                                             T.ToTensor()]))
    loader = batchcast.DataLoader(ds, batch_size=CHUNK, share=new_key(), native=False)
    # Before the first iteration its producer has not taken the dataset yet: a change is fine.
    ds.transform = T.Compose([T.Resize(32), T.CenterCrop(32), T.ToTensor()])
    shapes = {tuple(x.shape[1:]) for x, _ in loader}
    assert shapes == {(3, 32, 32)}
    ds.transform = T.Compose([T.Resize(24), T.CenterCrop(24), T.ToTensor()])
    with pytest.raises(ValueError, match=r"the dataset's transform changed after the share's "
                                         r"producer took it.*another share key"):
        iter(loader)
    loader.close()


def test_a_share_key_refuses_another_stream_naming_the_stream_field(folder, new_key):
    import torchvision
    import torchvision.transforms as T

    ds = torchvision.datasets.ImageFolder(folder, T.Compose([T.RandomResizedCrop(32),
                                                             T.ToTensor()]))
    key = new_key()
    first = batchcast.DataLoader(ds, batch_size=CHUNK, shuffle=True, share=key)
    it = iter(first)
    next(it)
    other = batchcast.DataLoader(ds, batch_size=CHUNK + 1, shuffle=True, share=key)
    with pytest.raises(ValueError, match=r"batch_size: running 5, this process 6") as e:
        iter(other)
    assert "transform" not in str(e.value).split(". ")[0]
    other.close()
    first.close()


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


# GPU pools (serve --device cuda:0, decoder cpu): each view has arenas of its own on the GPU.
# Run on the GPU machine: pytest -q tests/python/test_views.py -k gpu (the GPU decoders' views:
# test_views_gpu_decode.py)
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="no CUDA device: torch.cuda is not available")


def serve_gpu(folder: str, endpoint: str, transform_=None, **kw):
    kw.setdefault("epochs", 1)
    kw.setdefault("workers", 2)
    try:
        return batchcast.serve(folder, endpoint, CHUNK, transform=transform_ or transform(),
                               shuffle=False, device="cuda:0", **kw)
    except Exception as e:  # a CPU-only build refuses --device cuda at once
        if "no CUDA support" in str(e) or "no nvJPEG" in str(e):
            pytest.skip(f"this build cannot serve it: {e}")
        raise


def read_cpu(loader: batchcast.Loader, epochs: int) -> List[List]:
    """As read(), the GPU batches copied to the host (checked to be CUDA tensors)."""
    out = []
    for _ in range(epochs):
        samples = []
        for x, y in loader:
            assert x.is_cuda, x.device
            x, y = x.cpu(), y.cpu()
            samples += [(x[k].numpy().copy(), int(y[k])) for k in range(len(y))]
        out.append(samples)
    return out


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


def late_view_beside_own(endpoint: str, view: str) -> Dict[str, Any]:
    """The server's own reader two chunks into epoch 0 when a Loader of `view` attaches; both
    then read 2 epochs at once. "late": the view's epochs (read_cpu), "own": the own reader's
    samples per epoch."""
    own = batchcast.Loader(endpoint, timeout=60)
    it = iter(own)
    head = [next(it), next(it)]  # epoch 0 is under way
    late = batchcast.Loader(endpoint, view=view, timeout=60)

    def rest_of_own() -> List[int]:
        first = sum(len(y) for _, y in head) + sum(len(y) for _, y in it)
        return [first, sum(len(y) for _, y in own)]

    try:
        return in_threads({"late": lambda: read_cpu(late, 2), "own": rest_of_own})
    finally:
        own.close()
        late.close()


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
