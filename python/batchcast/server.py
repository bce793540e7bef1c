"""Servers in other processes: :func:`launch` starts every one that Python starts (a
``batchcast serve`` of a ``ServeConfig``, the share producer, the benchmarks' servers) and is
the one place a ``serve`` command line is built; :func:`serve` is launch() for settings by name.

::

    with batchcast.serve(data="imagenet/train", endpoint="ipc:///tmp/bc.sock",
                         batch_size=64, epochs=10) as server:
        for images, labels in batchcast.Loader(server.endpoint):
            ...

A sweep runner's trial, its log kept, on CPUs 0-7 and the second GPU::

    config = batchcast.server.serve_config("imagenet/train", "ipc:///tmp/trial3.sock", 64,
                                           epochs=None, workers=8, image_size=160)
    with batchcast.server.launch(config, log="trial3/server.log", cpus=range(8),
                                 env=dict(os.environ, CUDA_VISIBLE_DEVICES="1")) as server:
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
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any, Iterable, List, Mapping, Optional, Sequence

from . import _batchcast
from ._exit_guard import ExitGuard
from ._proc import pid_running
from ._views import view_text

__all__ = ["Server", "launch", "serve", "serve_args", "serve_config", "find_binary",
           "make_dataset"]


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


def _answer_endpoint(config: _batchcast.ServeConfig) -> str:
    """Where a server of `config` shows it is ready: its endpoint, or with every_rank the last
    rank's (started last)."""
    endpoint = config.endpoint or _batchcast.default_endpoint()
    if config.every_rank:
        return _batchcast.rank_endpoint(endpoint, config.world_size - 1)
    return endpoint


class Server:
    """A server process :func:`launch` started (made there only; see there): ``config`` (what
    it serves), ``endpoint`` (where it answers), ``argv``, ``pid``, ``log_path``; ``process``
    is its ``subprocess.Popen``, None for a detached server (no child of this process)."""

    def __init__(self, config: _batchcast.ServeConfig, argv: List[str], log_path: str,
                 process: Optional[subprocess.Popen], pid: int, before: Optional[tuple], *,
                 owns_log: bool) -> None:
        self.config = copy.copy(config)  # what it was started with, whatever the caller does next
        self.argv = argv
        self.endpoint = config.endpoint or _batchcast.default_endpoint()
        self.log_path = log_path
        self.process = process
        self._pid = pid
        # launch() makes the log a temporary file of this server's own; a path the caller chose
        # (a file to keep, /dev/null) is never removed.
        self._owns_log = owns_log
        self._answer_at = _answer_endpoint(config)
        self._before = before  # the ipc socket file's identity before the start: stale, no answer
        # A child dies with this process's clean exit; a detached server outlives it.
        self._guard = ExitGuard(self.stop) if process is not None else None

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> Optional[int]:
        """Its exit code once it exited (None meanwhile, and always for a detached server)."""
        return self.process.poll() if self.process is not None else None

    def running(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return pid_running(self._pid)

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
        endpoint stayed silent for ``timeout`` seconds (the process is stopped then)."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running():
                tail = self.log_tail()
                self.stop()
                code = "" if self.returncode is None else f" with code {self.returncode}"
                raise _batchcast.BatchcastError(
                    f"the server {self._what()} exited{code} before answering on "
                    f"{self.endpoint}:\n{tail}"
                )
            if self._answers():
                return
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise _batchcast.TimeoutError(
                    f"the server {self._what()} did not answer on {self.endpoint} within "
                    f"{timeout} s:\n{tail}"
                )
            time.sleep(0.02)

    def _what(self) -> str:
        return f"(pid {self._pid}: {' '.join(os.path.basename(a) for a in self.argv[:3])} ...)"

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

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Waits for the server to exit by itself (after its last epoch); its exit code (None
        for a detached server). subprocess.TimeoutExpired after ``timeout`` seconds."""
        if self.process is not None:
            return self.process.wait(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid_running(self._pid):
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.argv, timeout or 0.0)
            time.sleep(0.02)
        return None

    def stop(self, timeout: float = 10.0) -> Optional[int]:
        """SIGTERM (clean shutdown), then SIGKILL if it is not gone within ``timeout``. Removes
        the log where :func:`launch` made it: read :meth:`log_tail` before stopping."""
        if self.running():
            self._signal(signal.SIGTERM)
            try:
                self.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.wait()
        if self._guard is not None:
            self._guard.release()
        if self._owns_log:
            try:
                os.unlink(self.log_path)
            except OSError:
                pass
        return self.returncode

    def _signal(self, signum: int) -> None:
        if self.process is not None:
            self.process.send_signal(signum)
            return
        try:
            os.kill(self._pid, signum)
        except ProcessLookupError:
            pass  # gone meanwhile

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _serve_arguments(config: _batchcast.ServeConfig, extra_args: Sequence[Any]) -> List[str]:
    """The arguments after ``serve``: the program's own flags for ``config`` (its
    ``command_line()``), then ``extra_args``. The one place Python spells a serve command."""
    return config.command_line() + [str(a) for a in extra_args]


def launch(
    config: _batchcast.ServeConfig,
    *,
    log: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    cpus: Optional[Iterable[int]] = None,
    ready_timeout: Optional[float] = 30.0,
    detach: bool = False,
    program: Optional[Sequence[str]] = None,
    pass_fds: Sequence[int] = (),
    binary: Optional[str] = None,
    extra_args: Sequence[Any] = (),
) -> Server:
    """Starts a server of ``config`` in another process: every batchcast server Python starts
    (:func:`serve`, the share producer, the benchmarks) starts here, and this is the only
    place that builds a ``batchcast serve`` command line.

    Args:
        config: what it serves and where it answers (``config.endpoint``; '': the per-user
            default; with ``every_rank`` readiness is the last rank's endpoint).
        log: file its stdout and stderr are appended to, kept; None: a temporary file that
            :meth:`Server.stop` removes.
        env: its whole environment; None: this process's.
        cpus: the CPU numbers it and every thread it starts may run on (as ``taskset -c``);
            None: this process's affinity.
        ready_timeout: return once the endpoint answers; BatchcastError with the log's tail if
            the process exits first, batchcast.TimeoutError after this many seconds (either way
            it is stopped). None: return at once.
        detach: run it in a session of its own, reparented to init (a double fork through sh):
            it outlives this process, no zombie of it is left, nothing here stops it on exit,
            and ``Server.process`` is None. Otherwise a child that :meth:`Server.stop`, the
            ``with`` block, SIGTERM/SIGHUP to this process and its exit stop (ExitGuard).
        program: None: ``batchcast serve`` (``binary``, default :func:`find_binary`) with the
            program's flags for ``config`` and ``extra_args``. Else the whole command of another
            program serving ``config.endpoint`` (the share producer's Python process).
        pass_fds: descriptors it inherits (as subprocess's ``pass_fds``).
    """
    if program is None:
        argv = [binary or find_binary(), "serve"] + _serve_arguments(config, extra_args)
    elif binary is not None or extra_args:
        raise TypeError("launch(): binary= and extra_args= are the serve program's; program= "
                        "is a whole command")
    else:
        argv = [str(a) for a in program]
    owns_log = log is None
    if log is None:
        fd, log = tempfile.mkstemp(prefix="batchcast-serve-", suffix=".log")
        os.close(fd)
    ipc = _ipc_path(_answer_endpoint(config))
    before = _file_id(ipc) if ipc else None  # a stale socket file is not an answer
    allowed = None if cpus is None else sorted(set(cpus))
    pin = None if allowed is None else (lambda: os.sched_setaffinity(0, allowed))
    process: Optional[subprocess.Popen] = None
    if detach:
        command = " ".join(shlex.quote(a) for a in argv)
        started = subprocess.run(
            ["/bin/sh", "-c", f"{command} </dev/null >>{shlex.quote(log)} 2>&1 & echo $!"],
            stdout=subprocess.PIPE, start_new_session=True, env=env, check=True,
            pass_fds=tuple(pass_fds), preexec_fn=pin)
        pid = int(started.stdout.decode().strip())
    else:
        with open(log, "ab") as out:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, env=env,
                                       pass_fds=tuple(pass_fds), preexec_fn=pin)
        pid = process.pid
    server = Server(config, argv, log, process, pid, before, owns_log=owns_log)
    if ready_timeout is not None:
        server.wait_ready(ready_timeout)
    return server


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
    return _serve_arguments(serve_config(*args, **settings), extra_args)


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
    that stops the process on exit. :func:`launch` with its defaults, for settings by name.
    """
    extra_args = options.pop("extra_args", ())
    config = serve_config(data, endpoint, batch_size, **options)
    return launch(config, ready_timeout=timeout, binary=binary, extra_args=extra_args)
