"""The detached producer process of ``batchcast.DataLoader(share=KEY)``.

Started by the first process that uses KEY as ``python -m batchcast._share_producer SPEC
ENDPOINT`` (ENDPOINT only shows in ps which share it serves):
SPEC is a temp file holding a pickled header (key, file paths, the trainer's sys.path, cwd and
main script) followed by the pickled pipeline (``_share.pipeline_of``). It serves unbounded
epochs of what :func:`make_stream` builds through a :class:`batchcast.Producer` and exits once
the last Loader has left (after at least one attached) for GRACE_S seconds, or when no Loader
attached within STARTUP_TIMEOUT_S, or on SIGTERM/SIGINT/SIGHUP (each removes the pool, the
socket and the share's files; after SIGKILL the next producer of the key, or the stale-segment
sweep of any batchcast server, removes them). It decides to exit while holding the
share's lock file, and keeps it until its endpoint and files are gone, so a process attaching
at that moment either is counted or starts a fresh producer. Output goes to the share's log.

What serves (:func:`make_producer`): when the trainer's pipeline has a native plan
(``_torchvision_plan``: a recognised torchvision ImageFolder pipeline), the native server runs
in this process (``_batchcast.ServeRun``, the CPU decoder or nvJPEG into a GPU pool), with
its own shuffle and augmentation draws from the plan's seed. Otherwise the pipeline runs in
Python: epoch e of the stream is the pipeline's sampler after ``sampler.set_epoch(e)`` (a
DistributedSampler), or a RandomSampler drawn from ``seed + e``: any epoch's order can be
rebuilt, so a map-style dataset also gives ``regenerate(epoch, index)``, which decodes chunk
``index`` of epoch ``epoch`` again (in this process, not in the workers) for Loaders that
join late or resume. An IterableDataset cannot: its late joiners wait for the next epoch.
Both regenerate for late joiners.

Signals: SIGINT/SIGTERM/SIGHUP get a handler that only records them (Python's C-level handler
writes the number to a wakeup pipe, on whichever thread the signal lands: CUDA's threads
included); the watcher thread reads the pipe.
Thread-safety: single process; the watcher thread only stops the producer and takes the lock.
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
import pickle
import runpy
import select
import signal
import sys
import threading
import time
import types
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import torch
import torch.utils.data

from . import _batchcast
from .producer import Producer

GRACE_S = 1.0  # no Loader for this long after the last one left: exit
STARTUP_TIMEOUT_S = 120.0  # nobody attached (the starting trainer died first): exit
_POLL_S = 0.1
_STOPPING_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def order_epoch(sampler: Any, epoch: int, seed: Optional[int]) -> None:
    """Makes ``sampler`` yield the order of stream epoch ``epoch``."""
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    elif isinstance(sampler, torch.utils.data.RandomSampler) and seed is not None:
        sampler.generator = torch.Generator().manual_seed((seed + epoch) % (1 << 63))


class _EpochLoader(torch.utils.data.DataLoader):
    """A torch DataLoader whose pass e yields stream epoch e (order_epoch before each pass)."""

    def __init__(self, *args: Any, seed: Optional[int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seed = seed
        self.next_epoch = 0

    def __iter__(self) -> Any:
        order_epoch(self.sampler, self.next_epoch, self.seed)
        self.next_epoch += 1
        return super().__iter__()


def make_stream(pipeline: Dict[str, Any]) -> Tuple[Iterable[Any], Optional[Callable]]:
    """What produces a share's stream: (a re-iterable, one pass per epoch; ``regenerate(epoch,
    index) -> batch``, or None where the order cannot be rebuilt). The one place where another
    way of producing the same batches (the native pipeline) plugs in."""
    dataset, sampler, seed = pipeline["dataset"], pipeline["sampler"], pipeline["seed"]
    batch_size, drop_last = pipeline["batch_size"], pipeline["drop_last"]
    collate = pipeline["collate_fn"] or torch.utils.data.default_collate
    stream = _EpochLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=drop_last,
        collate_fn=collate,
        seed=seed,
        **pipeline["decoding"],
    )
    if sampler is None:  # an IterableDataset
        return stream, None
    ordering = copy.copy(sampler)  # regenerate's own: the stream's sampler is in use
    orders: Dict[int, list] = {}

    def regenerate(epoch: int, index: int) -> Any:
        order = orders.get(epoch)
        if order is None:
            order_epoch(ordering, epoch, seed)
            orders.clear()  # one epoch at a time: late joiners and resumes cluster
            order = orders[epoch] = list(ordering)
        chunk = order[index * batch_size : (index + 1) * batch_size]
        if not chunk or (drop_last and len(chunk) < batch_size):
            raise IndexError(f"epoch {epoch} has no chunk {index} ({len(order)} samples)")
        return collate([dataset[i] for i in chunk])

    return stream, regenerate


class _NativeProducer:
    """The native server of a recognised pipeline, with the surface the watcher uses."""

    def __init__(self, config: _batchcast.ServeConfig) -> None:
        self._server = _batchcast.ServeRun(config)

    def run(self, epochs: Optional[int] = None) -> None:
        self._server.wait()

    def stop(self) -> None:
        self._server.stop()

    def close(self) -> None:
        self._server.close()

    @property
    def consumers_ever(self) -> int:
        return self._server.consumers_ever

    @property
    def consumers_reading(self) -> int:
        # A GPU pool lives only as long as this process (CUDA IPC): a Loader that closed while
        # its user still holds batches keeps it, where a host pool's mapping would outlive it.
        if self._server.on_gpu:
            return self._server.consumers_now
        return self._server.consumers_reading


def make_producer(pipeline: Dict[str, Any], endpoint: str, metrics_dir: str = "") -> Any:
    """What serves the share: the native server for a native plan (its collector writing to
    ``metrics_dir`` unless empty), else a Producer of :func:`make_stream`. Either has
    run(epochs), stop(), close(), consumers_ever and consumers_reading."""
    plan = pipeline.get("native")
    if plan is not None:
        # serve_config() names the shard (rank, world size) explicitly: RANK/WORLD_SIZE in this
        # process's environment (a torchrun trainer's) must not shard what the plan does not.
        config = plan.serve_config()
        config.endpoint = endpoint
        config.epochs = 0  # until stopped
        config.min_consumers = 1
        config.workers = max(1, pipeline["decoding"]["num_workers"])
        config.status_interval = 60
        config.metrics_dir = metrics_dir
        print(f"batchcast share producer: native pipeline ({plan.decoder} decoder, pool on "
              f"{plan.device}): batchcast serve {' '.join(config.command_line())}", flush=True)
        return _NativeProducer(config)
    stream, regenerate = make_stream(pipeline)
    return Producer(stream, endpoint=endpoint, min_consumers=1, regenerate=regenerate)


def _load_main(path: str) -> None:
    """Makes the trainer's main script importable as __main__ (for classes pickled from it),
    the way multiprocessing's spawn does: its `if __name__ == "__main__":` block does not run."""
    module = types.ModuleType("__mp_main__")
    module.__dict__.update(runpy.run_path(path, run_name="__mp_main__"))
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module


def _read_spec(path: str) -> tuple:
    with open(path, "rb") as f:
        header = pickle.load(f)
        os.chdir(header["cwd"])
        sys.path[:0] = [p for p in header["sys_path"] if p not in sys.path]
        start = f.tell()
        try:
            payload = pickle.load(f)
        except (AttributeError, ImportError):
            if not header["main_path"]:
                raise
            _load_main(header["main_path"])  # the dataset's class lives in the trainer script
            f.seek(start)
            payload = pickle.load(f)
    os.unlink(path)
    return header, payload


def _lock(path: str) -> int:
    """Takes the share's lock (the same inode trainers lock; see _share.SharedStream._attach)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _watch(
    producer: Any,
    paths: Dict[str, str],
    held: Dict[str, int],
    done: threading.Event,
    signals: int,
) -> None:
    """Stops the producer on a signal (a byte on the ``signals`` pipe) or once no Loader
    remains; takes the lock to decide."""
    started = time.monotonic()
    empty_since = None
    while True:
        if done.is_set():  # run() ended by itself (an error in the dataset)
            held["lock"] = _lock(paths["lock"])
            break
        if select.select([signals], [], [], _POLL_S)[0]:
            signo = os.read(signals, 1)[0]
            if signo not in _STOPPING_SIGNALS:  # e.g. torch's SIGCHLD handler for its workers
                continue
            print(f"batchcast share producer: signal {signo}, stopping", flush=True)
            held["lock"] = _lock(paths["lock"])
            break
        # A Loader that closed while its user still holds batches stays attached (its slots
        # stay pinned) but reads no more: it does not keep the producer. The host pool's
        # segment may then be unlinked; the user's mapping of it stays valid (POSIX shm).
        ever, now = producer.consumers_ever, producer.consumers_reading
        if ever == 0:
            if time.monotonic() - started > STARTUP_TIMEOUT_S:
                held["lock"] = _lock(paths["lock"])
                print("batchcast share producer: no Loader attached, exiting", flush=True)
                break
            continue
        if now > 0:
            empty_since = None
            continue
        empty_since = empty_since or time.monotonic()
        if time.monotonic() - empty_since < GRACE_S:
            continue
        fd = _lock(paths["lock"])
        if producer.consumers_reading == 0:  # attaching trainers hold the lock until welcomed
            held["lock"] = fd
            print("batchcast share producer: last Loader left, exiting", flush=True)
            break
        os.close(fd)
        empty_since = None
    producer.stop()


def _record_signals() -> int:
    """Makes the stopping signals write their number to a pipe, and nothing else (the main
    thread spends its time in native calls, where Python-level handlers would not run); the
    pipe's read end."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    for signo in _STOPPING_SIGNALS:
        signal.signal(signo, lambda *_: None)
    return read_end


def main(argv: list) -> int:
    signals = _record_signals()
    header, pipeline = _read_spec(argv[1])
    paths = header["paths"]
    # Metrics: the share's decoding runs here, outside the trainers' process trees. Under
    # BATCHCAST_METRICS_DIR (batchcast track, or set by hand) the native server's collector
    # records itself and its consumers (as --metrics-dir would); a Python pipeline records
    # this process and its DataLoader workers as role "server".
    metrics_dir = os.environ.get("BATCHCAST_METRICS_DIR", "")
    producer = make_producer(pipeline, paths["endpoint"], metrics_dir)
    tracker = None
    if metrics_dir and pipeline.get("native") is None:
        from .tools import metrics

        tracker = metrics.track(metrics_dir, role="server")
    held: Dict[str, int] = {}
    done = threading.Event()
    watcher = threading.Thread(
        target=_watch, args=(producer, paths, held, done, signals), daemon=True
    )
    watcher.start()
    print(f"batchcast share producer {os.getpid()}: serving {header['key']!r} on "
          f"{paths['endpoint']}", flush=True)
    try:
        producer.run(epochs=None)
    finally:
        done.set()
        watcher.join()  # holds the lock from here on
        producer.close()  # unlinks the pool and the socket
        if tracker is not None:
            tracker.stop()
        try:
            with open(paths["state"]) as f:
                ours = json.load(f).get("pid") == os.getpid()
        except (OSError, ValueError):
            ours = False
        if ours:
            os.unlink(paths["state"])
        if "lock" in held:
            os.unlink(paths["lock"])  # waiters notice the inode changed and retry
            os.close(held["lock"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
