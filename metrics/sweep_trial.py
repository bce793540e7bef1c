"""One trial of the example sweep ``sweep_example.csv`` (``batchcast track --file
metrics/sweep_example.csv --out runs``): a small CNN trained on torchvision's FakeData through
``batchcast.DataLoader``, one stream for every trial given the same ``--share KEY`` (the shared
workload) or a loader of its own (the baseline). It records itself with
``batchcast.tools.metrics.track()`` into the run directory ``batchcast track`` gives it
(``BATCHCAST_METRICS_DIR``), so that both workloads count their samples the same way, with no
``--samples``.
"""

from __future__ import annotations

import argparse
import os

import torch
import torchvision
from torch import nn

import batchcast
from batchcast.tools import metrics


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--share", help="share key (default: a DataLoader of this trial's own)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=256, help="FakeData size")
    args = p.parse_args()
    dataset = torchvision.datasets.FakeData(args.samples, (3, 32, 32), 10,
                                            transform=torchvision.transforms.ToTensor())
    loader = batchcast.DataLoader(dataset, batch_size=32, shuffle=True, num_workers=1,
                                  share=args.share)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    with metrics.track(os.environ.get("BATCHCAST_METRICS_DIR", "runs/sweep-trial")) as tracker:
        for _ in range(args.epochs):
            for images, labels in tracker.wrap(loader):
                loss = nn.functional.cross_entropy(model(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    loader.close()
    print(f"lr {args.lr}: {tracker.samples} samples", flush=True)


if __name__ == "__main__":
    main()
