"""Views through the drop-in DataLoader (docs/views.md): DataLoaders of one share key with other
crop sizes share one stream, a transform changed between epochs is followed (a Python share
refuses it, naming it). Other joins and refusals of a key: test_share_joins.py. Real `batchcast
serve` processes over a real JPEG ImageFolder (views_common.py), real training loops.

Run: .venv/bin/python -m pytest tests/python/test_views_dataloader.py
"""

from __future__ import annotations

from typing import List

import pytest
import torch

import batchcast
from batchcast import _batchcast
from batchcast.dataloader import share_paths
from test_dataloader import new_key  # noqa: F401 (a fixture)
from views_common import CHUNK, CLASSES, folder, in_threads, train_epochs  # noqa: F401


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

    # Both attach before either reads: a trainer attaching once the ring has moved past the
    # first epoch's start would begin at a later epoch (docs/stream.md, late join).
    first = {name: iter(loader) for name, loader in loaders.items()}

    def run(name: str) -> List[List[int]]:
        labels = []
        for epoch, size in enumerate(sizes[name]):
            if name == "growing":
                growing.transform = compose(size)
            seen = []
            for x, y in (first[name] if epoch == 0 else loaders[name]):
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
