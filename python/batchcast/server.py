"""batchcast.serve: starts the native ``batchcast serve`` server from Python.

::

    with batchcast.serve(data="imagenet/train", endpoint="ipc:///tmp/bc.sock",
                         batch_size=64, epochs=10) as server:
        for images, labels in batchcast.Loader(server.endpoint):
            ...

serve() returns once the endpoint answers (or raises with the server's log tail if it died);
leaving the ``with`` block sends SIGTERM (clean shutdown: no leaked segment) and waits. While
the server runs, SIGTERM and SIGHUP to this process unwind the ``with`` block as SystemExit, and
a server still running at interpreter exit is stopped too (_exit_guard.py): the child never
outlives its parent's clean exit. (SIGKILL of the parent leaves the child running.)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any, List, Optional, Sequence

from . import _batchcast
from ._exit_guard import ExitGuard

__all__ = ["Server", "serve", "serve_args", "find_binary"]


def find_binary() -> str:
    """The native ``batchcast`` program: $BATCHCAST_BIN, else the one installed in this package
    (batchcast/_bin/batchcast). Never the ``batchcast`` on PATH: that is the console script,
    which execs this one."""
    env = os.environ.get("BATCHCAST_BIN")
    if env:
        if not os.access(env, os.X_OK):
            raise FileNotFoundError(f"BATCHCAST_BIN={env} is not an executable file")
        return env
    packaged = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "batchcast")
    if os.access(packaged, os.X_OK):
        return packaged
    raise FileNotFoundError(
        f"the native batchcast program is missing ({packaged}): install the package with "
        "pip install . (python/README.md), or set BATCHCAST_BIN to a built server/batchcast"
    )


def _ipc_path(endpoint: str) -> Optional[str]:
    return endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else None


def _file_id(path: str) -> Optional[tuple]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns)


class Server:
    """A running ``batchcast serve`` process (see :func:`serve`)."""

    def __init__(self, argv: Sequence[str], endpoint: str, log_path: str,
                 answer_at: Optional[str] = None, *, owns_log: bool = False) -> None:
        self.argv = list(argv)
        self.endpoint = endpoint
        self.log_path = log_path
        # serve() makes the log a temporary file of this server's own; a path the caller chose
        # (a file to keep, /dev/null) is never removed.
        self._owns_log = owns_log
        # Where readiness shows: the endpoint, or with every_rank the last rank's (started last).
        self._answer_at = answer_at or endpoint
        ipc = _ipc_path(self._answer_at)
        before = _file_id(ipc) if ipc else None  # a stale socket file is not an answer
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        self._before = before
        self._guard = ExitGuard(self.stop)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> Optional[int]:
        return self.process.poll()

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server's output."""
        try:
            with open(self.log_path, "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout: float) -> None:
        """Returns once the endpoint accepts connections; raises if the process died or the
        endpoint stayed silent for ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise _batchcast.BatchcastError(
                    f"batchcast serve exited with code {self.process.returncode} before "
                    f"answering on {self.endpoint}:\n{tail}"
                )
            if self._answers():
                return
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise _batchcast.TimeoutError(
                    f"batchcast serve did not answer on {self.endpoint} within {timeout} s:\n"
                    f"{tail}"
                )
            time.sleep(0.02)

    def _answers(self) -> bool:
        ipc = _ipc_path(self._answer_at)
        if ipc is not None:
            now = _file_id(ipc)
            return now is not None and now != self._before
        host, _, port = self._answer_at[len("tcp://") :].rpartition(":")
        host = "127.0.0.1" if host in ("*", "0.0.0.0", "") else host.strip("[]")
        try:
            with socket.create_connection((host, int(port)), timeout=0.2):
                return True
        except OSError:
            return False

    def wait(self, timeout: Optional[float] = None) -> int:
        """Waits for the server to exit by itself (after its last epoch); its exit code."""
        return self.process.wait(timeout)

    def stop(self, timeout: float = 10.0) -> Optional[int]:
        """SIGTERM (clean shutdown), then SIGKILL if it is not gone within ``timeout``. Removes
        the log where :func:`serve` made it: read :meth:`log_tail` before stopping."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._guard.release()
        if self._owns_log:
            try:
                os.unlink(self.log_path)
            except OSError:
                pass
        return self.process.returncode

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _numbers(values: Optional[Sequence[float]]) -> Optional[str]:
    """A list option's value as the command line takes it: A,B,C (repr keeps every digit)."""
    return None if values is None else ",".join(repr(float(v)) for v in values)


def serve_args(
    data: Optional[str] = None,
    endpoint: Optional[str] = None,
    batch_size: int = 64,
    *,
    epochs: Optional[int] = 1,
    synthetic: Optional[int] = None,
    sample_bytes: Optional[int] = None,
    image_size: Optional[int] = None,
    workers: Optional[int] = None,
    device: Optional[str] = None,
    decoder: Optional[str] = None,
    seed: Optional[int] = None,
    shuffle: Optional[bool] = None,
    min_consumers: Optional[int] = None,
    output: Optional[str] = None,
    train: Optional[bool] = None,
    mean: Optional[Sequence[float]] = None,
    std: Optional[Sequence[float]] = None,
    scale: Optional[Sequence[float]] = None,
    ratio: Optional[Sequence[float]] = None,
    flip_p: Optional[float] = None,
    resize_size: Optional[int] = None,
    interpolation: Optional[str] = None,
    uint8_layout: Optional[str] = None,
    ring: Optional[int] = None,
    stall_policy: Optional[str] = None,
    metrics_dir: Optional[str] = None,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    every_rank: bool = False,
    extra_args: Sequence[str] = (),
) -> List[str]:
    """The arguments of ``batchcast serve`` (after the word ``serve``) for these settings: what
    :func:`serve` runs, and what ``_batchcast.RunningServer`` takes in-process.

    ``data`` is an image folder; ``synthetic=N`` serves N synthetic samples instead. Options
    left None take the CLI's defaults; ``epochs=None`` serves until stopped. ``device="cuda:K"``
    puts the pool on GPU K (``"cuda:0,cuda:1"`` or ``"all"``: on each of those GPUs, every chunk
    decoded once and copied to the others; each consumer reads on its own GPU);
    ``decoder="nvjpeg"`` also decodes and augments there (on the first); ``decoder="mixed"``
    has the ``workers`` decode on the CPU what they keep up with and nvJPEG the rest (for
    GPU-bound trainers sharing the GPU: docs/architecture.md). Anything else
    goes in ``extra_args`` (see ``batchcast serve --help``). ``rank``/``world_size`` shard the
    stream as a DistributedSampler would (None: the RANK/WORLD_SIZE environment, else 0/1);
    ``every_rank=True`` serves every rank's shard from this one server (a node-wide server for
    DDP jobs): rank r at ``rank_endpoint(endpoint, r)``, read with ``Loader(endpoint, rank=r)``.

    The transform: ``train=False`` is the eval transform (Resize(resize_size) + CenterCrop(
    image_size)); ``mean``/``std`` (3 values), ``scale``/``ratio`` (MIN, MAX of
    RandomResizedCrop), ``flip_p``, ``interpolation`` ("bilinear" or "nearest") and
    ``uint8_layout`` ("hwc" or "chw", for ``output="uint8"``) are torchvision's parameters of
    the same names.
    """
    if (data is None) == (synthetic is None):
        raise ValueError("give exactly one of data=DIR or synthetic=N")
    endpoint = endpoint or _batchcast.default_endpoint()
    argv = ["--endpoint", endpoint, "--batch-size", str(batch_size)]
    argv += ["--epochs", str(epochs if epochs is not None else 0)]
    options = {
        "--data": data,
        "--synthetic": synthetic,
        "--sample-bytes": sample_bytes,
        "--image-size": image_size,
        "--workers": workers,
        "--device": device,
        "--decoder": decoder,
        "--seed": seed,
        "--min-consumers": min_consumers,
        "--output": output,
        "--mean": _numbers(mean),
        "--std": _numbers(std),
        "--scale": _numbers(scale),
        "--ratio": _numbers(ratio),
        "--flip-p": flip_p,
        "--resize-size": resize_size,
        "--interpolation": interpolation,
        "--uint8-layout": uint8_layout,
        "--ring": ring,
        "--stall-policy": stall_policy,
        "--metrics-dir": metrics_dir,
        "--rank": rank,
        "--world-size": world_size,
    }
    for flag, value in options.items():
        if value is not None:
            argv += [flag, str(value)]
    if train is False:
        argv.append("--eval")
    if shuffle is not None:
        argv.append("--shuffle" if shuffle else "--no-shuffle")
    if every_rank:
        argv.append("--every-rank")
    return argv + [str(a) for a in extra_args]


def serve(
    data: Optional[str] = None,
    endpoint: Optional[str] = None,
    batch_size: int = 64,
    *,
    timeout: float = 30.0,
    binary: Optional[str] = None,
    **options: Any,
) -> Server:
    """Starts ``batchcast serve`` and returns once its endpoint answers (within ``timeout``
    seconds). The settings are :func:`serve_args`'s; ``binary`` is the program (default:
    :func:`find_binary`). The returned :class:`Server` is a context manager that stops the
    process on exit.
    """
    endpoint = endpoint or _batchcast.default_endpoint()
    args = serve_args(data, endpoint, batch_size, **options)
    fd, log_path = tempfile.mkstemp(prefix="batchcast-serve-", suffix=".log")
    os.close(fd)
    last = None
    if options.get("every_rank"):
        last = _batchcast.rank_endpoint(endpoint, int(options.get("world_size") or 1) - 1)
    server = Server([binary or find_binary(), "serve"] + args, endpoint, log_path, last,
                    owns_log=True)
    server.wait_ready(timeout)
    return server
