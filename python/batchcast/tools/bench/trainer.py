"""One trainer process of the collocated benchmark (batchcast.tools.bench.collocated starts N of them).

It trains `--model` as people train today (bf16 autocast and channels_last; `--fp32` for plain
float32) on batches from `--peer`'s data path (batchcast.tools.bench.sources), with `--model none`
only touching the data (the data-only rate). The orchestrator measures all N trainers over the
same window, so the protocol on stdin/stdout is:
  1. after `--warmup` steps (cuDNN autotuning, worker start-up) print ``ready``;
  2. read ``go START END`` (Unix times) and keep training; steps finished before START are
     not counted (they drain queues filled while waiting), the clock runs from START, after
     the GPU finished the steps before it, to the first step ending after END;
  3. print one JSON line: samples, start, end (GPU-synchronised) and seconds waited on data.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import time
from typing import Optional

import torch

from .sources import SOURCES, open_source


def small_cnn(classes: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, classes))


def make_model(name: str, classes: int) -> Optional[torch.nn.Module]:
    """torchvision's model of that name, else timm's (efficientnet_b0 lives there), small_cnn
    (tests), or None for `none`."""
    if name == "none":
        return None
    if name == "small_cnn":
        return small_cnn(classes)
    import torchvision
    if hasattr(torchvision.models, name):
        return getattr(torchvision.models, name)(num_classes=classes)
    try:
        import timm
    except ImportError:
        raise SystemExit(f"--model {name}: not a torchvision model and timm is not installed")
    return timm.create_model(name, num_classes=classes)


def cpu_list(text: Optional[str]) -> Optional[list]:
    return None if not text else [int(c) for c in text.split(",")]


def parse(argv: Optional[list] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--peer", choices=sorted(SOURCES), required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--endpoint", help="the batchcast server (batchcast-* peers)")
    p.add_argument("--view", help="the server's view to read, e.g. size=160 (batchcast-* peers "
                                  "whose --image-size is not the server's)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=2,
                   help="DataLoader workers (dataloader, gpu-decode) or DALI threads")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--device", default="cuda")
    p.add_argument("--fp32", action="store_true", help="float32 NCHW instead of bf16 autocast + "
                                                       "channels_last")
    p.add_argument("--warmup", type=int, default=5, help="steps before announcing ready")
    p.add_argument("--data-cpus", type=cpu_list, help="comma-separated cores for the data side")
    p.add_argument("--trainer-cpus", type=cpu_list, help="comma-separated cores for this process")
    return p.parse_args(argv)


def main(argv: Optional[list] = None) -> None:
    # The runner's watchdog sends SIGUSR1 before it kills a run past its time limit: every
    # thread's stack then goes to stderr (this trainer's log) and shows where the trainer waited.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    args = parse(argv)
    if args.trainer_cpus:
        os.sched_setaffinity(0, args.trainer_cpus)
    torch.set_num_threads(1)  # N trainers share the cores; the GPU does the arithmetic
    torch.backends.cudnn.benchmark = True  # as training scripts do; autotuned during warmup
    device = torch.device(args.device)
    model = make_model(args.model, args.classes)
    opt = None
    memory_format = torch.contiguous_format if args.fp32 else torch.channels_last
    if model is not None:
        model.to(device, memory_format=memory_format).train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    source = open_source(args.peer, args, device)

    def step() -> float:
        t0 = time.perf_counter()
        images, labels = next(source)
        waited = time.perf_counter() - t0
        if model is None:
            images.float().sum()  # touch the data on its device; no host synchronisation
            return waited
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not args.fp32):
            out = model(images.contiguous(memory_format=memory_format))
            loss = torch.nn.functional.cross_entropy(out, labels % args.classes)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return waited

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(args.warmup):
        step()
    print("ready", flush=True)
    word, start_at, end_at = sys.stdin.readline().split()
    assert word == "go", word
    while time.time() < float(start_at):
        step()
    sync()
    start, steps, wait = time.time(), 0, 0.0
    while steps == 0 or time.time() < float(end_at):
        wait += step()
        steps += 1
    sync()
    end = time.time()
    print(json.dumps({"samples": steps * args.batch_size, "start": start, "end": end,
                      "wait_s": wait}), flush=True)
    source.close()  # ends the loader inside: DataLoader workers stop, a batchcast Loader leaves


if __name__ == "__main__":
    main()
