"""Time to first batch: how long a trainer waits for its first batch, side by side in one run.

Every case runs in a fresh process that has already imported torch, torchvision and batchcast
and built the dataset (as a trainer has before it makes its loader): ImageFolder +
RandomResizedCrop(S) + RandomHorizontalFlip + ToTensor + Normalize. It then times loader
construction, ``iter(loader)`` and the first ``next()`` (with --cuda: pin_memory=True and until
the batch is on cuda:0, where the share and the Loader case decode into a GPU pool with the
mixed decoder):

- ``torch-0``, ``torch-W``: ``torch.utils.data.DataLoader`` with 0 and --workers workers;
- ``share-cold``: ``batchcast.DataLoader(share=KEY)``, the first trainer of a fresh key (the
  share producer must start: native pipeline, --workers decoding threads); ``share-cold-gap``
  the same with --gap seconds between construction and ``iter`` (a trainer building its model);
- ``share-warm``: a second trainer joining the key while a first one holds it;
- ``loader``: ``batchcast.Loader`` against a ``batchcast serve`` of the same pipeline, running
  (its ring filled while the case process started); ``loader-late``: a second one, after the
  first left (late join: the epoch replayed from its start, chunks the ring no longer holds
  decoded again).

``--before DIR`` runs the share cases also with the batchcast package in DIR (an earlier
version's install, copied), in the same run. "construct -> first" is the time from the loader's constructor to its first batch (with no
gap); "iter -> first" from ``iter(loader)``. The cold share is broken down from its DEBUG log
lines (logger ``batchcast``) and the producer's log (the steps it names, in seconds after the
trainer launched it). The anatomy rows time each step of a cold start alone: a Python process,
importing torch + torchvision, importing the native module alone, pickling the trainer's
pipeline and reading it back, the folder scan, and the native server's start in-process (until
its socket exists) and its first chunk to a Loader.

Run: ``.venv/bin/python bench/ttfb_bench.py --data data/ttfb`` (--repeats, --json)
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from dropin_bench import dataset  # bench/ is the script's folder: on sys.path


def loader_args(args: argparse.Namespace, workers: int) -> Dict[str, Any]:
    return dict(batch_size=args.batch_size, shuffle=True, drop_last=True, num_workers=workers,
                pin_memory=args.cuda)


class _Steps:
    """A logging handler keeping (time, message) of the batchcast logger's records."""

    def __init__(self) -> None:
        import logging

        self.records: List[tuple] = []
        handler = logging.Handler(logging.DEBUG)
        handler.emit = lambda r: self.records.append((r.created, r.getMessage()))  # type: ignore
        log = logging.getLogger("batchcast")
        log.setLevel(logging.DEBUG)
        log.addHandler(handler)


def case(args: argparse.Namespace) -> None:
    """One trainer: prints {construct_s, iter_to_first_s, construct_to_first_s, steps}."""
    import torch

    import batchcast

    torch.set_num_threads(1)
    if args.cuda:
        torch.zeros(1, device="cuda")  # the trainer's CUDA context exists before its loader
    steps = _Steps()
    data = dataset(args)
    t0 = time.time()
    if args.case.startswith("torch"):
        loader: Any = torch.utils.data.DataLoader(data, **loader_args(args, args.workers))
    elif args.case == "loader":
        loader = batchcast.Loader(args.key, batch_size=args.batch_size, drop_last=True,
                                  device="cuda:0" if args.cuda else None)
    else:
        loader = batchcast.DataLoader(data, share=args.key, **loader_args(args, args.workers))
    t1 = time.time()
    if args.gap:
        time.sleep(args.gap)
    t2 = time.time()
    batches = iter(loader)
    images, _ = next(batches)
    if args.cuda:  # as a training step would; a no-op for batches nvJPEG put there
        images = images.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
    t3 = time.time()
    assert images.shape == (args.batch_size, 3, args.image_size, args.image_size), images.shape
    out = {"construct_s": t1 - t0, "iter_to_first_s": t3 - t2,
           "construct_to_first_s": t3 - t0 - args.gap,
           "steps": [(round(t - t2, 4), m) for t, m in steps.records]}
    print(json.dumps(out), flush=True)
    if args.case == "holder":  # keeps the share until the bench closes stdin
        sys.stdin.read()
    del images, batches
    if hasattr(loader, "close"):
        loader.close()


def case_cmd(args: argparse.Namespace, name: str, key: str, workers: int, gap: float = 0.0
             ) -> List[str]:
    return [sys.executable, os.path.abspath(__file__), "--role", "case", "--case", name,
            "--data", args.data, "--batch-size", str(args.batch_size), "--image-size",
            str(args.image_size), "--workers", str(workers), "--key", key, "--gap", str(gap)
            ] + (["--cuda"] if args.cuda else [])


def run_case(cmd: List[str], env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def wait_gone(key: str) -> str:
    """Waits for the share producer of ``key`` to exit; its log (removed)."""
    from batchcast.dataloader import share_paths

    paths = share_paths(key)
    deadline = time.monotonic() + 60
    while os.path.exists(paths["state"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        with open(paths["log"]) as f:
            text = f.read()
        os.unlink(paths["log"])
    except OSError:
        text = ""
    return text


def producer_steps(log: str) -> List[str]:
    """The producer's start-up steps as its log states them (``... after launch: ...``)."""
    return [line.split(": ", 1)[-1] for line in log.splitlines() if "after launch" in line]


def cases(args: argparse.Namespace, rep: int) -> Dict[str, Dict[str, Any]]:
    import batchcast

    tag = f"ttfb-{os.getpid()}-{rep}"
    got: Dict[str, Dict[str, Any]] = {}
    got["torch-0"] = run_case(case_cmd(args, "torch", tag, 0))
    got[f"torch-{args.workers}"] = run_case(case_cmd(args, "torch", tag, args.workers))
    versions = [("", dict(os.environ, BATCHCAST_KEEP_SHARE_LOG="1"))]
    if args.before:  # the same share cases with another batchcast package, interleaved
        versions.append((" (before)", dict(versions[0][1], PYTHONPATH=args.before)))
    for suffix, env in versions:
        for name, gap in (("share-cold", 0.0), ("share-cold-gap", args.gap)):
            key = f"{tag}-{name}{suffix.strip(' ()')}"
            got[name + suffix] = run_case(case_cmd(args, "share", key, args.workers, gap), env)
            got[name + suffix]["producer"] = producer_steps(wait_gone(key))
        # A first trainer holds the key while the second one joins.
        key = f"{tag}-warm{suffix.strip(' ()')}"
        holder = subprocess.Popen(case_cmd(args, "holder", key, args.workers), env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdin is not None
        holder.stdout.readline()
        got["share-warm" + suffix] = run_case(case_cmd(args, "share", key, args.workers), env)
        holder.stdin.close()
        holder.wait()
        wait_gone(key)
    endpoint = f"ipc://{tempfile.gettempdir()}/{tag}-serve.sock"
    config = native_config(args)
    with batchcast.serve(endpoint=endpoint, epochs=None, config=config, workers=args.workers):
        got["loader"] = run_case(case_cmd(args, "loader", endpoint, args.workers))
        got["loader-late"] = run_case(case_cmd(args, "loader", endpoint, args.workers))
    return got


def native_config(args: argparse.Namespace) -> Any:
    from batchcast import _torchvision_plan as torchvision_plan

    device = "cuda:0" if args.cuda else None
    plan = torchvision_plan.plan(dataset(args), dict(loader_args(args, 0)), seed=0,
                                 device=device, nvjpeg=args.cuda)
    assert isinstance(plan, torchvision_plan.NativePlan), plan
    return plan.serve_config()


def timed_process(code: str) -> float:
    t = time.time()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.time() - t


def anatomy(args: argparse.Namespace) -> Dict[str, float]:
    """Each step of a cold start alone, seconds."""
    import batchcast
    from batchcast import _batchcast
    from batchcast._share import pipeline_of

    out: Dict[str, float] = {}
    out["python process (spawn, start, exit)"] = min(timed_process("pass") for _ in range(3))
    base = out["python process (spawn, start, exit)"]
    out["import torch + torchvision"] = timed_process("import torch, torchvision") - base
    out["import batchcast._batchcast alone"] = timed_process("import batchcast._batchcast") - base
    loader = batchcast.DataLoader(dataset(args), **loader_args(args, args.workers))
    pipeline = pipeline_of(loader, None)[0]
    t = time.time()
    blob = pickle.dumps(pipeline, protocol=pickle.HIGHEST_PROTOCOL)
    out["pickle the pipeline (trainer)"] = time.time() - t
    t = time.time()
    pickle.loads(blob)
    out["unpickle it (torch already imported)"] = time.time() - t
    # An ImageNet-sized ImageFolder's samples (1.28 M): what a Python producer unpickles.
    samples = [(f"/data/imagenet/train/n{c:08d}/n{c:08d}_{i}.JPEG", c)
               for c in range(1000) for i in range(1281)]
    t = time.time()
    blob = pickle.dumps((samples, [label for _, label in samples]), pickle.HIGHEST_PROTOCOL)
    out["pickle 1.28 M ImageNet samples (trainer)"] = time.time() - t
    t = time.time()
    pickle.loads(blob)
    out["unpickle them (producer)"] = time.time() - t
    del samples, blob
    t = time.time()
    n = len(_batchcast.Dataset.image_folder(args.data))
    out[f"folder scan ({n} files)"] = time.time() - t
    config = native_config(args)
    config.endpoint = f"ipc://{tempfile.gettempdir()}/ttfb-{os.getpid()}-anatomy.sock"
    config.epochs, config.workers = 0, args.workers
    t = time.time()
    server = _batchcast.ServeRun(config)
    out["native server start (scan, pool, socket)"] = time.time() - t
    t = time.time()
    if not args.cuda:  # a GPU pool is read from another process only (CUDA IPC)
        with batchcast.Loader(config.endpoint, batch_size=args.batch_size) as reader:
            next(iter(reader))
            out["its first chunk to a Loader"] = time.time() - t
    server.stop()
    server.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="ImageFolder (made with make-dataset if empty)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers / server threads")
    p.add_argument("--gap", type=float, default=2.0,
                   help="seconds between construction and iter in share-cold-gap")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cuda", action="store_true",
                   help="pin_memory=True and batches moved to cuda:0 (the share and the Loader "
                        "case then decode into a GPU pool, the mixed decoder)")
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--before", metavar="DIR",
                   help="a folder holding another batchcast package (a copy of an earlier "
                        "install): the share cases also run with it, interleaved")
    p.add_argument("--role", choices=["main", "case"], default="main")
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--key", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "case":
        return case(args)
    args.data = os.path.abspath(args.data)
    from batchcast.server import make_dataset

    make_dataset(args.data, 10, 60)
    runs: List[Dict[str, Any]] = []
    parts: Dict[str, float] = {}

    def save() -> None:  # after every step: a run cut short still leaves what it measured
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"runs": runs, "anatomy": parts, "args": vars(args)}, f, indent=1)

    for rep in range(args.repeats):
        runs.append(cases(args, rep))
        save()
    report_cases(args, runs)
    parts.update(anatomy(args))
    save()
    report_anatomy(parts)


def report_cases(args: argparse.Namespace, runs: List[Dict[str, Any]]) -> None:
    print(f"batch {args.batch_size}, {args.image_size} px, {args.workers} workers, "
          f"{os.cpu_count()} cores{', batches to cuda:0' if args.cuda else ''}, median of "
          f"{len(runs)} runs, seconds\n")
    print("| case | construct -> first | iter -> first | vs torch-W (iter -> first) |")
    print("|---|---|---|---|")
    torch_w = statistics.median(r[f"torch-{args.workers}"]["iter_to_first_s"] for r in runs)
    for name in runs[0]:
        c2f = statistics.median(r[name]["construct_to_first_s"] for r in runs)
        i2f = statistics.median(r[name]["iter_to_first_s"] for r in runs)
        print(f"| {name} | {c2f:.3f} | {i2f:.3f} | {i2f - torch_w:+.3f} |")
    print("\nshare-cold, last run: the trainer's steps (s after iter) and the producer's")
    last = runs[-1]["share-cold"]
    for t, message in last["steps"]:
        text = re.sub(r"\s+", " ", message)[:150]
        print(f"  {t:7.3f}  {text}")
    for line in last["producer"]:
        print(f"  producer: {line}")
    sys.stdout.flush()


def report_anatomy(parts: Dict[str, float]) -> None:
    print("\n| step alone | s |\n|---|---|")
    for name, seconds in parts.items():
        print(f"| {name} | {seconds:.3f} |")


if __name__ == "__main__":
    main()
