"""The decoded cache on the CPU (docs/views.md, Decoded cache): the server's CPU per sample in
each epoch with `--cache decoded` beside `--cache off`, side by side in one run, and the memory
per cached image.

Each run is one `batchcast serve` of --data (RandomResizedCrop + flip + normalise to float32, the
CPU decoder, --workers threads, a ring of --ring chunks) read for --epochs epochs by one Loader
as fast as it goes; the server's CPU (utime + stime of /proc/PID/stat) is read as the reader
ends each epoch. The producer runs at most the ring ahead, so an epoch's figure includes the
next epoch's first chunks and misses the same share of its own: with --ring 8 and chunks of 64,
512 samples of an epoch. Runs alternate off and decoded, --repeats times; medians.

Figures: CPU ms per sample of each epoch; from the second epoch, the cached run's CPU per
sample over the first epoch's (the goal: <= 0.3); the first epoch's CPU with the cache over
without (<= 1.05); the cache's bytes per image (summary.json).

Run: .venv/bin/python bench/cache_bench.py --data data/dropin_big --epochs 3 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

import batchcast


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(args: argparse.Namespace, cache: str, out: str) -> Dict[str, Any]:
    endpoint = f"ipc:///tmp/cache-bench-{os.getpid()}-{cache}.sock"
    metrics = os.path.join(out, f"metrics-{cache}-{time.monotonic_ns()}")
    cmd = [sys.executable, "-m", "batchcast", "serve", "--data", args.data,
           "--endpoint", endpoint, "--epochs", str(args.epochs),
           "--batch-size", str(args.batch_size),
           "--image-size", str(args.image_size), "--workers", str(args.workers),
           "--ring", str(args.ring), "--cache", cache, "--metrics-dir", metrics,
           "--status-interval", "0"]
    with open(os.path.join(out, f"serve-{cache}.log"), "a") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=log)
        try:
            loader = batchcast.Loader(endpoint, batch_size=args.batch_size, timeout=120)
            epochs: List[Dict[str, float]] = []
            cpu0, t0 = cpu_seconds(server.pid), time.monotonic()
            for _ in range(args.epochs):
                samples = sum(len(y) for _, y in loader)
                cpu1, t1 = cpu_seconds(server.pid), time.monotonic()
                epochs.append({"samples": samples, "cpu_s": cpu1 - cpu0, "wall_s": t1 - t0,
                               "cpu_ms_per_sample": 1000 * (cpu1 - cpu0) / samples,
                               "samples_per_s": samples / (t1 - t0)})
                cpu0, t0 = cpu1, t1
            loader.close()
            if server.wait(60) != 0:
                raise SystemExit(f"batchcast serve failed: see {out}/serve-{cache}.log")
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
    with open(os.path.join(metrics, "summary.json")) as f:
        summary = json.load(f)
    return {"cache": cache, "epochs": epochs, "summary_cache": summary.get("cache")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/dropin_big")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ring", type=int, default=8)
    p.add_argument("--out", default="runs/cache_bench")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    runs = [one_run(args, cache, args.out)
            for _ in range(args.repeats) for cache in ("off", "decoded")]

    def median(cache: str, epoch: int, key: str) -> float:
        return statistics.median(r["epochs"][epoch][key] for r in runs if r["cache"] == cache)

    rows = []
    print("| epoch | off: CPU ms/sample | decoded: CPU ms/sample | decoded / off | off: samples/s "
          "| decoded: samples/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for e in range(args.epochs):
        off, on = median("off", e, "cpu_ms_per_sample"), median("decoded", e, "cpu_ms_per_sample")
        row = {"epoch": e + 1, "off_cpu_ms": off, "decoded_cpu_ms": on, "ratio": on / off,
               "off_rate": median("off", e, "samples_per_s"),
               "decoded_rate": median("decoded", e, "samples_per_s")}
        rows.append(row)
        print(f"| {e + 1} | {off:.2f} | {on:.2f} | {on / off:.2f} | {row['off_rate']:.0f} | "
              f"{row['decoded_rate']:.0f} |")
    first = rows[0]["decoded_cpu_ms"]
    later = [r["decoded_cpu_ms"] / first for r in rows[1:]]
    cached = [r["summary_cache"] for r in runs if r["cache"] == "decoded"][-1]
    per_image = cached["bytes"] / cached["images"] if cached and cached["images"] else None
    print(f"decoded cache: epochs 2.. cost {', '.join(f'{x:.2f}' for x in later)} of its first "
          f"epoch's CPU per sample; its first epoch {rows[0]['ratio']:.2f} of the uncached one's; "
          f"{per_image / 1024:.0f} KiB per cached image ({cached['images']} images)")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"args": vars(args), "python": sys.version.split()[0],
                   "cores": os.cpu_count(), "rows": rows, "runs": runs,
                   "bytes_per_image": per_image}, f, indent=1)


if __name__ == "__main__":
    main()
