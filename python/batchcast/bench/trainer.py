"""One trainer process of the collocated benchmark (batchcast.bench.collocated).

It trains `--model` for `--steps` steps of `--batch-size`, reading its data either from its own
torch DataLoader (`--mode baseline`: torchvision ImageFolder + the same transforms as the
server, `--workers` worker processes) or from a batchcast server (`--mode shared`). With
`--model none` it only reads the data (the data-only ceiling). Baseline trainers record their
CPU (workers included) with batchcast.metrics.track, the same collector the server uses for
its consumers. Prints one JSON line: samples, start/end wall times, wait time.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def small_cnn(classes: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, classes))


def make_model(name: str, classes: int) -> torch.nn.Module | None:
    if name == "none":
        return None
    if name == "small_cnn":
        return small_cnn(classes)
    import torchvision
    return getattr(torchvision.models, name)(num_classes=classes)


def baseline_loader(args: argparse.Namespace):
    import torchvision
    from torchvision import transforms as T
    tf = T.Compose([T.RandomResizedCrop(args.image_size), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    dataset = torchvision.datasets.ImageFolder(args.data, transform=tf)
    return torch.utils.data.DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, drop_last=True,
        persistent_workers=args.workers > 0, pin_memory=args.device.startswith("cuda"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=["baseline", "shared"], required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--endpoint")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--model", default="small_cnn")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--device", default="cpu")
    p.add_argument("--warmup", type=int, default=0, help="steps before the throughput clock starts")
    p.add_argument("--metrics-dir")
    args = p.parse_args()

    import batchcast
    torch.set_num_threads(1)  # N trainers share the cores; one intra-op thread each
    device = torch.device(args.device)
    model = make_model(args.model, args.classes)
    opt = None
    if model is not None:
        model.to(device).train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    tracker = None
    if args.mode == "baseline":
        loader = baseline_loader(args)
        tracker = batchcast.metrics.track(args.metrics_dir, role="trainer")
    else:
        loader = batchcast.Loader(args.endpoint, batch_size=args.batch_size, drop_last=True,
                                  timeout=300, name="trainer")
    steps, samples, wait = 0, 0, 0.0
    start = time.time()
    total_steps = args.steps + args.warmup
    while steps < total_steps:
        it = iter(loader)
        while steps < total_steps:
            if steps == args.warmup:  # steady state from here: worker start-up and prefill excluded
                start, samples, wait = time.time(), 0, 0.0
            t0 = time.perf_counter()
            try:
                images, labels = next(it)
            except StopIteration:
                break
            waited = time.perf_counter() - t0
            wait += waited
            if tracker is not None:
                tracker.add_wait(waited)
                tracker.add_samples(len(labels))
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            if model is not None:
                loss = torch.nn.functional.cross_entropy(model(images), labels % args.classes)
                opt.zero_grad()
                loss.backward()
                opt.step()
            elif device.type == "cuda":
                images.sum().item()  # touch the data
            del images, labels
            steps += 1
            samples += args.batch_size
    if device.type == "cuda":
        torch.cuda.synchronize()
    end = time.time()
    if tracker is not None:
        tracker.stop()
    else:
        loader.close()
    print(json.dumps({"samples": samples, "start": start, "end": end, "wait_s": wait}), flush=True)


if __name__ == "__main__":
    main()
