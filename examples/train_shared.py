"""Train a small CNN from a shared batchcast loader; run two copies side by side.

    # two trainers, one decode: the first starts a detached producer, the second attaches
    python examples/train_shared.py --lr 0.01 &
    python examples/train_shared.py --lr 0.05

Data: torchvision's FakeData through batchcast.DataLoader(share=...), or with --endpoint the
(images, labels) of a running `batchcast serve` (see standalone_server.sh). Trains on CUDA
where available, else on the CPU.
"""

from __future__ import annotations

import argparse
import time

import torch
import torchvision
from torch import nn

import batchcast


def make_model(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, classes),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--samples", type=int, default=256, help="FakeData size")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--endpoint", help="read a `batchcast serve` server instead of FakeData")
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"

    if args.endpoint:
        loader = batchcast.Loader(args.endpoint, batch_size=args.batch_size)
    else:
        dataset = torchvision.datasets.FakeData(
            args.samples, (3, args.image_size, args.image_size), args.classes,
            transform=torchvision.transforms.ToTensor())
        loader = batchcast.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                      num_workers=1, share="train-shared-example")
    model = make_model(args.classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        start, total, samples = time.time(), 0.0, 0
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            if images.dtype == torch.uint8:  # the native server's --output uint8 is NHWC
                images = images.permute(0, 3, 1, 2).float().div(255)
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(labels)
            samples += len(labels)
        print(f"lr {args.lr} epoch {epoch}: loss {total / max(samples, 1):.3f}, "
              f"{samples} samples, {samples / (time.time() - start):.0f} samples/s", flush=True)
    loader.close()


if __name__ == "__main__":
    main()
