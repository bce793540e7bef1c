"""batchcast.DataLoader: torch's DataLoader, optionally shared between processes.

Without ``share`` it *is* ``torch.utils.data.DataLoader`` (an instance of it is returned).
With ``share=KEY`` every process that uses the same key (same user, same machine) reads one
stream, decoded once::

    loader = batchcast.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=4,
                                  share="cifar-train")
    for epoch in range(epochs):
        for images, labels in loader:
            ...

Share protocol (see python/README.md):

- endpoint ``ipc:///tmp/batchcast-<uid>-<key>.sock``; an fcntl lock file next to it
  serialises starting, attaching and exiting;
- the first process pickles the dataset and the loader arguments into a temp file and starts a
  detached producer (``python -m batchcast._share_producer``, its own session, output in a log
  file under /tmp) that runs a torch DataLoader over the dataset for unbounded epochs;
- every process attaches as a Loader with ``late_join="next_epoch"``, so every epoch it
  iterates is whole; it attaches at its first iteration (an idle attached Loader would hold
  the others back), while holding the lock;
- the producer exits after the last Loader left (it takes the lock to decide, so it never
  leaves under a process that is attaching) and removes its files.

Batches are zero-copy views of shared memory: clone before modifying in place (see Loader).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterator, Optional

import torch.utils.data

from . import _batchcast
from ._share_producer import _lock
from .loader import Closeable, Loader

__all__ = ["DataLoader", "SharedDataLoader", "share_paths"]

_ATTACH_TIMEOUT = 120.0  # the producer's first batch may need a worker pool to start


def share_paths(key: str) -> dict:
    """Files of a share key: endpoint, socket, lock, state (producer pid) and log."""
    clean = re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:48]
    if clean != key:  # keep distinct keys distinct after sanitising
        clean += "-" + hashlib.sha1(key.encode()).hexdigest()[:8]
    base = f"/tmp/batchcast-{os.getuid()}-{clean}"
    return {
        "endpoint": f"ipc://{base}.sock",
        "socket": f"{base}.sock",
        "lock": f"{base}.lock",
        "state": f"{base}.json",
        "log": f"{base}.log",
    }


def _producer_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return b"batchcast._share_producer" in cmdline and state != b"Z"


class DataLoader(torch.utils.data.DataLoader):
    """torch.utils.data.DataLoader with one more argument, ``share``.

    ``share=None``: returns a plain ``torch.utils.data.DataLoader``. ``share=KEY``: returns a
    :class:`SharedDataLoader` that reads the stream of the detached producer for KEY.
    """

    def __new__(  # type: ignore[misc]
        cls,
        dataset: Any,
        batch_size: Optional[int] = 1,
        shuffle: Optional[bool] = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Optional[Callable] = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Callable] = None,
        *args: Any,
        share: Optional[str] = None,
        **kwargs: Any,
    ) -> Any:
        torch_args = dict(
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
        )
        if share is None:
            return torch.utils.data.DataLoader(dataset, *args, **torch_args, **kwargs)
        if args:
            raise TypeError("pass the arguments after worker_init_fn by keyword with share=")
        return SharedDataLoader(dataset, share, torch_args, kwargs)


class SharedDataLoader(Closeable):
    """The ``share=KEY`` form of :class:`DataLoader` (construct it through DataLoader)."""

    def __init__(self, dataset: Any, key: str, torch_args: dict, extra: dict) -> None:
        # The local torch loader is never iterated: it validates the arguments as torch does
        # and gives len() and the usual attributes.
        self._local = torch.utils.data.DataLoader(dataset, **torch_args, **extra)
        self.dataset = dataset
        self.batch_size = self._local.batch_size
        self.drop_last = self._local.drop_last
        self.share = key
        self.paths = share_paths(key)
        self._torch_args = torch_args
        self._extra = extra
        self._loader: Optional[Loader] = None

    @property
    def endpoint(self) -> str:
        return self.paths["endpoint"]

    def __len__(self) -> int:
        return len(self._local)

    def __iter__(self) -> Iterator[Any]:
        if self._loader is None:
            self._loader = self._attach()
        return iter(self._loader)

    @property
    def stats(self) -> Any:
        """The Loader's counters (None before the first iteration)."""
        return self._loader.stats if self._loader is not None else None

    def close(self) -> None:
        """Leaves the stream; the producer exits once no process reads it."""
        loader, self._loader = self._loader, None
        if loader is not None:
            loader.close()

    # -- share protocol ----------------------------------------------------------------------

    def _attach(self) -> Loader:
        fd = _lock(self.paths["lock"])
        try:
            pid = self._running_producer()
            if pid is None:
                pid = self._start_producer()
            self._wait_socket(pid)
            # Attach while holding the lock: the producer decides to exit under it, so it
            # counts this Loader before deciding.
            return Loader(
                self.endpoint,
                batch_size=self.batch_size,
                drop_last=self.drop_last,
                late_join="next_epoch",
                timeout=_ATTACH_TIMEOUT,
                name=f"share:{self.share}:{os.getpid()}",
            )
        finally:
            os.close(fd)  # releases the lock

    def _running_producer(self) -> Optional[int]:
        try:
            with open(self.paths["state"]) as f:
                pid = int(json.load(f)["pid"])
        except (OSError, ValueError, KeyError):
            return None
        return pid if _producer_alive(pid) else None

    def _start_producer(self) -> int:
        main = sys.modules.get("__main__")
        spec = {
            "key": self.share,
            "paths": self.paths,
            "sys_path": [p or os.getcwd() for p in sys.path],
            "cwd": os.getcwd(),
            "main_path": os.path.abspath(main.__file__) if getattr(main, "__file__", None) else None,
        }
        try:
            payload = pickle.dumps(
                {"dataset": self.dataset, "torch_args": self._torch_args, "extra": self._extra},
                protocol=pickle.HIGHEST_PROTOCOL,
            )
        except Exception as e:
            raise TypeError(
                f"DataLoader(share={self.share!r}) must pickle the dataset and the loader "
                f"arguments for its producer process, which failed: {e}; define datasets, "
                "collate_fn and worker_init_fn at module level (no lambdas or local classes)"
            ) from e
        fd, spec_path = tempfile.mkstemp(prefix="batchcast-share-", suffix=".pkl")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(spec, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.write(payload)
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        # Double fork through sh: the producer is reparented to init (nobody's zombie), runs
        # in its own session (a Ctrl-C on the first trainer's terminal does not reach it) and
        # outlives the first trainer.
        command = " ".join(
            shlex.quote(a) for a in [sys.executable, "-m", "batchcast._share_producer", spec_path]
        )
        log = shlex.quote(self.paths["log"])
        launcher = subprocess.run(
            ["/bin/sh", "-c", f"{command} </dev/null >>{log} 2>&1 & echo $!"],
            stdout=subprocess.PIPE,
            start_new_session=True,
            env=env,
            check=True,
        )
        pid = int(launcher.stdout.decode().strip())
        with open(self.paths["state"] + ".tmp", "w") as f:
            json.dump({"pid": pid, "started_by": os.getpid()}, f)
        os.replace(self.paths["state"] + ".tmp", self.paths["state"])
        return pid

    def _wait_socket(self, pid: int) -> None:
        deadline = time.monotonic() + _ATTACH_TIMEOUT
        while not os.path.exists(self.paths["socket"]):
            if not _producer_alive(pid):
                raise _batchcast.BatchcastError(
                    f"the producer of DataLoader(share={self.share!r}) (pid {pid}) exited "
                    f"before serving; its log {self.paths['log']} ends with:\n{self._log_tail()}"
                )
            if time.monotonic() > deadline:
                raise _batchcast.TimeoutError(
                    f"the producer of DataLoader(share={self.share!r}) (pid {pid}) did not "
                    f"serve within {_ATTACH_TIMEOUT} s; see {self.paths['log']}"
                )
            time.sleep(0.02)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.paths["log"], "rb") as f:
                return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
