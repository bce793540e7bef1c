"""``batchcast sweep`` and :func:`sweep`: one command runs a sweep's trials collocated on a node's
GPUs, every ``DataLoader(share=KEY)`` of its trials reading one stream per (key, pipeline).

    batchcast sweep [--gpus 0,1] [--per-gpu K | --slots N] [--collocation auto|mps|time-slicing]
                    [--out DIR] [--trials FILE] [--resume] [--order relaxed|exact]
                    [--cache decoded|off]
                    [--share-dataloaders] [--track]
                    [--optuna STUDY --storage URL --n-trials N] -- COMMAND ARGS...

Every argument written ``{a,b,c}`` expands into a grid (the cartesian product, in order;
``_sweep_trials``), or ``--trials FILE`` gives one trial's arguments per line. Trials run
``--per-gpu`` at a time on each GPU of ``--gpus`` (default: every GPU this process sees, 2 per
GPU; ``auto``: packed by the first trial's measured GPU memory, ``_sweep_packing``), or
``--slots`` at a time without GPUs (default 2); the others queue (``_sweep_devices``,
``_sweep_runner``). Each trial gets ``BATCHCAST_SHARE_SCOPE`` (the sweep's id): its share keys
are scoped to the sweep (``_share_scope.scoped_key``); with ``--share-dataloaders`` an unchanged
script's shuffled torch DataLoader over a recognised torchvision pipeline joins the sweep's
stream too (``_sweep_swap``, through ``_sweep_site/sitecustomize.py`` on its PYTHONPATH);
without it such a loader stays torch's and is counted (the trial's samples and wait). Those
loaders read in relaxed order unless they say otherwise (``--order exact``: the stream's seeded
order; ``BATCHCAST_SHARE_ORDER``): each trial at its own pace from one decode. Their streams keep
each image decoded after its first decode (``--cache off``: decode every epoch;
``BATCHCAST_SHARE_CACHE``), within half of the free memory: docs/views.md, "Decoded cache".
Output: ``OUT/trials/<id>.log``, ``OUT/summary.json``, ``OUT/sweep.png`` (``_sweep_plot``), a
live table; ``--track`` runs each trial under ``batchcast track`` (an MLflow run each).
``--optuna`` asks an Optuna study for each trial's values instead of a grid (``_sweep_optuna``).
docs/sweep.md is the user's guide.

Bad input (a grid with no trial, ``--per-gpu 0``, a GPU that does not exist, a command not
found, an unwritable ``--out``, ``--resume`` of a folder that is not a sweep's) raises
:class:`SweepInputError` (the command line: a message and exit 2) before anything starts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from ._resume_state import ORDERS
from ._share_producer import KEEP_LOG_ENV
from ._sizes import size_bytes
from ._sweep_devices import Collocation, make_slots, visible_gpus
from ._sweep_optuna import OptunaTrials
from ._sweep_packing import MemoryPacking
from ._sweep_plot import plot
from ._sweep_progress import (CACHE_ENV, GPU_CHUNK_ENV, ORDER_ENV, SHARE_DATALOADERS_ENV,
                              SHARE_MEMORY_ENV)
from ._sweep_runner import Runner
from ._sweep_table import LiveTable
from ._sweep_trials import SweepInputError, Trial, expand_grid, read_trials_file

__all__ = ["SweepInputError", "main", "sweep"]

_FORMAT = "batchcast-sweep/1"  # summary.json's "format": what --resume recognises
# Under time-slicing a trainer reads at most about 21-25 chunks a second from a GPU pool (an
# H200 beside three other trainers, chunks of 128 or 256 samples): the trials' GPU streams are
# served in chunks of at least this many samples (docs/sweep.md, Collocation).
TIME_SLICING_CHUNK = 512


def _check_command(trials: Sequence[Trial]) -> None:
    for program in dict.fromkeys(t.command[0] for t in trials):
        found = shutil.which(program) if os.sep not in program else (
            program if os.access(program, os.X_OK) and os.path.isfile(program) else None)
        if found is None:
            raise SweepInputError(f"command not found: {program!r} (not an executable file, "
                                  "nor on PATH); check the command after --")


def _check_out(out: str) -> None:
    try:
        os.makedirs(os.path.join(out, "trials"), exist_ok=True)
        probe = os.path.join(out, f".write-test-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as e:
        raise SweepInputError(f"--out {out}: cannot write there ({e.strerror}); choose a "
                              "folder you can write") from e


def _resumed(out: str, command: Sequence[str]) -> Dict[str, Any]:
    path = os.path.join(out, "summary.json")
    try:
        with open(path) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        summary = None
    if not isinstance(summary, dict) or summary.get("format") != _FORMAT:
        raise SweepInputError(f"--resume {out}: not a sweep's folder (no {path} written by "
                              "batchcast sweep); give the --out of the sweep to resume")
    if command and [t["command"] for t in summary["trials"]] != [
            t.command for t in expand_grid(command)]:
        raise SweepInputError(f"--resume {out}: that sweep ran other commands; resume it "
                              "without a command (or with the same one)")
    return summary


def _record(trial: Trial, out: str) -> Dict[str, Any]:
    return {"id": trial.id, "command": trial.command, "params": trial.params, "state": "queued",
            "gpu": None, "exit_code": None, "start": None, "end": None, "samples": None,
            "samples_per_s": None, "log": os.path.join(out, "trials", f"{trial.id}.log")}


def _tracked(out: str, experiment: str) -> Callable[[Dict[str, Any]], List[str]]:
    """What runs a trial under ``batchcast track`` (a subprocess: the core never imports the
    tools): its MLflow run in OUT/track/mlruns, named after the trial, its params as params."""

    def argv(record: Dict[str, Any]) -> List[str]:
        params = [a for k, v in record["params"].items() for a in ("--param", f"{k}={v}")]
        return [sys.executable, "-m", "batchcast", "track", "--out",
                os.path.join(out, "track"), "--experiment", experiment, "--workload", "trials",
                "--run-name", f"{record['id']}-{time.strftime('%Y%m%d-%H%M%S')}", *params,
                "--", *record["command"]]

    return argv


def sweep(
    command: Sequence[str] = (),
    *,
    trials: Optional[str] = None,
    gpus: Optional[Sequence[int]] = None,
    per_gpu: Optional[Any] = None,
    slots: Optional[int] = None,
    collocation: str = "auto",
    order: str = "relaxed",
    cache: str = "decoded",
    out: Optional[str] = None,
    resume: bool = False,
    share_dataloaders: bool = False,
    track: bool = False,
    optuna: Optional[str] = None,
    storage: Optional[str] = None,
    n_trials: Optional[int] = None,
    direction: str = "minimize",
    share_memory: Union[None, int, str] = None,
    table: Optional[LiveTable] = None,
    env: Optional[Dict[str, str]] = None,
) -> Dict[str, Any]:
    """Runs the sweep the options describe (see the module doc and docs/sweep.md); returns its
    summary (what ``OUT/summary.json`` holds, with ``sweep.stopped_by``: the signal that
    stopped it, or None). SweepInputError for bad input, before anything starts."""
    try:
        memory = size_bytes(share_memory, "--share-memory")
    except ValueError as e:
        raise SweepInputError(str(e)) from None
    if order not in ORDERS:
        raise SweepInputError(f"--order {order}: choose relaxed (each trial at its own pace "
                              "from one decode) or exact (the stream's seeded order)")
    if cache not in ("decoded", "off"):
        raise SweepInputError(f"--cache {cache}: choose decoded (each image decoded once for "
                              "the sweep) or off (decoded every epoch)")
    if collocation not in ("auto", "mps", "time-slicing"):
        raise SweepInputError(f"--collocation {collocation}: choose auto, mps or time-slicing")
    if resume and out is None:
        raise SweepInputError("--resume needs --out DIR: the folder of the sweep to resume")
    out = os.path.abspath(out or os.path.join("runs", time.strftime("sweep-%Y%m%d-%H%M%S")))
    source = None
    if optuna is not None:
        if resume or trials:
            raise SweepInputError("--optuna asks the study for each trial: the study is the "
                                  "sweep's record (no --resume: run the same command again, it "
                                  "asks until the study holds N), and no --trials")
        if storage is None or n_trials is None:
            raise SweepInputError("--optuna STUDY needs --storage URL (sqlite:///FILE on one "
                                  "node) and --n-trials N")
        if direction not in ("minimize", "maximize"):
            raise SweepInputError(f"--direction {direction}: minimize or maximize")
        _check_command([Trial("", list(command))])
        source = OptunaTrials(optuna, storage, n_trials, direction, command, out)
        summary = {"format": _FORMAT, "sweep": {"id": f"sweep-{uuid.uuid4().hex[:12]}",
                                                "optuna": {"study": optuna, "storage": storage,
                                                           "n_trials": n_trials}}}
        records: List[Dict[str, Any]] = []
    elif resume:
        summary = _resumed(out, command)
        records = summary["trials"]
        for r in records:
            if r.get("exit_code") != 0:
                r["state"] = "queued"
        _check_command([Trial(r["id"], r["command"]) for r in records if r["state"] == "queued"])
    else:
        planned = read_trials_file(trials, command) if trials else expand_grid(command)
        _check_command(planned)
        summary = {"format": _FORMAT, "sweep": {"id": f"sweep-{uuid.uuid4().hex[:12]}"}}
        records = [_record(t, out) for t in planned]
    slot_gpus = make_slots(gpus, None if per_gpu is None else str(per_gpu), slots,
                           visible_gpus(env))
    _check_out(out)
    table = table or LiveTable()
    env = dict(os.environ if env is None else env)
    if memory:
        env[SHARE_MEMORY_ENV] = str(memory)
    env[ORDER_ENV] = order
    env[CACHE_ENV] = cache
    env[KEEP_LOG_ENV] = "1"  # the producers keep their logs: OUT/data/, their last lines read
    # Every trial's torch DataLoaders are hooked: shared with --share-dataloaders, else counted.
    site = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sweep_site")
    env["PYTHONPATH"] = os.pathsep.join([site, *filter(None, [env.get("PYTHONPATH")])])
    if share_dataloaders:
        env[SHARE_DATALOADERS_ENV] = "1"
    used = list({g.device: g for g in slot_gpus if g is not None}.values())
    colloc = Collocation(collocation, out, used)
    if used and colloc.mode == "time-slicing":
        # The share producers serve GPU pools in bigger chunks (TIME_SLICING_CHUNK).
        env[GPU_CHUNK_ENV] = str(TIME_SLICING_CHUNK)
    try:
        planned = (f"trials asked of Optuna study {optuna} until it holds {n_trials}"
                   if source is not None else f"{len(records)} trials "
                   f"({sum(r['state'] == 'queued' for r in records)} to run)")
        table.say(f"batchcast sweep: {planned} in {len(slot_gpus)} slots; output in {out}")
        table.say(f"batchcast sweep: {colloc.line()}")
        summary["sweep"].update(out=out, order=order, cache=cache,
                                share_dataloaders=share_dataloaders,
                                mlflow=os.path.join(out, "track", "mlruns") if track else None,
                                collocation=colloc.mode,
                                collocation_why=colloc.why or None, slots=len(slot_gpus),
                                started=time.time(), ended=None, stopped_by=None)
        runner = Runner(records, slot_gpus, colloc, out, summary["sweep"]["id"], summary,
                        table, env, _tracked(out, summary["sweep"]["id"]) if track else None,
                        source, MemoryPacking(used) if str(per_gpu) == "auto" and used else None)
        stopped = runner.run()
        summary["sweep"].update(ended=time.time(), stopped_by=stopped)
        drawn, why = plot(summary, os.path.join(out, "sweep.png"))
        summary["sweep"]["plot"] = drawn
        if drawn is None:
            table.say(f"batchcast sweep: no plot: {why}")
        runner.write_summary()
    finally:
        colloc.stop()
    return summary


def _gpu_list(text: str) -> List[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: GPU indices, comma-separated (0,1)"
                                         ) from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command: List[str] = []
    if "--" in args:
        i = args.index("--")
        args, command = args[:i], args[i + 1:]
    p = argparse.ArgumentParser(
        prog="batchcast sweep", usage="batchcast sweep [options] -- COMMAND ARGS...",
        description="Runs a sweep's trials collocated on this node's GPUs; every "
        "batchcast.DataLoader(share=KEY) of its trials reads one stream per (key, pipeline). "
        "Each argument written {a,b,c} expands into a grid (quote it: the shell expands "
        "unquoted braces).", epilog="docs/sweep.md says more.")
    p.add_argument("--trials", metavar="FILE", help="one trial's arguments per line")
    p.add_argument("--gpus", type=_gpu_list, help="GPU indices to use (default: every one "
                   "this process sees; nvidia-smi -L order, MIG instances count as GPUs)")
    p.add_argument("--per-gpu", metavar="K", help="trials at once on each GPU (default 2); "
                   "auto: as many as the first trial's measured GPU memory allows")
    p.add_argument("--slots", type=int, metavar="N",
                   help="trials at once without GPUs (default 2)")
    p.add_argument("--collocation", default="auto", choices=("auto", "mps", "time-slicing"),
                   help="auto: a private MPS daemon where it can start, else time-slicing")
    p.add_argument("--order", default="relaxed", choices=("relaxed", "exact"),
                   help="the order the trials' shared loaders read in when they do not say: "
                        "relaxed (each at its own pace from one decode) or exact (the stream's "
                        "seeded order; docs/stream.md, Order)")
    p.add_argument("--cache", default="decoded", choices=("decoded", "off"),
                   help="decoded: the trials' streams keep each image decoded after its first "
                        "decode, within half of the free memory; off: decode every epoch "
                        "(docs/views.md, Decoded cache)")
    p.add_argument("--out", help="output folder (default runs/sweep-<time>)")
    p.add_argument("--resume", action="store_true",
                   help="run the trials of --out's sweep that did not finish")
    p.add_argument("--track", action="store_true",
                   help="run each trial under `batchcast track`: an MLflow run each, in "
                   "OUT/track/mlruns")
    p.add_argument("--optuna", metavar="STUDY", help="ask this Optuna study for each trial's "
                   "values ({lr:1e-4..1e-1:log}, {bs:32,64} in the command)")
    p.add_argument("--storage", metavar="URL", help="the study's storage (sqlite:///FILE, or an "
                   "RDB URL shared by every node)")
    p.add_argument("--n-trials", type=int, metavar="N", help="trials in the study, all nodes")
    p.add_argument("--direction", default="minimize", choices=("minimize", "maximize"),
                   help="of the objective (batchcast-objective: VALUE)")
    p.add_argument("--share-memory", metavar="SIZE",
                   help="shared memory of each stream's ring, views included (e.g. 2GiB; "
                   "default: 1 GiB within the host's means, at most an epoch): docs/memory.md")
    p.add_argument("--share-dataloaders", action="store_true",
                   help="a trial's shuffled torch DataLoader over a recognised torchvision "
                   "pipeline joins the sweep's stream (no code change)")
    o = p.parse_args(args)
    if not command and not o.trials and not o.resume:
        p.error("no command: batchcast sweep [options] -- COMMAND ARGS...")
    try:
        summary = sweep(command, trials=o.trials, gpus=o.gpus, per_gpu=o.per_gpu,
                        slots=o.slots, collocation=o.collocation, order=o.order, cache=o.cache,
                        out=o.out,
                        resume=o.resume, share_dataloaders=o.share_dataloaders,
                        track=o.track, optuna=o.optuna, storage=o.storage,
                        n_trials=o.n_trials, direction=o.direction,
                        share_memory=o.share_memory)
    except SweepInputError as e:
        print(f"batchcast sweep: {e}", file=sys.stderr)
        return 2
    failed = [t for t in summary["trials"] if t.get("exit_code") != 0]
    stopped = summary["sweep"]["stopped_by"]
    print(f"batchcast sweep: {len(summary['trials']) - len(failed)} of "
          f"{len(summary['trials'])} trials finished"
          + (f", stopped by signal {stopped}" if stopped else "")
          + f"; {os.path.join(summary['sweep']['out'], 'summary.json')}", flush=True)
    if stopped:
        return 128 + stopped
    return 1 if failed else 0
