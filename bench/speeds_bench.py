"""Trainers of different speeds on one ``DataLoader(share=KEY)``: the fast trainer's rate beside
a slower one, as a share of its rate alone, and the decoding that regenerating chunks for the
slow one costs.

Every trainer builds the same pipeline: ImageFolder + RandomResizedCrop(S) + RandomHorizontalFlip
+ ToTensor + Normalize (the native path), batch --batch-size, one share key per run:

- ``alone``: the fast trainer (no work per batch) reads whole epochs for --seconds;
- ``k x slower``: the same fast trainer beside a slow one that reads a batch every k times the
  fast one's time per batch alone (paced: it sleeps until its next batch is due; a bigger
  model, as a sweep pairs them); the slow one reads until the fast one is done.
- ``pause P s``: beside a second trainer as fast as it, which stops for P s every
  --pause-every seconds (validation, a checkpoint, a debugger) and then reads on.
- ``late S s``: beside a second trainer as fast as it that starts S s later (a queue-style
  sweep): the share of the late one's samples that came from the stream rather than from
  chunks regenerated for it alone.
Each scenario runs in every order of --order (``exact``, ``relaxed``: docs/stream.md, Order). The stall policy and bound are the defaults (``decouple`` after
  3 s) unless --slow-stall-timeout gives the slow one its own bound (``DataLoader(share=,
  stall_timeout=)``; a huge one is the old behaviour: everyone waits for the slowest).

Figures per pair, each beside an alone run made just before it (a shared machine's load
drifts): the fast trainer's samples/s over its whole run and over its second half (after the
one-time cost of the bound), each as a share of the alone run's; the slow one's
samples/s; the chunks the producer decoded for the stream and regenerated for the slow one
(its "done:" log line), the samples it decoded in all per sample the fast one read, and the share
producer's CPU core-seconds (its metrics).

Run: ``.venv/bin/python bench/speeds_bench.py --data data/dropin --slower 2,4,13 --pauses 2,10
--late 5 --order exact,relaxed``;
with ``SPDLOG_LEVEL=debug`` the rows of ``--models`` also carry the share producer's last lines
on who held the stream (``share_log_stalls``; the whole log is kept as OUT/RUN/share.log).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from dropin_bench import dataset, run_trainers  # bench/ is the script's folder: on sys.path


def trainer(args: argparse.Namespace) -> None:
    """One trainer; prints {samples, wall_s, half_samples, half_s} as a JSON line."""
    import torch

    import batchcast

    torch.set_num_threads(1)
    time.sleep(args.delay)  # a trial that starts later than the others
    images = dataset(args)
    cuda = bool(args.model)
    if args.synthetic:  # the same random batch already on the GPU: the pair's GPU-bound rates
        x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device="cuda")
        y = torch.randint(0, len(images.classes), (args.batch_size,), device="cuda")
        loader = SyntheticBatches(x, y, len(images) // args.batch_size)
    else:
        loader = batchcast.DataLoader(images, batch_size=args.batch_size, shuffle=True,
                                      drop_last=True, num_workers=args.workers,
                                      pin_memory=cuda and not args.no_pin,
                                      share=args.key or None,
                                      **({"stall_timeout": args.stall_timeout,
                                          "share_order": args.order} if args.key else {}))
    step = train_step(args.model, len(images.classes)) if cuda else None
    marks: List[tuple] = []  # (time, samples) after each batch
    samples, batches, start, last_pause = 0, 0, None, None
    done = False
    while not done:
        for images, labels in loader:
            if step:
                step(images, labels)
            if start is None:  # from the first batch: the producer's start-up is not the rate
                start = time.monotonic()
            samples += images.shape[0]
            batches += 1
            marks.append((time.monotonic(), samples))
            if args.period:  # its pace, whatever the data's: the next batch is due then
                time.sleep(max(0.0, start + batches * args.period - time.monotonic()))
            if args.pause and time.monotonic() - (last_pause or start) >= args.pause_every:
                time.sleep(args.pause)
                last_pause = time.monotonic()
            if args.stop_file and os.path.exists(args.stop_file):
                done = True
                break
        if not args.stop_file and time.monotonic() - (start or time.monotonic()) >= args.seconds:
            done = True
    end = time.monotonic()
    if args.done_file:
        open(args.done_file, "w").close()
    loader.close()
    # A trainer that paused through the second half (the fast one done meanwhile) read none of it.
    half = next((m for m in marks if m[0] >= start + (end - start) / 2), (end, samples))
    print(json.dumps({"samples": samples, "wall_s": end - start,
                      "half_samples": samples - half[1], "half_s": end - half[0]}), flush=True)


class SyntheticBatches(list):
    """An epoch of one batch repeated, with a DataLoader's close()."""

    def __init__(self, x: Any, y: Any, batches: int) -> None:
        super().__init__([(x, y)] * batches)

    def close(self) -> None:
        pass


def train_step(model_name: str, classes: int) -> Any:
    """One training step of a torchvision model on the GPU, as people train today: bf16
    autocast, channels_last, SGD; it waits for the step, so the rate is the training's."""
    import torch
    import torchvision

    model = getattr(torchvision.models, model_name)(num_classes=classes).cuda()
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(images: Any, labels: Any) -> None:
        x = images.cuda(non_blocking=True).to(memory_format=torch.channels_last)
        y = labels.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()

    return step


def trainer_cmd(args: argparse.Namespace, key: str, period: float, stop: Optional[str],
                done: Optional[str], stall_timeout: Optional[float] = None,
                pause: float = 0.0, model: str = "", image_size: int = 0,
                synthetic: bool = False, delay: float = 0.0) -> List[str]:
    cmd = [sys.executable, os.path.abspath(__file__), "--role", "trainer", "--data", args.data,
           "--batch-size", str(args.batch_size),
           "--image-size", str(image_size or args.image_size),
           "--workers", str(args.workers), "--seconds", str(args.seconds), "--key", key,
           "--period", str(period), "--pause", str(pause), "--pause-every", str(args.pause_every),
           "--order", args.order, "--delay", str(delay)]
    if model:
        cmd += ["--model", model]
    if synthetic:
        cmd += ["--synthetic"]
    if stop:
        cmd += ["--stop-file", stop]
    if stall_timeout:
        cmd += ["--stall-timeout", str(stall_timeout)]
    if done:
        cmd += ["--done-file", done]
    return cmd


def share_log(key: str) -> str:
    """The share producer's log, once it has exited (and removed its state file)."""
    from batchcast.dataloader import share_paths

    paths = share_paths(key)
    deadline = time.monotonic() + 120
    while os.path.exists(paths["state"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    with open(paths["log"]) as f:
        text = f.read()
    os.unlink(paths["log"])
    return text


def decoded(log: str) -> Optional[int]:
    """Samples the share producer decoded in all (its "done:" line)."""
    m = re.search(r"(\d+) samples decoded in all", log)
    return int(m.group(1)) if m else None


def run(args: argparse.Namespace, name: str, slow_period: Optional[float],
        pause: float = 0.0, late: float = 0.0) -> Dict[str, Any]:
    from batchcast.tools import metrics

    out = os.path.abspath(os.path.join(args.out, name))
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    key = f"speeds-bench-{os.getpid()}-{name}"
    done = os.path.join(out, "fast.done")
    env = dict(os.environ, BATCHCAST_METRICS_DIR=out, BATCHCAST_KEEP_SHARE_LOG="1")
    cmds = [trainer_cmd(args, key, 0.0, None, done)]
    if slow_period is not None:
        cmds.append(trainer_cmd(args, key, slow_period, done, None, args.slow_stall_timeout,
                                pause, delay=late))
    results = run_trainers(cmds, env)
    text = share_log(key)
    if "native pipeline" not in text:
        raise RuntimeError(f"the share did not run natively; its log:\n{text}")
    chunks = re.search(r"done: (\d+) chunks.*?(\d+) chunks regenerated.*?(\d+) decoupling", text)
    server_cpu = 0.0
    for part in metrics.find_parts(out):
        if os.path.samefile(part, out):
            with open(os.path.join(part, "summary.json")) as f:
                server_cpu = json.load(f)["cpu_core_s"]["server"]
    fast = results[0]
    all_decoded = decoded(text)
    regenerated = re.search(r"(\d+) chunks regenerated", text)
    row = {"run": name, "order": args.order, "slow_period_s": slow_period,
           "decoded_per_fast_sample": all_decoded / fast["samples"] if all_decoded else None,
           "fast_samples_s": fast["samples"] / fast["wall_s"],
           "fast_half_samples_s": fast["half_samples"] / fast["half_s"],
           "fast_wall_s": fast["wall_s"], "server_cpu_core_s": server_cpu,
           "chunks_published": int(chunks.group(1)) if chunks else None,
           "chunks_regenerated": int(chunks.group(2)) if chunks else None,
           "decouplings": int(chunks.group(3)) if chunks else None}
    if slow_period is not None:
        row["slow_samples_s"] = results[1]["samples"] / results[1]["wall_s"]
        # What the second one read from chunks made for it alone (catching up): the rest came
        # from the stream (or, relaxed, from chunks every reader that needed them took).
        private = int(regenerated.group(1)) * args.batch_size if regenerated else 0
        row["second_from_stream"] = max(0.0, 1 - private / max(results[1]["samples"], 1))
    return row


def parse_models(text: str, image_size: int) -> List[Tuple[str, int]]:
    """--models MODEL[:SIZE],...: each trainer's model and image size (default --image-size)."""
    out = []
    for item in text.split(","):
        model, _, size = item.partition(":")
        out.append((model, int(size) if size else image_size))
    return out


def run_models(args: argparse.Namespace, name: str, models: List[Tuple[str, int]],
               mode: str, pause: float = 0.0) -> List[Dict[str, Any]]:
    """Trainers of `models` (model, image size) side by side (the first runs --seconds, the
    others until it is done): on one key (mode "key"; trainers of other image sizes join it as
    views, docs/views.md), each on its own DataLoader with cores/N workers ("own"), or each on
    random batches already on the GPU ("synthetic": what the GPU they share allows each). With
    `pause`, the second trainer stops that long every --pause-every s (a validation pass).
    Samples/s per trainer."""
    out = os.path.abspath(os.path.join(args.out, name))
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    done = os.path.join(out, "first.done")
    shared = mode == "key"
    key = f"speeds-bench-{os.getpid()}-{name}" if shared else ""
    own = args.workers if shared else max(1, (os.cpu_count() or 2) // len(models))
    cmds = []
    for i, (model, size) in enumerate(models):
        a = argparse.Namespace(**{**vars(args), "workers": own})
        cmds.append(trainer_cmd(a, key, 0.0, done if i else None, None if i else done,
                                pause=pause if i == 1 else 0.0, model=model, image_size=size,
                                synthetic=mode == "synthetic"))
        if args.no_pin:
            cmds[-1].append("--no-pin")
    results = run_trainers(cmds, dict(os.environ, BATCHCAST_KEEP_SHARE_LOG="1"))
    log = share_log(key) if key else ""
    with open(os.path.join(out, "share.log"), "w") as f:  # the producer's whole log, kept
        f.write(log)
    chunks = re.search(r"done: (\d+) chunks.*?(\d+) chunks regenerated.*?(\d+) decoupling", log)
    caught_up = log.count("caught up: it reads the shared stream again")
    waited = re.search(r"found the ring full for ([0-9.]+) s", log)
    return [{"run": name, "model": f"{m}:{size}", "samples_s": r["samples"] / r["wall_s"],
             "producer_waited_s": float(waited.group(1)) if waited else None,
             "half_samples_s": r["half_samples"] / r["half_s"],
             "chunks_published": int(chunks.group(1)) if chunks else None,
             "chunks_regenerated": int(chunks.group(2)) if chunks else None,
             "decouplings": int(chunks.group(3)) if chunks else None,
             "catch_ups": caught_up,
             "share_log_warnings": [ln for ln in log.splitlines() if "WARN" in ln.upper()][:5],
             # with SPDLOG_LEVEL=debug: the producer's last view of who holds what (docs/stream.md)
             "share_log_stalls": [ln for ln in log.splitlines() if "stalls:" in ln][-5:]}
            for (m, size), r in zip(models, results)]


def main_models(args: argparse.Namespace) -> None:
    models = parse_models(args.models, args.image_size)
    orders = args.order.split(",")
    runs = [(f"{m}:{s} alone", [(m, s)], "key", 0.0, orders[0]) for m, s in models]
    runs += [(f"{len(models)} synthetic", models, "synthetic", 0.0, orders[0])]
    for order in orders:
        runs += [(f"one key, {order}", models, "key", 0.0, order)]
        runs += [(f"one key, {order}, the second pausing {p:g} s", models, "key", p, order)
                 for p in (float(x) for x in args.pauses.split(",") if x) if len(models) > 1]
    runs += [(f"{len(models)} DataLoaders", models, "own", 0.0, orders[0])]
    rows: List[Dict[str, Any]] = []
    for name, group, mode, pause, order in runs:
        args.order = order
        rows += run_models(args, name, group, mode, pause)
        print(json.dumps(rows[-len(group):]), file=sys.stderr, flush=True)
    alone = {r["model"]: r["samples_s"] for r in rows if r["run"].endswith("alone")}
    # What the shared GPU allows each trainer beside the others: its rate on synthetic batches.
    ceiling = {r["model"]: r["samples_s"] for r in rows if r["run"].endswith("synthetic")}
    print(f"batch {args.batch_size}, image sizes as listed, {os.cpu_count()} cores, "
          f"{args.seconds:g} s; share producer workers {args.workers}\n")
    print("| run | model | samples/s | share of alone | share of synthetic beside the others | "
          "2nd half samples/s | decouplings | catch-ups | chunks regenerated / published | "
          "ring full s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['model']} | {r['samples_s']:.0f} | "
              f"{r['samples_s'] / alone[r['model']]:.2f} | "
              f"{r['samples_s'] / ceiling[r['model']]:.2f} | {r['half_samples_s']:.0f} | "
              f"{r['decouplings']} | {r['catch_ups']} | "
              f"{r['chunks_regenerated']} / {r['chunks_published']} | "
              f"{r['producer_waited_s']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="ImageFolder (made with make-dataset if empty)")
    p.add_argument("--slower", default="2,4,13", help="comma-separated slow-down factors")
    p.add_argument("--pauses", default="", help="comma-separated pauses of a second trainer, s")
    p.add_argument("--pause-every", type=float, default=5.0, help="seconds between its pauses")
    p.add_argument("--late", default="", help="comma-separated delays of a second trainer, s")
    p.add_argument("--order", default="exact",
                   help="comma-separated orders to run every scenario in (exact, relaxed)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="the share producer's workers")
    p.add_argument("--seconds", type=float, default=30, help="the fast trainer's run")
    p.add_argument("--slow-stall-timeout", type=float,
                   help="the slow trainer's own stall bound (default: the producer's)")
    p.add_argument("--out", default="runs/speeds")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--role", choices=["main", "trainer"], default="main")
    p.add_argument("--key", help=argparse.SUPPRESS)
    p.add_argument("--period", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--pause", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--model", default="", help=argparse.SUPPRESS)
    p.add_argument("--models", help="MODEL[:SIZE],...: torchvision models trained on the GPU "
                   "instead of sleeping, each at its image size (default --image-size; other "
                   "sizes join the key as views): each alone, all on random batches already on the GPU "
                   "(what the GPU they share allows each), all on one key, all on their own "
                   "DataLoaders (the first runs --seconds, the others until it is done)")
    p.add_argument("--no-pin", action="store_true",
                   help="with --models: pin_memory=False, so the share decodes on the CPU into a "
                        "host pool (the trainer copies each batch to the GPU) instead of with "
                        "the mixed decoder into a GPU pool")
    p.add_argument("--synthetic", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--stop-file", help=argparse.SUPPRESS)
    p.add_argument("--done-file", help=argparse.SUPPRESS)
    p.add_argument("--stall-timeout", type=float, help=argparse.SUPPRESS)
    p.add_argument("--delay", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "trainer":
        return trainer(args)

    from batchcast.server import make_dataset

    make_dataset(args.data)
    if args.models:
        return main_models(args)
    # Each pair right after its own alone run: a shared machine's load drifts between runs.
    rows: List[Dict[str, Any]] = []
    per_batch = None
    pairs = [("slower", float(x)) for x in args.slower.split(",") if x]
    pairs += [("pause", float(x)) for x in args.pauses.split(",") if x]
    pairs += [("late", float(x)) for x in args.late.split(",") if x]
    orders = args.order.split(",")
    for kind, k in pairs:
        args.order = orders[0]
        rows.append(run(args, "alone", None))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        alone = rows[-1]
        if per_batch is None:  # one slow-down for every pair: from the first alone run
            per_batch = args.batch_size / rows[-1]["fast_samples_s"]
        for order in orders:  # side by side, after the same alone run
            args.order = order
            if kind == "slower":
                rows.append(run(args, f"{k:g}x", k * per_batch))
            elif kind == "pause":
                rows.append(run(args, f"pause {k:g} s", 0.0, pause=k))
            else:
                rows.append(run(args, f"late {k:g} s", 0.0, late=k))
            rows[-1]["alone"] = alone
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"batch {args.batch_size}, image {args.image_size}, {args.workers} producer workers, "
          f"{os.cpu_count()} cores, fast trainer {args.seconds:g} s; load average "
          f"{os.getloadavg()[0]:.1f}\n")
    print("| run | order | fast samples/s (alone) | share of alone | 2nd half share | "
          "second samples/s | second's samples from the stream | decoded per fast sample | "
          "chunks published | regenerated | decouplings | server CPU core-s (alone) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "alone" not in r:
            continue
        a = r["alone"]
        per = r["decoded_per_fast_sample"]
        print(f"| {r['run']} | {r['order']} | {r['fast_samples_s']:.0f} "
              f"({a['fast_samples_s']:.0f}) | {r['fast_samples_s'] / a['fast_samples_s']:.2f} | "
              f"{r['fast_half_samples_s'] / a['fast_half_samples_s']:.2f} | "
              f"{r.get('slow_samples_s', 0):.0f} | {r.get('second_from_stream', 0):.2f} | "
              f"{f'{per:.2f}' if per else '-'} | {r['chunks_published']} | "
              f"{r['chunks_regenerated']} | {r['decouplings']} | "
              f"{r['server_cpu_core_s']:.1f} ({a['server_cpu_core_s']:.1f}) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
