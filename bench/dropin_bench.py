"""The drop-in on a torchvision ImageFolder pipeline: CPU per consumed sample of N trainers,
native path vs Python producer vs N plain torch DataLoaders (issue 15).

Every trainer builds the same dataset: ImageFolder + RandomResizedCrop(S) + RandomHorizontalFlip
+ ToTensor + Normalize, and reads --epochs epochs of it:

- ``baseline``: its own torch DataLoader (--workers worker processes);
- ``python``: one producer process runs a torch DataLoader over the dataset (N x --workers
  workers, capped at the cores) through ``batchcast.Producer``, as ``DataLoader(share=)``'s
  producer does; trainers read it with ``batchcast.Loader``;
- ``native``: ``batchcast.torchvision_plan.plan`` recognises the pipeline and ``batchcast serve``
  runs with the plan's arguments (same worker budget); trainers read it with ``Loader``.

CPU is the built-in collector's for every side (trainers and producer with
``batchcast.metrics.track``, the server with ``--metrics-dir``: itself and its consumers),
divided by the samples the trainers consumed. Once ``DataLoader(share=)`` serves recognised
pipelines natively, ``native`` and ``python`` become the two settings of its native switch:
replace ``serve_native``/``serve_python`` with trainers that call ``batchcast.DataLoader``.

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
                persistent_workers=workers > 0)


def trainer(args: argparse.Namespace) -> None:
    """One trainer: reads --epochs epochs and prints {samples, wall_s} as a JSON line."""
    import torch

    import batchcast

    torch.set_num_threads(1)
    tracker = None
    if args.mode == "baseline":
        loader: Any = torch.utils.data.DataLoader(dataset(args), **loader_args(args, args.workers))
        tracker = batchcast.metrics.track(args.out, role="trainer")
    else:
        loader = batchcast.Loader(args.endpoint, batch_size=args.batch_size, drop_last=True,
                                  timeout=300, name="trainer")
        if args.mode == "python":  # the server's collector counts its consumers; a Producer not
            tracker = batchcast.metrics.track(args.out, role="trainer")
    samples, start = 0, time.time()
    for _ in range(args.epochs):
        for images, _labels in loader:
            samples += images.shape[0]
            if tracker is not None:
                tracker.add_samples(images.shape[0])
    if tracker is not None:
        tracker.stop()
    print(json.dumps({"samples": samples, "wall_s": time.time() - start}), flush=True)


def producer(args: argparse.Namespace) -> None:
    """The Python producer of ``python`` mode: a torch DataLoader through batchcast.Producer."""
    import torch

    import batchcast

    torch.set_num_threads(1)
    loader = torch.utils.data.DataLoader(dataset(args), **loader_args(args, args.workers))
    with batchcast.metrics.track(args.out, role="server"):
        batchcast.Producer(loader, endpoint=args.endpoint, min_consumers=args.n).run(args.epochs)


def role_cmd(args: argparse.Namespace, role: str, mode: str, out: str, endpoint: str,
             workers: int, n: int = 1) -> List[str]:
    return [sys.executable, os.path.abspath(__file__), "--role", role, "--mode", mode,
            "--data", args.data, "--batch-size", str(args.batch_size), "--image-size",
            str(args.image_size), "--epochs", str(args.epochs), "--workers", str(workers),
            "--out", out, "--endpoint", endpoint, "--n", str(n)]


def run_trainers(cmds: List[List[str]]) -> List[Dict[str, Any]]:
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in cmds]
    results = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"trainer failed ({p.returncode}):\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def run_mode(args: argparse.Namespace, mode: str, n: int) -> Dict[str, Any]:
    import batchcast
    from batchcast.torchvision_plan import NativePlan, plan

    out = os.path.join(args.out, f"{mode}-{n}")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    endpoint = f"ipc:///tmp/batchcast-dropin-{os.getpid()}-{mode}-{n}.sock"
    shared_workers = min(n * args.workers, os.cpu_count() or 1)
    trainers = [role_cmd(args, "trainer", mode, out, endpoint, args.workers) for _ in range(n)]
    if mode == "baseline":
        results = run_trainers(trainers)
    elif mode == "python":
        log_path = os.path.join(args.out, f"producer-{n}.log")  # outside the run directory
        with open(log_path, "w") as log:
            prod = subprocess.Popen(role_cmd(args, "producer", mode, out, endpoint,
                                             shared_workers, n), stdout=log, stderr=log)
        try:
            results = run_trainers(trainers)
        finally:
            if prod.wait(120) != 0:
                raise RuntimeError(f"producer failed ({prod.returncode}), see {log_path}")
    else:
        p = plan(dataset(args), loader_args(args, args.workers))
        if not isinstance(p, NativePlan):
            raise RuntimeError(f"the bench pipeline is not recognised: {p.reason}")
        with batchcast.serve(endpoint=endpoint, epochs=args.epochs, min_consumers=n,
                             workers=shared_workers, metrics_dir=out,
                             extra_args=["--status-interval", "0"], **p.serve_kwargs()) as server:
            results = run_trainers(trainers)
            server.wait(60)
    summary = batchcast.metrics.summarize(out)
    samples = sum(r["samples"] for r in results)
    cpu = summary["cpu_core_s"]["all"]
    return {"mode": mode, "n": n, "samples": samples, "cpu_core_s": cpu,
            "cpu_per_sample": cpu / samples, "wall_s": max(r["wall_s"] for r in results),
            "workers": args.workers if mode == "baseline" else shared_workers}


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
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--role", choices=["main", "trainer", "producer"], default="main")
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "trainer":
        return trainer(args)
    if args.role == "producer":
        return producer(args)

    from batchcast.server import find_binary

    if not (os.path.isdir(args.data) and os.listdir(args.data)):
        subprocess.run([find_binary(), "make-dataset", "--out", args.data], check=True)
    rows = []
    for n in [int(x) for x in args.trainers.split(",")]:
        for mode in args.modes.split(","):
            rows.append(run_mode(args, mode, n))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"batch {args.batch_size}, image {args.image_size}, {args.epochs} epochs, "
          f"{args.workers} worker(s) per baseline trainer, {os.cpu_count()} cores\n")
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
