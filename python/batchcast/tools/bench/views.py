"""`batchcast bench --views`: the CPU a sweep's data side costs per consumed sample when N
trainers each want another view of one dataset (docs/views.md), three ways:
  views        one `batchcast serve` with a view per trainer: each sample decoded once for all;
  per-view     one `batchcast serve` per trainer (native decode, nothing shared);
  dataloaders  per trainer a torch DataLoader (ImageFolder + PIL + RandomResizedCrop(size) +
               ToTensor + Normalize), cores/N workers each: what the sweep runs today.
Trainers consume data only (each batch touched on the CPU, no model), so the figure is the data
side's: CPU seconds of every process of the mode (servers, trainers, DataLoader workers; from
/proc) over the samples the trainers consumed in a steady window, from every trainer's first
epoch read to its last (run_mode). Every trainer reads the same number of whole epochs. Writes views.json into --out and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence

from ... import _batchcast
from ...server import Server, launch, make_dataset
from . import probes

MODES = ("views", "per-view", "dataloaders")
SIZES = (224, 192, 160, 128)  # the sweep's resolutions, one per trainer (cycled)

TRAINER = textwrap.dedent("""
    import sys, torch
    mode, target, size, epochs, batch, workers = sys.argv[1:7]
    size, epochs, batch, workers = int(size), int(epochs), int(batch), int(workers)
    torch.set_num_threads(1)
    if mode == "dataloaders":
        import torchvision, torchvision.transforms as T
        ds = torchvision.datasets.ImageFolder(target, T.Compose([
            T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(),
            T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]))
        loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True,
                                             num_workers=workers, persistent_workers=True)
    else:
        import batchcast
        view = f"size={size}" if mode == "views" else None
        loader = batchcast.Loader(target, batch_size=batch, view=view, timeout=300)
    check = 0.0
    for _ in range(epochs):
        samples = 0
        for x, y in loader:
            check += float(x[:, :, 0, 0].sum())  # touched, as a trainer's first op would
            samples += len(y)
        print("epoch", samples, flush=True)
    print("done", flush=True)
    sys.stdin.readline()  # alive (its workers too) until the bench has read every CPU clock
""")


def _tree_cpu() -> float:
    """CPU seconds of every live process below this one (servers, trainers, their workers)."""
    return sum(probes.cpu_seconds(probes.descendants(os.getpid())).values())


def run_mode(mode: str, sizes: List[int], args: argparse.Namespace) -> Dict[str, Any]:
    """The window: from when a trainer has read its first epoch (start-up, imports and the
    ring's first fill behind it) to when it has read its last, every process still alive; the
    servers serve one epoch more than the trainers read, so that the ring runs ahead by as much
    at the window's end as at its start. One shared stream: one window, every process of the
    mode; independent streams (per-view, dataloaders): a window per trainer, its processes."""
    n = len(sizes)
    servers: List[Server] = []
    endpoints: List[str] = []
    tag = uuid.uuid4().hex[:8]
    log_path = os.path.join(args.out, f"{mode}-N{n}.log")
    open(log_path, "w").close()
    log = open(log_path, "a")  # appended to by the servers and the trainers alike

    def start(endpoint: str, size: int, **settings: Any) -> None:
        config = _batchcast.ServeConfig(
            data=args.data, batch_size=args.batch_size, epochs=args.epochs + 1,
            status_interval=0, endpoint=endpoint,
            transform=_batchcast.PipelineOptions(image_size=size), **settings)
        servers.append(launch(config, log=log_path, ready_timeout=None))

    if mode == "views":
        endpoints = [f"ipc:///tmp/bc-bench-views-{tag}.sock"] * n
        start(endpoints[0], sizes[0], min_consumers=n, views=[f"size={s}" for s in sizes[1:]],
              workers=args.cores)
    elif mode == "per-view":
        for i, s in enumerate(sizes):
            endpoints.append(f"ipc:///tmp/bc-bench-views-{tag}-{i}.sock")
            start(endpoints[-1], s, workers=max(1, args.cores // n))
    workers = max(1, args.cores // n)
    trainers = [subprocess.Popen(
        [sys.executable, "-c", TRAINER, mode,
         args.data if mode == "dataloaders" else endpoints[i], str(s), str(args.epochs),
         str(args.batch_size), str(workers)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=log, text=True) for i, s in enumerate(sizes)]
    try:
        counts: List[List[int]] = [[] for _ in trainers]

        def next_line(i: int) -> List[str]:
            line = trainers[i].stdout.readline()  # type: ignore[union-attr]
            if not line:
                raise RuntimeError(f"{mode}: trainer {i} failed (see {log.name})")
            return line.split()

        def group_cpu(i: int) -> float:
            """Trainer i's processes (and its own server's): independent streams run out of
            step, so each is timed over its own window; one shared stream over one window."""
            pids = [trainers[i].pid] + probes.descendants(trainers[i].pid)
            if mode == "per-view":
                pids.append(servers[i].pid)
            return sum(probes.cpu_seconds(pids).values())

        cpu, wall = 0.0, 0.0
        if mode == "views":  # one stream: every trainer in step, one window for all
            for i in range(n):
                counts[i].append(int(next_line(i)[1]))
            cpu0, t0 = _tree_cpu(), time.monotonic()
            for i in range(n):
                for _ in range(args.epochs - 1):
                    counts[i].append(int(next_line(i)[1]))
                assert next_line(i) == ["done"]
            cpu, wall = _tree_cpu() - cpu0, time.monotonic() - t0
        else:
            def window(i: int) -> None:
                counts[i].append(int(next_line(i)[1]))
                c0, w0 = group_cpu(i), time.monotonic()
                for _ in range(args.epochs - 1):
                    counts[i].append(int(next_line(i)[1]))
                assert next_line(i) == ["done"]
                spans[i] = (group_cpu(i) - c0, time.monotonic() - w0)

            spans: List[Any] = [None] * n
            threads = [threading.Thread(target=window, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(args.timeout)
            if any(sp is None for sp in spans):
                raise RuntimeError(f"{mode}: a trainer failed (see {log.name})")
            cpu, wall = sum(sp[0] for sp in spans), max(sp[1] for sp in spans)
    finally:
        for t in trainers:
            t.communicate("\n", timeout=60)
        for s in servers:
            s.stop(60)
        log.close()
    samples = sum(sum(c[1:]) for c in counts)
    return {"mode": mode, "trainers": n, "sizes": sizes, "samples": samples, "cpu_s": cpu,
            "wall_s": wall, "cpu_ms_per_sample": 1000 * cpu / samples}


def parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="batchcast bench --views", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--views", action="store_true", help="this benchmark")
    p.add_argument("--out", default="runs/bench-views")
    p.add_argument("--data", default="data/bench-views",
                   help="ImageFolder of JPEGs (made with make-dataset when missing)")
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--per-class", type=int, default=50)
    p.add_argument("--trainers", default="3,4", help="N values (views 224, 192, 160, 128 px)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--epochs", type=int, default=3, help="epochs each trainer reads (>= 2)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                   help="decoding threads of the shared server, DataLoader workers in all")
    p.add_argument("--timeout", type=float, default=900)
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse(argv)
    os.makedirs(args.out, exist_ok=True)
    make_dataset(args.data, args.classes, args.per_class)
    runs = []
    for n in [int(x) for x in args.trainers.split(",") if x]:
        sizes = [SIZES[i % len(SIZES)] for i in range(n)]
        for mode in args.modes.split(","):
            runs.append(run_mode(mode, sizes, args))
            r = runs[-1]
            print(f"N={n} {mode:12s} {r['samples']:6d} samples  {r['cpu_s']:7.1f} CPU-s  "
                  f"{r['cpu_ms_per_sample']:6.2f} CPU-ms/sample  {r['wall_s']:6.1f} s",
                  flush=True)
    for n in sorted({r["trainers"] for r in runs}):
        by = {r["mode"]: r for r in runs if r["trainers"] == n}
        if "views" in by and "dataloaders" in by:
            print(f"N={n}: views / dataloaders = "
                  f"{by['views']['cpu_ms_per_sample'] / by['dataloaders']['cpu_ms_per_sample']:.3f}")
        if "views" in by and "per-view" in by:
            print(f"N={n}: views / per-view = "
                  f"{by['views']['cpu_ms_per_sample'] / by['per-view']['cpu_ms_per_sample']:.3f}")
    with open(os.path.join(args.out, "views.json"), "w") as f:
        json.dump({"args": vars(args), "runs": runs}, f, indent=1)
