"""Helpers of the views' tests (test_views*.py; docs/views.md): a real JPEG ImageFolder, a
`batchcast serve` of it on the host or a GPU pool, readers, a training loop, and the oracle of a
view's bytes: the view's own ImagePipeline (options from _batchcast.View.resolve, the rule the
server applies) on the sample's file. Streams are served unshuffled so that the k-th sample of
an epoch is dataset index k.
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
from conftest import photo_like


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
