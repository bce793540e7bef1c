"""The drop-in on a torchvision ImageFolder pipeline: CPU per consumed sample of N trainers,
``DataLoader(share=)`` natively vs in Python vs N plain torch DataLoaders.

Every trainer builds the same dataset: ImageFolder + RandomResizedCrop(S) + RandomHorizontalFlip
+ ToTensor + Normalize, and reads --epochs epochs of it:

- ``baseline``: its own ``torch.utils.data.DataLoader`` (--workers worker processes);
- ``python``: ``batchcast.DataLoader(..., share=KEY, native=False)``: the share's producer runs
  the dataset's own code in a torch DataLoader (N x --workers workers, capped at the cores);
- ``native``: ``batchcast.DataLoader(..., share=KEY)``: the share's producer recognises the
  pipeline (``batchcast._torchvision_plan``) and runs the native server (same worker budget).

The trainer script is the same for both share modes but for ``native=``. CPU is the built-in
collector's (``data_side_cpu``): every trainer tracks itself (``batchcast.tools.metrics.track``) and
the share producer records itself under BATCHCAST_METRICS_DIR (the Python one with its workers,
the native one's collector its own process). Divided by the samples the trainers consumed.

Run: ``.venv/bin/python bench/dropin_bench.py --data data/dropin --trainers 2,4``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
MODES = ("baseline", "python", "native")


def dataset(args: argparse.Namespace) -> Any:
    import torchvision
    from torchvision import transforms as T

    tf = T.Compose([T.RandomResizedCrop(args.image_size), T.RandomHorizontalFlip(),
                    T.ToTensor(), T.Normalize(MEAN, STD)])
    return torchvision.datasets.ImageFolder(args.data, transform=tf)


def loader_args(args: argparse.Namespace, workers: int) -> Dict[str, Any]:
    return dict(batch_size=args.batch_size, shuffle=True, drop_last=True, num_workers=workers,
                persistent_workers=workers > 0, pin_memory=args.cuda)


def trainer(args: argparse.Namespace) -> None:
    """One trainer: reads --epochs epochs and prints {samples, wall_s} as a JSON line."""
    import torch

    import batchcast

    torch.set_num_threads(1)
    tracker = None
    if args.mode == "baseline":
        loader: Any = torch.utils.data.DataLoader(dataset(args), **loader_args(args, args.workers))
    else:
        loader = batchcast.DataLoader(dataset(args), share=args.endpoint,
                                      native=args.mode == "native",
                                      **loader_args(args, args.workers))
    tracker = batchcast.tools.metrics.track(args.out, role="trainer")
    samples, start = 0, time.time()
    for _ in range(args.epochs):
        for images, _labels in loader:
            if args.cuda:  # as a training step would; a no-op for batches nvJPEG put there
                images = images.to("cuda", non_blocking=True)
            samples += images.shape[0]
            if tracker is not None:
                tracker.add_samples(images.shape[0])
    if tracker is not None:
        tracker.stop()
    if args.mode != "baseline":
        loader.close()
    print(json.dumps({"samples": samples, "wall_s": time.time() - start}), flush=True)


def role_cmd(args: argparse.Namespace, mode: str, out: str, key: str, workers: int) -> List[str]:
    return [sys.executable, os.path.abspath(__file__), "--role", "trainer", "--mode", mode,
            "--data", args.data, "--batch-size", str(args.batch_size), "--image-size",
            str(args.image_size), "--epochs", str(args.epochs), "--workers", str(workers),
            "--out", out, "--endpoint", key] + (["--cuda"] if args.cuda else [])


def run_trainers(cmds: List[List[str]], env: Dict[str, str]) -> List[Dict[str, Any]]:
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for c in cmds]
    results = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"trainer failed ({p.returncode}):\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def data_side_cpu(out: str) -> float:
    """Core-seconds of every part of run directory ``out``: each trainer's own record (from
    its track() to its end), plus the share producer's. The native server's collector (the
    part at ``out`` itself) also lists its consumers, counted from when it first saw them:
    only its own process is taken from it, the trainers' records cover them whole."""
    from batchcast.tools import metrics

    total = 0.0
    for part in metrics.find_parts(out):
        with open(os.path.join(part, "summary.json")) as f:
            cpu = json.load(f)["cpu_core_s"]
        total += cpu["server"] if os.path.samefile(part, out) else cpu["all"]
    return total


def run_mode(args: argparse.Namespace, mode: str, n: int) -> Dict[str, Any]:
    from batchcast.dataloader import share_paths

    out = os.path.abspath(os.path.join(args.out, f"{mode}-{n}"))
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    key = f"dropin-bench-{os.getpid()}-{mode}-{n}"
    # The share's producer takes the first trainer's num_workers: the machine's budget.
    workers = args.workers if mode == "baseline" else min(n * args.workers, os.cpu_count() or 1)
    env = dict(os.environ, BATCHCAST_METRICS_DIR=out, BATCHCAST_KEEP_SHARE_LOG="1")
    results = run_trainers([role_cmd(args, mode, out, key, workers) for _ in range(n)], env)
    if mode != "baseline":  # the producer writes its metrics as it exits (a grace after the last)
        state = share_paths(key)["state"]
        deadline = time.monotonic() + 120
        while os.path.exists(state) and time.monotonic() < deadline:
            time.sleep(0.2)
        log = share_paths(key)["log"]
        with open(log) as f:
            text = f.read()
        os.unlink(log)
        want = "native pipeline" + (" (mixed" if args.cuda else " (cpu")
        if (want in text) != (mode == "native"):
            raise RuntimeError(f"the {mode} share did not run as asked; its log:\n{text}")
    samples = sum(r["samples"] for r in results)
    cpu = data_side_cpu(out)
    return {"mode": mode, "n": n, "samples": samples, "cpu_core_s": cpu,
            "cpu_per_sample": cpu / samples, "wall_s": max(r["wall_s"] for r in results),
            "workers": workers}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="ImageFolder (made with make-dataset if empty)")
    p.add_argument("--trainers", default="2,4", help="comma-separated N")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=160)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers per trainer")
    p.add_argument("--out", default="runs/dropin")
    p.add_argument("--cuda", action="store_true",
                   help="trainers pin (pin_memory=True) and move batches to cuda: the native "
                        "share then decodes into a GPU pool with the mixed decoder")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--role", choices=["main", "trainer"], default="main")
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)  # a trainer's share key
    args = p.parse_args()
    if args.role == "trainer":
        return trainer(args)

    from batchcast.server import make_dataset

    make_dataset(args.data)
    rows = []
    for n in [int(x) for x in args.trainers.split(",")]:
        for mode in args.modes.split(","):
            rows.append(run_mode(args, mode, n))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"batch {args.batch_size}, image {args.image_size}, {args.epochs} epochs, "
          f"{args.workers} worker(s) per baseline trainer, {os.cpu_count()} cores"
          f"{', batches to cuda (native: the mixed decoder)' if args.cuda else ''}\n")
    print("| N | mode | samples | wall s | CPU core-s | CPU s/sample | vs N DataLoaders |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        base = next((b for b in rows if b["n"] == r["n"] and b["mode"] == "baseline"), None)
        rel = f"{r['cpu_per_sample'] / base['cpu_per_sample']:.3f}" if base else "-"
        print(f"| {r['n']} | {r['mode']} | {r['samples']} | {r['wall_s']:.1f} | "
              f"{r['cpu_core_s']:.1f} | {r['cpu_per_sample']:.5f} | {rel} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
