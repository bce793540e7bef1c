"""DDP training from a shared loader: two jobs of N ranks each decode once per rank.

Start each job as torchrun does (or with torchrun where it works), e.g. two jobs of 2 ranks
on the CPU (gloo):

    for job in 0 1; do for rank in 0 1; do
      RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((29500+job)) \
        python examples/train_ddp.py --lr 0.0$((job+1)) &
    done; done; wait

Rank r of every job reads the stream of key "ddp-example-rank<r>of2": each rank gets exactly
its DistributedSampler shard, and `sampler.set_epoch(epoch)` picks the epoch it receives.
A checkpoint stores `loader.state_dict()`; `--resume FILE` restarts at that batch.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
import torchvision
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

import batchcast


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--samples", type=int, default=512, help="FakeData size")
    p.add_argument("--checkpoint", help="write {epoch, model, loader} here after each epoch")
    p.add_argument("--resume", help="a checkpoint to restart from")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else "cpu"

    dataset = torchvision.datasets.FakeData(args.samples, (3, 32, 32), 10,
                                            transform=torchvision.transforms.ToTensor())
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = batchcast.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                                  num_workers=1, pin_memory=cuda, share="ddp-example")
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(16, 10)).to(device)
    model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    first_epoch = 0
    if args.resume:
        state = torch.load(args.resume)
        model.load_state_dict(state["model"])
        loader.load_state_dict(state["loader"])
        first_epoch = state["loader"]["epoch"] or 0
    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        total, samples = 0.0, 0
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, samples = total + loss.item() * len(labels), samples + len(labels)
        print(json.dumps({"rank": dist.get_rank(), "epoch": epoch, "samples": samples,
                          "loss": round(total / max(samples, 1), 4)}), flush=True)
        if args.checkpoint and dist.get_rank() == 0:
            torch.save({"model": model.state_dict(), "loader": loader.state_dict()},
                       args.checkpoint)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
