"""One measured run of the collocated benchmark: N trainer processes of one peer, side by side on
one GPU (or CPU), timed over one shared window, with that window's GPU energy and CPU time.

With ``--gpus G`` the N trainers are spread over GPUs 0..G-1 (trainer i on GPU i mod G): the
batchcast peers serve them from one server whose pool is on every GPU (``--device cuda:0,...``:
decoded once, copied to each GPU), the ``-pergpu`` peers from one server per GPU, the others
each on its own GPU as usual; energy is the sum over the G GPUs.

The data side gets `cores` cores (all by default): with fewer than the machine's, the data side
(batchcast's server, DataLoader workers, the GPU decode peer's file readers) is pinned to the
first `cores` cores and the trainers to the others, so that "cores needed" means cores the
data side had to itself. Each DataLoader-style peer gets cores/N workers per trainer (a fair
share); the server gets `cores` workers for all N.

Trainer i trains its own (model, image size). The batchcast peers serve every size from one
server, decoded once: the server's size is the first trainer's and each other size is a view
(``--view size=S``, docs/views.md) that its trainers read with ``Loader(view="size=S")``; with
the nvJPEG and mixed decoders too (one GPU decode, one crop/resize per size). The ``-cached``
peers' servers keep the decoded images (``--cache decoded``, docs/views.md): their trainers warm
up through ``--cache-epochs`` epochs first, so the window measures the epochs after.

Thread-safety: one run at a time per process (it owns the child processes it starts).
Ownership: every process a run starts is ended before ``measure`` returns, failed or not; logs
stay in the run's log folder.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from ... import _batchcast
from ..._energy import GpuEnergy
from ...server import Server, launch
from . import probes

PEERS = ("synthetic", "dataloader", "gpu-decode", "batchcast-cpu", "batchcast-nvjpeg",
         "batchcast-mixed", "dali", "batchcast-cpu-pergpu", "batchcast-nvjpeg-pergpu",
         "batchcast-cpu-cached", "batchcast-nvjpeg-cached", "batchcast-mixed-cached",
         "batchcast-host-cached")
# Peers whose server keeps its pool in host memory even on a GPU: the trainers copy their batches
# to the GPU themselves (pin_memory), so the server has no CUDA context of its own.
HOST_POOL_PEERS = ("batchcast-host-cached",)
GPU_PEERS = ("gpu-decode", "batchcast-nvjpeg", "batchcast-mixed", "dali", "batchcast-cpu-pergpu",
             "batchcast-nvjpeg-pergpu", "batchcast-nvjpeg-cached", "batchcast-mixed-cached")
# The --decoder of each batchcast peer's server.
DECODERS = {"batchcast-nvjpeg": "nvjpeg", "batchcast-nvjpeg-pergpu": "nvjpeg",
            "batchcast-mixed": "mixed", "batchcast-nvjpeg-cached": "nvjpeg",
            "batchcast-mixed-cached": "mixed"}


class RunError(RuntimeError):
    """A run that produced no figures: a process failed, or the run outlived its time limit."""


def unavailable(peer: str, cfg: argparse.Namespace,
                trainers: List[Tuple[str, int]]) -> Optional[str]:
    """Why `peer` cannot run `trainers` here, or None."""
    if peer in GPU_PEERS and not cfg.device.startswith("cuda"):
        return "needs a GPU (--device cuda)"
    if peer.endswith("-pergpu") and cfg.gpus < 2:
        return "needs --gpus 2 or more (one server per GPU)"
    if peer == "dali" and (importlib.util.find_spec("nvidia") is None
                           or importlib.util.find_spec("nvidia.dali") is None):
        return "not installed (nvidia.dali is not importable)"
    return None


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _tail(path: str) -> str:
    return _read(path)[-2000:]


class _Watchdog(threading.Thread):
    """Kills the run's processes when it outlives `limit` seconds or its server dies early:
    the trainers then see end of file and the run fails with the logs, instead of hanging."""

    def __init__(self, procs: List[subprocess.Popen], servers: List[subprocess.Popen],
                 limit: float) -> None:
        super().__init__(daemon=True)
        self.procs, self.servers, self.deadline = procs, servers, time.time() + limit
        self.done, self.reason = threading.Event(), ""

    def run(self) -> None:
        while not self.done.wait(0.5):
            timed_out = time.time() > self.deadline
            if timed_out:
                self.reason = "the run outlived its time limit (--run-timeout)"
            elif any(s.poll() is not None for s in self.servers):
                self.reason = "a server exited early"
            else:
                continue
            if timed_out:
                # The trainers dump their threads' stacks into their logs (trainer.py).
                for p in self.procs:
                    if p not in self.servers and p.poll() is None:
                        p.send_signal(signal.SIGUSR1)
                time.sleep(1.0)
            for p in self.procs:
                p.kill()
            return


def _start_server(cfg: argparse.Namespace, peer: str, sizes: List[int], n: int, workers: int,
                  data_cpus: Optional[List[int]], endpoint: str, device: str,
                  log: str) -> Server:
    """A server of sizes[0] with a view for each other size (one decode for all sizes)."""
    config = _batchcast.ServeConfig(
        data=cfg.data, endpoint=endpoint, batch_size=cfg.chunk_size or cfg.batch_size,
        transform=_batchcast.PipelineOptions(image_size=sizes[0]), workers=workers, epochs=0,
        min_consumers=n,
        # A status line (rate, ring use, consumers) every 5 s: what a stalled run's log needs.
        status_interval=5,
        # On a GPU the pool lives in device memory: trainers get zero-copy CUDA tensors.
        device=device, decoder=DECODERS.get(peer, "cpu"),
        views=[f"size={size}" for size in sizes[1:]], order=cfg.order,
        cache="decoded" if peer.endswith("-cached") else "off", ring=cfg.ring)
    open(log, "w").close()  # this run's log alone
    # No readiness wait: the trainers wait for it (and the watchdog sees it exit early).
    return launch(config, log=log, cpus=data_cpus, ready_timeout=None)


def _warmup_steps(cfg: argparse.Namespace, peer: str) -> int:
    """Steps a trainer takes before the window: --warmup, and for a -cached peer first the
    --cache-epochs epochs that fill its server's cache, so the window measures the epochs after."""
    if not peer.endswith("-cached"):
        return cfg.warmup
    epoch_steps = -(-len(_batchcast.Dataset.image_folder(cfg.data)) // cfg.batch_size)
    return cfg.warmup + cfg.cache_epochs * epoch_steps


def _trainer_cmd(cfg: argparse.Namespace, peer: str, model: str, size: int, view: Optional[str],
                 workers: int, warmup: int, endpoint: str, device: str,
                 data_cpus: Optional[List[int]], trainer_cpus: Optional[List[int]]) -> List[str]:
    cmd = [sys.executable, "-m", "batchcast.tools.bench.trainer", "--peer", peer, "--data", cfg.data,
           "--batch-size", str(cfg.batch_size), "--image-size", str(size),
           "--workers", str(workers), "--model", model, "--classes", str(cfg.classes),
           "--device", device, "--warmup", str(warmup), "--endpoint", endpoint]
    if cfg.fp32:
        cmd.append("--fp32")
    if view is not None:
        cmd += ["--view", view]
    if data_cpus is not None:
        cmd += ["--data-cpus", ",".join(map(str, data_cpus))]
    if trainer_cpus is not None:
        cmd += ["--trainer-cpus", ",".join(map(str, trainer_cpus))]
    return cmd


def _cpu_split(before: Dict[int, float], after: Dict[int, float],
               trainers: List[int]) -> Dict[str, float]:
    delta = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
    own = sum(delta.get(pid, 0.0) for pid in trainers)
    return {"all": sum(delta.values()), "trainers": own, "data": sum(delta.values()) - own}


def measure(cfg: argparse.Namespace, energy: GpuEnergy, peer: str,
            trainers: List[Tuple[str, int]], cores: Optional[int], log_dir: str) -> Dict[str, Any]:
    """Figures of one run of `trainers` (trainer i trains model i at image size i; see the keys
    returned); raises RunError with the logs' tails."""
    n = len(trainers)
    # The server's own size is the first trainer's; a trainer of another size reads its view.
    sizes = list(dict.fromkeys(size for _, size in trainers))
    all_cpus = sorted(os.sched_getaffinity(0))
    k = min(cores or len(all_cpus), len(all_cpus))
    limited = k < len(all_cpus)
    data_cpus = all_cpus[:k] if limited else None
    trainer_cpus = all_cpus[k:] if limited else None
    workers = k if peer.startswith("batchcast") else max(1, k // n)  # unused by synthetic
    os.makedirs(log_dir, exist_ok=True)
    gpus = cfg.gpus if cfg.device.startswith("cuda") else 1
    devices = [f"cuda:{i % gpus}" if gpus > 1 else cfg.device for i in range(n)]
    # One server, or one per GPU (-pergpu); trainer i reads from server i mod len(servers).
    # One endpoint per run: a failed server's record (<socket>.failed) must not fail the next run.
    layout = [f"cuda:{g}" for g in range(gpus)] if peer.endswith("-pergpu") else [
        ",".join(f"cuda:{g}" for g in range(gpus))
        if cfg.device.startswith("cuda") and peer not in HOST_POOL_PEERS else "cpu"]
    endpoints = [f"ipc:///tmp/batchcast-bench-{os.getpid()}-{time.monotonic_ns()}-{s}.sock"
                 for s in range(len(layout))]
    servers: List[Server] = []
    logs = [os.path.join(log_dir, f"trainer{i}.log") for i in range(n)]
    server_logs = [os.path.join(log_dir, f"server{s}.log") for s in range(len(layout))]
    server_log = server_logs[0]
    if peer.startswith("batchcast"):
        for s, (device, endpoint, path) in enumerate(zip(layout, endpoints, server_logs)):
            readers = len(range(s, n, len(layout)))
            servers.append(_start_server(cfg, peer, sizes, readers, max(1, workers // len(
                layout)), data_cpus, endpoint, device, path))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = []
    warmup = _warmup_steps(cfg, peer)
    for i, ((model, size), path) in enumerate(zip(trainers, logs)):
        view = f"size={size}" if peer.startswith("batchcast") and size != sizes[0] else None
        cmd = _trainer_cmd(cfg, peer, model, size, view, workers, warmup,
                           endpoints[i % len(endpoints)], devices[i], data_cpus, trainer_cpus)
        with open(path, "w") as log:
            procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=log, text=True, env=env))
    server_procs = [server.process for server in servers if server.process is not None]
    dog = _Watchdog(procs + server_procs, server_procs, cfg.run_timeout)
    dog.start()
    try:
        for p, path in zip(procs, logs):
            line = "-"
            while line and line.strip() != "ready":
                line = p.stdout.readline()
            if not line:
                raise RunError(f"{peer}: a trainer ended before warming up. {dog.reason}\n"
                               f"{_tail(path)}{_tail(server_log)}")
        start = time.time() + cfg.settle
        end = start + cfg.seconds
        for p in procs:
            p.stdin.write(f"go {start} {end}\n")
            p.stdin.flush()
        time.sleep(max(0.0, start - time.time()))
        pids = probes.descendants(os.getpid())
        cpu0, joules0 = probes.cpu_seconds(pids), energy.read()
        time.sleep(max(0.0, end - time.time()))
        cpu1, joules1 = probes.cpu_seconds(probes.descendants(os.getpid())), energy.read()
        results = []
        for p, path in zip(procs, logs):
            out, _ = p.communicate()
            if p.returncode != 0 or not out.strip():
                raise RunError(f"{peer}: a trainer failed ({p.returncode}). {dog.reason}\n"
                               f"{_tail(path)}{_tail(server_log)}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        dog.done.set()
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for server in servers:
            server.stop(60)
        for endpoint in endpoints:
            for leftover in (endpoint[len("ipc://"):], endpoint[len("ipc://"):] + ".failed"):
                if os.path.exists(leftover):
                    os.unlink(leftover)
    window = end - start
    rates = [r["samples"] / (r["end"] - r["start"]) for r in results]
    rate = sum(rates)
    cpu = _cpu_split(cpu0, cpu1, [p.pid for p in procs])
    joules = None if joules0 is None or joules1 is None else joules1 - joules0
    return {
        "peer": peer, "n": n, "cores": k,
        "workers": None if peer == "synthetic" else workers, "samples_per_s": rate,
        "per_trainer": [{"model": model, "image_size": size, "samples_per_s": r}
                        for (model, size), r in zip(trainers, rates)],
        "wait_fraction": sum(r["wait_s"] for r in results)
        / sum(r["end"] - r["start"] for r in results),
        "cpu_cores": cpu["all"] / window, "data_cpu_cores": cpu["data"] / window,
        "gpu_watts": None if joules is None else joules / window,
        "joules_per_sample": None if joules is None or not rate else joules / (rate * window),
        "gpus": gpus, "pool_mib": sum(_pool_mib(path) for path in server_logs) if servers else 0,
    }


def _pool_mib(server_log: str) -> int:
    """GPU (or host) memory of one server's pool, from its start line (slots x MiB x devices),
    plus its views' (a view line each: slots x KiB, on each of the pool's devices)."""
    text = _read(server_log)
    m = re.search(r"\((\d+) slots x ([\d.]+) MiB in (.*)\)", text)
    if not m:
        return 0
    places = m.group(3).count("cuda:") or 1
    views_kib = sum(int(slots) * int(kib) for slots, kib in
                    re.findall(r"view \d+: (\d+) slots x (\d+) KiB in ", text))
    return round((int(m.group(1)) * float(m.group(2)) + views_kib / 1024) * places)
