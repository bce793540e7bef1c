"""The detached producer process of ``batchcast.DataLoader(share=KEY)``.

Started by the first process that uses KEY as ``python -m batchcast._share_producer SPEC
ENDPOINT CLAIM`` (ENDPOINT only shows in ps which share it serves; CLAIM is the inherited
descriptor of the claim's pipe): SPEC is a temp file holding a pickled header (key, file paths,
the trainer's sys.path, cwd and main script, the launch time) followed by the pickled pipeline
(``_share.SharedStream``): for a recognised torchvision pipeline only its native plan, otherwise
the dataset, sampler and loader arguments (``_share.pipeline_of``). It serves unbounded epochs
and exits once the last Loader has left (after at least one attached) for GRACE_S seconds, or,
started by a trial of ``batchcast sweep`` (``$BATCHCAST_SWEEP_PID``) while that sweep runs, for
SWEEP_LINGER_S (the sweep's next trial reads the same stream and decoded cache; the sweep stops
it at its end); before any Loader attached, once the claim is released (every process holding
the pipe's write end, the starting trainer, closed it or exited: a DataLoader made and dropped
without iterating) or after STARTUP_TIMEOUT_S; or on
SIGTERM/SIGINT/SIGHUP (each removes the pool, the socket and the share's files; after SIGKILL
the next producer of the key, or the stale-segment sweep of any batchcast server, removes
them). It decides to exit while holding the share's lock file, and keeps it until its endpoint
and files are gone, so a process attaching at that moment either is counted or starts a fresh
producer. Output goes to the share's log (``/tmp/batchcast-<uid>-<key>.log``), with the
start-up's steps timed from the launch; a producer that exits because no Loader reads it any more
removes its log (nothing went wrong; ``BATCHCAST_KEEP_SHARE_LOG=1`` in the trainer's
environment keeps it), one that failed or was stopped by a signal keeps it.

What serves (:func:`make_producer`): when the trainer's pipeline has a native plan
(``_torchvision_plan``: a recognised torchvision ImageFolder pipeline), the native server runs
in this process (``_batchcast.ServeRun``, the CPU decoder or nvJPEG into a GPU pool), with
its own shuffle and augmentation draws from the plan's seed; the process then never imports
torch nor reads the dataset object (its start-up is the interpreter, the folder scan and the
pool). Otherwise the pipeline runs in Python (``_share_stream.make_stream``), through a
:class:`batchcast.Producer`. Both regenerate for late joiners (an IterableDataset's wait for the
next epoch instead).

Signals: SIGINT/SIGTERM/SIGHUP get a handler that only records them (Python's C-level handler
writes the number to a wakeup pipe, on whichever thread the signal lands: CUDA's threads
included); the watcher thread reads the pipe.
Thread-safety: single process; the watcher thread only stops the producer and takes the lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import runpy
import select
import signal
import stat
import sys
import tempfile
import threading
import time
import types
from typing import Any, Dict, List, Optional, Tuple

from . import _batchcast
from ._proc import pid_running
from ._sweep_progress import GPU_CHUNK_ENV, SWEEP_PID_ENV
from .server import launch as launch_server

GRACE_S = 1.0  # no Loader for this long after the last one left: exit
# The same inside a running sweep: its next trial (a queue's, or one slow to start) still reads
# this stream and its cache; a bound, because a sweep whose trials differ in stream (a seed
# swept) would otherwise keep an idle producer, its pool and its cache per stream till its end.
SWEEP_LINGER_S = 60.0
STARTUP_TIMEOUT_S = 120.0  # nobody attached (the starting trainer died first): exit
_POLL_S = 0.1
# Set (to anything but "") in a trainer's environment: its producer keeps its log also after a
# clean exit (benchmarks read the summary it ends with).
KEEP_LOG_ENV = "BATCHCAST_KEEP_SHARE_LOG"
_STOPPING_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


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


def gpu_chunk(plan: Any, fewest: int) -> int:
    """Samples per chunk of the native plan's stream: its batch size, or on a GPU pool the
    smallest multiple of it holding at least `fewest` samples (a sweep under time-slicing:
    docs/sweep.md, Collocation). Trainers still read their own batch size from it."""
    if fewest <= plan.batch_size or not plan.device.startswith("cuda"):
        return plan.batch_size
    return -(-fewest // plan.batch_size) * plan.batch_size


def make_producer(pipeline: Dict[str, Any], endpoint: str, metrics_dir: str = "") -> Any:
    """What serves the share: the native server for a native plan (its collector writing to
    ``metrics_dir`` unless empty), else a Producer of ``_share_stream.make_stream``. Either has
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
        config.ring_memory = pipeline.get("memory", 0)  # DataLoader(share_memory=); 0: default
        config.cache = pipeline.get("cache", "off")  # DataLoader(share_cache=)
        # A sweep under time-slicing (this process inherits the trial's environment).
        config.batch_size = gpu_chunk(plan, int(os.environ.get(GPU_CHUNK_ENV) or 0))
        config.status_interval = 60
        config.metrics_dir = metrics_dir
        print(f"batchcast share producer: native pipeline ({plan.decoder} decoder, pool on "
              f"{plan.device}): {config!r}", flush=True)
        return _NativeProducer(config)
    from ._share_stream import make_stream  # torch: the Python pipeline only
    from .producer import Producer

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


def launch(spec: Dict[str, Any], payload: bytes) -> Tuple[int, int]:
    """Starts a producer for ``spec`` (the header: key, paths, sys_path, cwd, main_path) and
    ``payload`` (the pickled pipeline): (its pid, the write end of its claim, which the caller
    closes once a Loader of it attached or it gives up)."""
    spec = dict(spec, launched=time.time())
    fd, spec_path = tempfile.mkstemp(prefix="batchcast-share-", suffix=".pkl")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(spec, f, protocol=pickle.HIGHEST_PROTOCOL)
        f.write(payload)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    # Detached: the producer is reparented to init (nobody's zombie), runs in its own session (a
    # Ctrl-C on the first trainer's terminal does not reach it) and outlives the first trainer.
    # The endpoint on the command line says which share a process serves (ps, tests); the
    # claim's read end keeps its number there. The trainer waits for the socket itself, under
    # the share's lock (_share.SharedStream._wait_socket).
    endpoint = spec["paths"]["endpoint"]
    claim, keep = os.pipe()
    try:
        server = launch_server(
            _batchcast.ServeConfig(endpoint=endpoint),
            program=[sys.executable, "-m", "batchcast._share_producer", spec_path, endpoint,
                     str(claim)],
            log=spec["paths"]["log"], env=env, detach=True, pass_fds=(claim,),
            ready_timeout=None)
    except BaseException:
        os.close(keep)
        raise
    finally:
        os.close(claim)
    return server.pid, keep


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


def _released(claim: int) -> bool:
    """True once the claim's pipe reports end of file: no process holds its write end."""
    return not os.read(claim, 64)


def _exit_unattached(producer: Any, paths: Dict[str, str], held: Dict[str, int], why: str
                     ) -> bool:
    """Takes the lock and exits (True, keeping it) if still no Loader attached: one attaching
    holds the lock until welcomed, so it is counted first."""
    fd = _lock(paths["lock"])
    if producer.consumers_ever:
        os.close(fd)
        return False
    held["lock"] = fd
    held["clean"] = 1
    print(f"batchcast share producer: {why}, exiting", flush=True)
    return True


def _watch(
    producer: Any,
    paths: Dict[str, str],
    held: Dict[str, int],
    done: threading.Event,
    signals: int,
    claim: Optional[int],
) -> None:
    """Stops the producer on a signal (a byte on the ``signals`` pipe), once no Loader remains,
    or, before any attached, once the ``claim`` pipe is released; takes the lock to decide."""
    started = time.monotonic()
    sweep = int(os.environ.get(SWEEP_PID_ENV) or 0)  # lingers while that sweep runs
    empty_since = None
    released = False  # no claim handed down: only the start-up timeout
    watched: List[int] = [signals] if claim is None else [signals, claim]
    while True:
        if done.is_set():  # run() ended by itself (an error in the dataset)
            held["lock"] = _lock(paths["lock"])
            break
        ready = select.select(watched, [], [], _POLL_S)[0]
        if claim is not None and claim in ready and _released(claim):
            watched.remove(claim)
            os.close(claim)
            claim, released = None, True
        if signals in ready:
            signo = os.read(signals, 1)[0]
            if signo in _STOPPING_SIGNALS:  # not e.g. torch's SIGCHLD handler for its workers
                print(f"batchcast share producer: signal {signo}, stopping", flush=True)
                held["lock"] = _lock(paths["lock"])
                break
        # A Loader that closed while its user still holds batches stays attached (its slots
        # stay pinned) but reads no more: it does not keep the producer. The host pool's
        # segment may then be unlinked; the user's mapping of it stays valid (POSIX shm).
        ever, now = producer.consumers_ever, producer.consumers_reading
        if ever == 0:
            if released and _exit_unattached(
                    producer, paths, held, "the trainer that started it left before reading"):
                break
            if time.monotonic() - started > STARTUP_TIMEOUT_S and _exit_unattached(
                    producer, paths, held, "no Loader attached"):
                break
            continue
        if now > 0:
            empty_since = None
            continue
        empty_since = empty_since or time.monotonic()
        linger = SWEEP_LINGER_S if sweep and pid_running(sweep) else GRACE_S
        if time.monotonic() - empty_since < linger:
            continue
        fd = _lock(paths["lock"])
        if producer.consumers_reading == 0:  # attaching trainers hold the lock until welcomed
            held["lock"] = fd
            held["clean"] = 1
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


def _claim_of(arg: str) -> Optional[int]:
    """The claim's descriptor if it is the pipe the trainer handed down (else None: no claim)."""
    try:
        return int(arg) if stat.S_ISFIFO(os.fstat(int(arg)).st_mode) else None
    except (OSError, ValueError):
        return None


def main(argv: list) -> int:
    entered = time.time()
    claim = _claim_of(argv[3])  # before this process opens any descriptor of its own
    signals = _record_signals()
    header, pipeline = _read_spec(argv[1])
    paths = header["paths"]
    steps = {"interpreter": entered - header["launched"]}
    steps["spec"] = time.time() - entered
    # Metrics: the share's decoding runs here, outside the trainers' process trees. Under
    # BATCHCAST_METRICS_DIR (batchcast track, or set by hand) the native server's collector
    # records itself and its consumers (as --metrics-dir would); a Python pipeline records
    # this process and its DataLoader workers as role "server".
    metrics_dir = os.environ.get("BATCHCAST_METRICS_DIR", "")
    producer = make_producer(pipeline, paths["endpoint"], metrics_dir)
    steps["server"] = time.time() - entered - steps["spec"]
    tracker = None
    if metrics_dir and pipeline.get("native") is None:
        from ._tracking import track

        tracker = track(metrics_dir, role="server", since_start=True)
    held: Dict[str, int] = {}
    done = threading.Event()
    watcher = threading.Thread(
        target=_watch, args=(producer, paths, held, done, signals, claim),
        daemon=True,
    )
    watcher.start()
    timed = ", ".join(f"{step} {seconds:.3f} s" for step, seconds in steps.items())
    print(f"batchcast share producer {os.getpid()}: serving {header['key']!r} on "
          f"{paths['endpoint']} {time.time() - header['launched']:.3f} s after launch ({timed}"
          f"; torch {'imported' if 'torch' in sys.modules else 'not imported'})", flush=True)
    served = False
    try:
        producer.run(epochs=None)
        served = True
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
        if served and held.get("clean") and ours and not os.environ.get(KEEP_LOG_ENV):
            # Nothing to look into: logs of clean exits would only pile up in /tmp. A failed or
            # stopped producer keeps its log, and the trainers' errors name it.
            try:
                os.unlink(paths["log"])
            except FileNotFoundError:
                pass
        if "lock" in held:
            os.unlink(paths["lock"])  # waiters notice the inode changed and retry
            os.close(held["lock"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
