"""N collocated trainings: batchcast (one shared server) versus N independent DataLoaders.

For every N it runs, side by side in one invocation:
  baseline  N trainer processes, each with its own torch DataLoader (ImageFolder + the same
            transforms, --workers workers each), recording their CPU (workers included) with
            batchcast.metrics.track;
  shared    one `batchcast serve` (workers = the baseline's total worker budget, capped at the
            machine's cores) recording itself and its consumers with --metrics-dir, and N trainer
            processes reading from it with batchcast.Loader.
Figures per N: aggregate samples/s, CPU core-seconds per consumed sample (same collector, same
method), mean GPU utilisation where NVML exists, and the ratios shared/baseline; with --data-only
also the ceiling where trainers do no training. Writes results.json, results.png and a Markdown
table (printed, and in results.md) into --out.

Run: `batchcast bench --out runs/bench` (or `python -m batchcast.bench.collocated ...`); `--quick` is the
tiny configuration CI runs to prove the benchmark works (no timing is asserted anywhere).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence

from batchcast import metrics
from batchcast.server import find_binary


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gpu_name() -> str | None:
    try:
        import torch
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no GPU is an answer, not an error
        return None


def ensure_dataset(args: argparse.Namespace) -> None:
    if os.path.isdir(args.data) and os.listdir(args.data):
        return
    subprocess.run([find_binary(), "make-dataset", "--out", args.data, "--classes",
                    str(args.classes), "--per-class", str(args.per_class)], check=True)


def trainer_cmd(args: argparse.Namespace, mode: str, model: str, extra: List[str]) -> List[str]:
    return [sys.executable, "-m", "batchcast.bench.trainer", "--mode", mode, "--data", args.data,
            "--batch-size", str(args.batch_size), "--image-size", str(args.image_size),
            "--steps", str(args.steps), "--model", model, "--classes", str(args.classes),
            "--device", args.device, "--warmup", str(args.warmup), *extra]


def run_trainers(cmds: List[List[str]]) -> List[Dict[str, Any]]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for c in cmds]
    results = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"trainer failed ({p.returncode}):\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def figures(results: List[Dict[str, Any]], summary: Dict[str, Any]) -> Dict[str, Any]:
    samples = sum(r["samples"] for r in results)
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    cpu = (summary.get("cpu_core_s") or {}).get("all") or 0.0
    return {"samples": samples, "wall_s": wall, "samples_per_s": samples / wall,
            "cpu_core_s": cpu, "cpu_core_s_per_sample": cpu / samples if samples else None,
            "gpu_util_percent": summary.get("mean_gpu_utilization_percentage"),
            "wait_s": sum(r["wait_s"] for r in results)}


def run_baseline(args: argparse.Namespace, n: int, model: str, out: str) -> Dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    extra = ["--workers", str(args.workers), "--metrics-dir", out]
    results = run_trainers([trainer_cmd(args, "baseline", model, extra) for _ in range(n)])
    return figures(results, metrics.summarize(out))


def run_shared(args: argparse.Namespace, n: int, model: str, out: str) -> Dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    endpoint = f"ipc:///tmp/batchcast-bench-{os.getpid()}-{n}.sock"
    workers = min(n * args.workers, os.cpu_count() or 1)
    server = subprocess.Popen(
        [find_binary(), "serve", "--data", args.data, "--endpoint", endpoint, "--batch-size",
         str(args.batch_size), "--image-size", str(args.image_size), "--workers", str(workers),
         "--epochs", "0", "--min-consumers", str(n), "--metrics-dir", out, "--status-interval", "0",
         # On a GPU the pool lives in device memory: trainers get zero-copy CUDA tensors.
         "--device", "cuda:0" if args.device.startswith("cuda") else "cpu",
         "--decoder", args.decoder, "--metrics-interval", str(args.interval)],
        stderr=subprocess.PIPE, text=True)
    try:
        results = run_trainers([trainer_cmd(args, "shared", model, ["--endpoint", endpoint])
                                for _ in range(n)])
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=60)
    if server.returncode != 0:
        raise RuntimeError(f"server failed ({server.returncode}):\n{err[-3000:]}")
    return dict(figures(results, metrics.summarize(out)), server_workers=workers)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown(rows: List[Dict[str, Any]], meta: Dict[str, Any]) -> str:
    lines = [f"Hardware: {meta['cpu']} ({meta['cores']} cores){', ' + meta['gpu'] if meta['gpu'] else ''}; "
             f"batch {meta['batch_size']}, image {meta['image_size']}, {meta['steps']} steps per "
             f"trainer, baseline {meta['workers']} workers per trainer, batchcast decoder "
             f"{meta.get('decoder', 'cpu')}.", "",
             "| N | model | baseline samples/s | batchcast samples/s | throughput ratio | "
             "baseline CPU s/sample | batchcast CPU s/sample | CPU ratio | 1/N + 10% | GPU util b/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b, s = r["baseline"], r["shared"]
        gpu = f"{fmt(b['gpu_util_percent'], '.0f')}/{fmt(s['gpu_util_percent'], '.0f')}"
        lines.append(
            f"| {r['n']} | {r['model']} | {b['samples_per_s']:.0f} | {s['samples_per_s']:.0f} | "
            f"{fmt(r['throughput_ratio'], '.2f')} | {fmt(b['cpu_core_s_per_sample'], '.5f')} | "
            f"{fmt(s['cpu_core_s_per_sample'], '.5f')} | {fmt(r['cpu_ratio'], '.3f')} | "
            f"{1 / r['n'] + 0.1:.3f} | {gpu} |")
    return "\n".join(lines)


def plot(rows: List[Dict[str, Any]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for model in sorted({r["model"] for r in rows}):
        rs = [r for r in rows if r["model"] == model]
        ns = [r["n"] for r in rs]
        axes[0].plot(ns, [r["baseline"]["samples_per_s"] for r in rs], "o--", label=f"baseline {model}")
        axes[0].plot(ns, [r["shared"]["samples_per_s"] for r in rs], "o-", label=f"batchcast {model}")
        axes[1].plot(ns, [r["baseline"]["cpu_core_s_per_sample"] * 1e3 for r in rs], "o--",
                     label=f"baseline {model}")
        axes[1].plot(ns, [r["shared"]["cpu_core_s_per_sample"] * 1e3 for r in rs], "o-",
                     label=f"batchcast {model}")
    axes[0].set(xlabel="collocated trainers N", ylabel="aggregate samples/s", title="Throughput")
    axes[1].set(xlabel="collocated trainers N", ylabel="CPU core-ms per consumed sample",
                title="CPU per sample")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="batchcast bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench")
    p.add_argument("--data", default="data/bench")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--per-class", type=int, default=50)
    p.add_argument("--trainers", help="comma-separated N values (default 1,2,4,8; quick: 1,2)")
    p.add_argument("--models", help="models to train: torchvision names, small_cnn, or none = data "
                                    "only (default small_cnn,none)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per baseline trainer")
    p.add_argument("--warmup", type=int, default=10,
                   help="steps per trainer before the throughput clock starts (>= the ring, so the server's prefill does not count; CPU counts every step)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--decoder", default="cpu", choices=["cpu", "nvjpeg"],
                   help="the server's decoder (nvjpeg needs --device cuda)")
    p.add_argument("--interval", type=float, default=0.5, help="metrics sampling interval (s)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: proves the bench runs (CI)")
    args = p.parse_args(argv)
    if args.quick:
        args.trainers = args.trainers or "1,2"
        args.steps, args.warmup = 3, 1
        args.batch_size, args.image_size, args.workers = 8, 64, 1
        args.classes, args.per_class = 2, 12
        if args.data == "data/bench":
            args.data = os.path.join(args.out, "data")
    args.trainers = args.trainers or "1,2,4,8"
    args.models = args.models or "small_cnn,none"
    os.makedirs(args.out, exist_ok=True)
    ensure_dataset(args)
    meta = {"cpu": cpu_model(), "cores": os.cpu_count(), "gpu": gpu_name(),
            "batch_size": args.batch_size, "image_size": args.image_size, "steps": args.steps,
            "workers": args.workers, "device": args.device, "decoder": args.decoder}
    rows = []
    for model in args.models.split(","):
        for n in [int(x) for x in args.trainers.split(",")]:
            tag = f"{model}-N{n}"
            print(f"[bench] {tag}: baseline ...", flush=True)
            base = run_baseline(args, n, model, os.path.join(args.out, f"baseline-{tag}"))
            print(f"[bench] {tag}: batchcast ...", flush=True)
            shared = run_shared(args, n, model, os.path.join(args.out, f"shared-{tag}"))
            rows.append({"n": n, "model": model, "baseline": base, "shared": shared,
                         "throughput_ratio": ratio(shared["samples_per_s"], base["samples_per_s"]),
                         "cpu_ratio": ratio(shared["cpu_core_s_per_sample"], base["cpu_core_s_per_sample"])})
            r = rows[-1]
            saved = None if r["cpu_ratio"] is None else 100 * (1 - r["cpu_ratio"])
            print(f"[bench] {tag}: {n} trainer(s): {base['samples_per_s']:.0f} samples/s with their own "
                  f"DataLoaders, {shared['samples_per_s']:.0f} with batchcast "
                  f"(x{fmt(r['throughput_ratio'], '.2f')}); CPU per sample "
                  f"{fmt(base['cpu_core_s_per_sample'], '.4f')} -> {fmt(shared['cpu_core_s_per_sample'], '.4f')} "
                  f"core-s: {fmt(saved, '.0f')}% CPU saved", flush=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    table = markdown(rows, meta)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table + "\n")
    plot(rows, os.path.join(args.out, "results.png"))
    print(table)
    print(f"[bench] wrote {args.out}/results.json, results.md, results.png")


if __name__ == "__main__":
    main()
