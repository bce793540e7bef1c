"""N collocated trainings on one GPU, fed by each data path an H100 user would pick, measured
side by side in one invocation. Peers (batchcast.tools.bench.sources):
  synthetic         random tensors already on the GPU: the GPU-bound ceiling;
  dataloader        per trainer a torch DataLoader (ImageFolder + PIL) with cores/N workers;
  gpu-decode        per trainer torchvision.io.decode_jpeg on CUDA + crops on the GPU;
  batchcast-cpu     one `batchcast serve` (CPU decoder) for all N trainers;
  batchcast-nvjpeg  one `batchcast serve --decoder nvjpeg` for all N trainers;
  batchcast-mixed   one `batchcast serve --decoder mixed` (CPU workers first, nvJPEG the rest);
  batchcast-*-cached  the same with the decoded cache (`--cache decoded`), measured after
                    --cache-epochs epochs filled it;
  dali              per trainer an NVIDIA DALI pipeline (mixed decode), where importable.
Trainers train as people do today: bf16 autocast + channels_last (--fp32: plain float32).
Per run: aggregate samples/s over one shared window, its share of the synthetic ceiling, the
CPU cores busy (all, and the data side's), GPU watts and joules per sample (NVML); per
trainer: its samples/s and its share of the same trainer's rate in the synthetic run.

A regime is its trainers' (model, image size): `--regimes resnet18:224:4` is four of one
kind; `--regimes resnet18:224+resnet50:192+mobilenet_v3_small:160+resnet18:128` (a mixed
regime) gives each trainer its own model and size. The batchcast peers then serve all sizes
from one server (the first trainer's size, a view per other size: docs/views.md, one decode
for all; with the nvJPEG and mixed decoders too: one GPU decode, one crop/resize per size). A
mixed regime's report adds a table per trainer. The H100 run of the mixed regime:
  batchcast bench --data DIR --regimes resnet18:224+resnet50:192+mobilenet_v3_small:160+\
resnet18:128 --peers synthetic,gpu-decode,batchcast-cpu,dataloader --data-cores 2

Optional: a sweep over the cores the data side may use (--cores-sweep; the fewest reaching
95 % of the ceiling is reported) and data-only rates on the same files (--anchor, with
--cuda-bench for the nvJPEG engine's standalone rate). Writes results.json, results.md and
results.png into --out and prints the tables; each run's figures also go to runs/TAG.json as it
ends, so an invocation cut short keeps the runs it finished.

Run: `batchcast bench --plan h100 --data DIR` (the compact GPU run: resnet18 224 px at N = 4
and 8, mobilenet_v3_small 128 px at N = 8, a cores sweep at N = 4, the anchor), or choose
--models/--image-sizes/--trainers/--peers; `--quick` is the tiny CPU run CI uses to prove the
benchmark works (no timing is asserted anywhere).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..._energy import GpuEnergy
from ...server import make_dataset
from . import probes, report
from .runner import PEERS, RunError, measure, unavailable

PLANS: Dict[str, Dict[str, Any]] = {
    "h100": {"regimes": "resnet18:224:4,resnet18:224:8,mobilenet_v3_small:128:8",
             "cores_sweep": "1,2,4,8,16", "sweep_peers": "batchcast-nvjpeg,batchcast-mixed,dataloader",
             "anchor": "batchcast-cpu,batchcast-nvjpeg,gpu-decode,dali"},
    # CI: every peer once (GPU ones say why they skip), the data side pinned to one core where
    # there are two; the report's sweep and anchor tables are unit-tested on their own.
    "quick": {"regimes": "small_cnn:64:2", "data_cores": 1, "batch_size": 8, "classes": 2,
              "per_class": 12,
              "warmup": 1, "settle": 0.0, "seconds": 0.3, "device": "cpu"},
}


def _ints(text: str) -> List[int]:
    return [int(x) for x in text.split(",") if x]


def _names(text: Optional[str]) -> List[str]:
    return [x for x in (text or "").split(",") if x]


def parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="batchcast bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", choices=sorted(PLANS), help="a preset; explicit options win")
    p.add_argument("--quick", action="store_const", const="quick", dest="plan",
                   help="same as --plan quick: tiny CPU sizes, proves the bench runs (CI)")
    p.add_argument("--out", default="runs/bench")
    p.add_argument("--data", help="ImageFolder of JPEGs (made with make-dataset when missing; "
                                  "default data/bench, quick: OUT/data)")
    p.add_argument("--classes", type=int, help="classes of a made dataset and of the models (10)")
    p.add_argument("--per-class", type=int, help="images per class of a made dataset (100)")
    p.add_argument("--regimes", help="MODEL:SIZE:N (N trainers of one model and size) or "
                                     "MODEL:SIZE+MODEL:SIZE+... (a trainer per part), "
                                     "comma-separated (default: the product of --models, "
                                     "--image-sizes and --trainers)")
    p.add_argument("--models", default="resnet18",
                   help="torchvision or timm names (resnet50, mobilenet_v3_small, "
                        "efficientnet_b0), "
                        "small_cnn, or none (data only)")
    p.add_argument("--image-sizes", default="224")
    p.add_argument("--trainers", default="1,2,4,8,16", help="N values")
    p.add_argument("--peers", help=f"subset of {','.join(PEERS)} (default all)")
    p.add_argument("--data-cores", type=int, help="cores the data side may use (default all)")
    p.add_argument("--cores-sweep", help="K values: rerun --sweep-peers in the first regime with "
                                         "the data side limited to K cores")
    p.add_argument("--sweep-peers", help="peers of the cores sweep (default batchcast-nvjpeg,"
                                         "dataloader)")
    p.add_argument("--anchor", help="peers to measure data only (N = 1, all cores)")
    p.add_argument("--cuda-bench", help="path of build-gpu/bench/cuda_bench: adds the nvJPEG "
                                        "engine's standalone rate on --data to the anchor")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--chunk-size", type=int, help="samples per chunk of the batchcast servers "
                                                 "(default the batch size)")
    p.add_argument("--fp32", action="store_true", help="train in float32 NCHW")
    p.add_argument("--gpus", type=int, default=1,
                   help="spread the trainers over GPUs 0..G-1; batchcast peers serve them from "
                        "one server with its pool on every GPU, -pergpu peers from one per GPU")
    p.add_argument("--device", help="cuda or cpu (default cuda where torch sees a GPU)")
    p.add_argument("--warmup", type=int, help="steps per trainer before the window (5)")
    p.add_argument("--settle", type=float, help="seconds trained, uncounted, after all are "
                                                "ready: drains queues filled while waiting (2)")
    p.add_argument("--seconds", type=float, help="measured window per run (10: with 4 s, runs "
                                                 "of one command varied by up to 10 points)")
    p.add_argument("--run-timeout", type=float, default=120.0, help="a run's time limit (s)")
    p.add_argument("--order", choices=["exact", "relaxed"], default="exact",
                   help="the order the batchcast peers' trainers read in (docs/stream.md, Order): "
                        "relaxed lets each read at its own pace from one decode")
    p.add_argument("--ring", type=int, default=0,
                   help="slots of the batchcast servers' pools (0: the server's default, 8 on a "
                        "GPU)")
    p.add_argument("--cache-epochs", type=int, default=1,
                   help="epochs each trainer of a -cached peer reads before the window (its "
                        "server keeps the decoded images: --cache decoded), so that the window "
                        "measures the epochs after")
    args = p.parse_args(argv)
    defaults = {"batch_size": 128, "classes": 10, "per_class": 100, "warmup": 5, "settle": 2.0,
                "seconds": 10.0, "sweep_peers": "batchcast-nvjpeg,dataloader"}
    for key, value in {**defaults, **PLANS.get(args.plan or "", {})}.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.data is None:
        args.data = os.path.join(args.out, "data") if args.plan == "quick" else "data/bench"
    return args


def parse_regime(spec: str) -> List[Tuple[str, int]]:
    """One --regimes entry as its trainers' (model, image size): MODEL:SIZE:N is N trainers of
    one model and size, MODEL:SIZE+MODEL:SIZE+... one trainer per part (a mixed regime)."""
    parts = spec.split("+")
    try:
        if len(parts) == 1 and spec.count(":") == 2:
            model, size, n = spec.split(":")
            trainers = [(model, int(size))] * int(n)
        else:
            trainers = [(m, int(s)) for m, s in (p.split(":") for p in parts)]
    except ValueError:
        raise SystemExit(f"--regimes {spec}: use MODEL:SIZE:N (e.g. resnet18:224:4) or "
                         f"MODEL:SIZE+MODEL:SIZE+... (e.g. resnet18:224+resnet50:192)")
    if not trainers or any(size < 1 for _, size in trainers):
        raise SystemExit(f"--regimes {spec}: needs at least one trainer and sizes >= 1")
    return trainers


def regimes(args: argparse.Namespace) -> List[List[Tuple[str, int]]]:
    """Each regime as its trainers' (model, image size), trainer i at index i."""
    if args.regimes:
        return [parse_regime(r) for r in _names(args.regimes)]
    return [[(m, int(s))] * int(n) for m, s, n in itertools.product(
        _names(args.models), _names(args.image_sizes), _names(args.trainers))]


def run_one(args: argparse.Namespace, energy: GpuEnergy, peer: str,
            trainers: List[Tuple[str, int]], cores: Optional[int], tag: str) -> Dict[str, Any]:
    why = unavailable(peer, args, trainers)
    if why:
        print(f"[bench] {tag}: {why}", flush=True)
        return {"peer": peer, "skipped": why}
    t0 = time.time()
    try:
        fig = measure(args, energy, peer, trainers, cores, os.path.join(args.out, "logs", tag))
    except RunError as e:
        print(f"[bench] {tag}: FAILED\n{e}", flush=True)
        return {"peer": peer, "error": str(e)}
    print(f"[bench] {tag}: {fig['samples_per_s']:.0f} samples/s, {fig['cpu_cores']:.1f} cores "
          f"busy, J/sample {report._f(fig['joules_per_sample'], '.3f')} ({time.time() - t0:.0f} s)",
          flush=True)
    # Each run's figures as soon as it ends: an invocation cut short keeps the runs it finished.
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    with open(os.path.join(args.out, "runs", f"{tag}.json"), "w") as f:
        json.dump(fig, f, indent=1)
    return fig


def run_regime(args: argparse.Namespace, energy: GpuEnergy, peers: List[str],
               trainers: List[Tuple[str, int]]) -> Dict[str, Any]:
    """Every peer on one regime; each trainer's figures then carry its share of the same
    trainer's rate in the synthetic run (of_ceiling; None where synthetic did not run)."""
    name = report.regime_name(trainers)
    runs = {p: run_one(args, energy, p, trainers, args.data_cores, f"{name}-{p}") for p in peers}
    top = runs.get("synthetic", {}).get("per_trainer")
    for fig in runs.values():
        for i, t in enumerate(fig.get("per_trainer", [])):
            t["of_ceiling"] = t["samples_per_s"] / top[i]["samples_per_s"] if top else None
    return {"trainers": trainers, "n": len(trainers), "runs": runs}


def engine_rate(args: argparse.Namespace) -> Optional[List[str]]:
    """cuda_bench's Markdown rows for the decoders on --data's files, or None without it."""
    if not args.cuda_bench:
        return None
    if not os.access(args.cuda_bench, os.X_OK):
        return [f"cuda_bench: {args.cuda_bench} is not an executable (not built?)"]
    proc = subprocess.run([args.cuda_bench, "--decode", args.data], capture_output=True, text=True)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    if proc.returncode != 0:
        return rows + [f"cuda_bench failed: {proc.stderr[-500:]}"]
    return rows or [f"cuda_bench: {proc.stdout.strip()}"]  # e.g. no CUDA device


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse(argv)
    os.makedirs(args.out, exist_ok=True)
    make_dataset(args.data, args.classes, args.per_class)
    peers = _names(args.peers) or list(PEERS)
    energy = GpuEnergy(range(args.gpus if args.device.startswith("cuda") else 1))
    meta = dict(probes.machine(), **{k: getattr(args, k) for k in (
        "batch_size", "chunk_size", "fp32", "device", "warmup", "settle", "seconds", "data",
        "data_cores", "gpus", "order", "cache_epochs", "ring")})
    results: Dict[str, Any] = {"meta": meta, "regimes": []}
    for trainers in regimes(args):
        results["regimes"].append(run_regime(args, energy, peers, trainers))
    if args.cores_sweep and results["regimes"]:
        first = results["regimes"][0]
        sweep: Dict[str, Any] = {"trainers": first["trainers"], "n": first["n"], "runs": []}
        for peer, k in itertools.product(_names(args.sweep_peers), _ints(args.cores_sweep)):
            full = first["runs"].get(peer, {})
            if k >= meta["cores"] and full.get("cores") == meta["cores"]:
                sweep["runs"].append(full)  # the regime's own run already had every core
            else:
                sweep["runs"].append(dict(run_one(args, energy, peer, first["trainers"], k,
                                                  f"sweep-{peer}-{k}cores"), cores=k))
        results["sweep"] = sweep
    if args.anchor:
        none = [("none", results["regimes"][0]["trainers"][0][1] if results["regimes"] else 224)]
        results["anchor"] = {"runs": {p: run_one(args, energy, p, none, None, f"anchor-{p}")
                                      for p in _names(args.anchor)}, "engine": engine_rate(args)}
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    text = report.markdown(results)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text + "\n")
    report.plot(results, os.path.join(args.out, "results.png"))
    print(text)
    print(f"[bench] wrote {args.out}/results.json, results.md, results.png")


if __name__ == "__main__":
    main()
