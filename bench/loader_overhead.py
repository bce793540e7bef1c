"""Per-batch overhead of batchcast.Loader versus iterating tensors already in memory.

    .venv/bin/python bench/loader_overhead.py [--batches 20000]

A native `batchcast serve --synthetic` server (in its own process) produces tiny batches, so
the time per batch is the Loader's own cost: receiving a descriptor, building the DLPack
capsules and the torch tensors, releasing the slot. The baseline iterates a list of
(images, labels) tuples of the same shapes. Both report microseconds per batch.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import batchcast


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=20000)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--sample-bytes", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    samples = args.batches * args.batch_size
    endpoint = f"ipc:///tmp/batchcast-bench-{os.getpid()}.sock"

    in_memory = [(torch.zeros(args.batch_size, args.sample_bytes, dtype=torch.uint8),
                  torch.zeros(args.batch_size, dtype=torch.int64))] * args.batches
    base = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        n = 0
        for x, y in in_memory:
            n += len(y)
        base.append((time.perf_counter() - start) / args.batches * 1e6)

    loader_us = []
    for _ in range(args.repeats):
        with batchcast.serve(synthetic=samples, sample_bytes=args.sample_bytes, epochs=1,
                             endpoint=endpoint, batch_size=args.batch_size, ring=64,
                             workers=1, extra_args=["--status-interval", "0"]):
            loader = batchcast.Loader(endpoint, prefetch=16)
            it = iter(loader)
            next(it)  # connection and first chunk are not per-batch costs
            start = time.perf_counter()
            n = 1
            for x, y in it:
                n += 1
            loader_us.append((time.perf_counter() - start) / (n - 1) * 1e6)
            stats = loader.stats
            loader.close()
    b, l = min(base), min(loader_us)
    print(f"in-memory list : {b:8.2f} us/batch")
    print(f"batchcast.Loader: {l:8.2f} us/batch (waited {stats.wait_s:.2f} s for the server, "
          f"{stats.copies} copies)")
    print(f"overhead        : {l - b:8.2f} us/batch "
          f"(batch {args.batch_size} x {args.sample_bytes} B, {args.batches} batches, "
          f"best of {args.repeats})")


if __name__ == "__main__":
    main()
