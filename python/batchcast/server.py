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

import copy
import os
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any, List, Optional, Sequence

from . import _batchcast
from ._exit_guard import ExitGuard
from ._views import view_text

__all__ = ["Server", "serve", "serve_args", "serve_config", "find_binary", "make_dataset"]


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


def make_dataset(out: str, classes: int = 10, per_class: int = 40) -> None:
    """``batchcast make-dataset`` into `out` unless it already holds files (the benchmarks'
    default data: an ImageNet-like JPEG folder cut from real photos)."""
    if not (os.path.isdir(out) and os.listdir(out)):
        subprocess.run([find_binary(), "make-dataset", "--out", out, "--classes", str(classes),
                        "--per-class", str(per_class)], check=True)


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


def serve_config(
    data: Optional[str] = None,
    endpoint: Optional[str] = None,
    batch_size: Optional[int] = None,
    *,
    epochs: Optional[int] = 1,
    config: Optional[_batchcast.ServeConfig] = None,
    **settings: Any,
) -> _batchcast.ServeConfig:
    """The :class:`_batchcast.ServeConfig` of these settings: ``config`` (default: every
    setting's default) with the others applied, each a field of ServeConfig or of its
    ``transform`` (:class:`_batchcast.PipelineOptions`) by name; a setting given as None keeps
    its default (``batch_size``: 64). ``epochs`` always applies (default 1; None: until
    stopped); ``endpoint`` defaults to ``config``'s, else the per-user one. Raises TypeError
    for a name that is no field.

    ``data`` is an image folder; ``synthetic=N`` serves N synthetic samples instead.
    ``device="cuda:K"`` puts the pool on GPU K (``"cuda:0,cuda:1"`` or ``"all"``: on each of
    those GPUs, every chunk decoded once and copied to the others; each consumer reads on its
    own GPU); ``decoder="nvjpeg"`` also decodes and augments there (on the first);
    ``decoder="mixed"`` has the ``workers`` decode on the CPU what they keep up with and nvJPEG
    the rest (for GPU-bound trainers sharing the GPU: docs/architecture.md). ``rank``/
    ``world_size`` shard the stream as a DistributedSampler would (left out: the RANK/
    WORLD_SIZE environment of the program, else 0/1); ``every_rank=True`` serves every rank's
    shard from this one server (a node-wide server for DDP jobs): rank r at
    ``rank_endpoint(endpoint, r)``, read with ``Loader(endpoint, rank=r)``.

    The transform: ``train=False`` is the eval transform (Resize(resize_size) + CenterCrop(
    image_size)); ``mean``/``std`` (3 values), ``scale``/``ratio`` (MIN, MAX of
    RandomResizedCrop), ``flip_p``, ``interpolation`` ("bilinear" or "nearest") and
    ``uint8_layout`` ("hwc" or "chw", for ``output="uint8"``) are torchvision's parameters of
    the same names. ``views=[...]`` serves further views of the stream from its first chunk
    (each a view text or dict as ``Loader(view=...)`` takes; docs/views.md): every sample is
    decoded once for all of them.
    """
    if config is None:
        if (data is None) == (settings.get("synthetic") is None):
            raise ValueError("give exactly one of data=DIR or synthetic=N")
        config = _batchcast.ServeConfig()
    else:
        config = copy.copy(config)
    settings.update(data=data, batch_size=batch_size, epochs=epochs or 0,
                    endpoint=endpoint or config.endpoint or _batchcast.default_endpoint())
    if settings.get("transform") is not None:
        config.transform = settings.pop("transform")
    if settings.get("views") is not None:  # texts or dicts (Loader(view=...)'s forms)
        settings["views"] = [view_text(v) for v in settings["views"]]
    transform = config.transform  # the config's own: fields set on it stay there
    for name, value in settings.items():
        if value is None:
            continue
        target = transform if hasattr(transform, name) else config
        if not hasattr(target, name):
            raise TypeError(f"serve() got an unexpected setting {name!r}: not a field of "
                            "ServeConfig or PipelineOptions (batchcast serve --help)")
        setattr(target, name, value)
    return config


def serve_args(*args: Any, extra_args: Sequence[str] = (), **settings: Any) -> List[str]:
    """The arguments of ``batchcast serve`` (after the word ``serve``) for :func:`serve_config`'s
    settings, then ``extra_args`` (any option, see ``batchcast serve --help``): what
    :func:`serve` runs. The flags are the program's own (``ServeConfig.command_line()``)."""
    return serve_config(*args, **settings).command_line() + [str(a) for a in extra_args]


def serve(
    data: Optional[str] = None,
    endpoint: Optional[str] = None,
    batch_size: Optional[int] = None,
    *,
    timeout: float = 30.0,
    binary: Optional[str] = None,
    **options: Any,
) -> Server:
    """Starts ``batchcast serve`` in another process and returns once its endpoint answers
    (within ``timeout`` seconds). The settings are :func:`serve_config`'s (a ``config=`` to
    start from, fields by name) and ``extra_args`` (:func:`serve_args`); ``binary`` is the
    program (default: :func:`find_binary`). The returned :class:`Server` is a context manager
    that stops the process on exit.
    """
    extra_args = options.pop("extra_args", ())
    config = serve_config(data, endpoint, batch_size, **options)
    args = config.command_line() + [str(a) for a in extra_args]
    fd, log_path = tempfile.mkstemp(prefix="batchcast-serve-", suffix=".log")
    os.close(fd)
    last = None
    if config.every_rank:
        last = _batchcast.rank_endpoint(config.endpoint, config.world_size - 1)
    server = Server([binary or find_binary(), "serve"] + args, config.endpoint, log_path, last,
                    owns_log=True)
    server.wait_ready(timeout)
    return server
