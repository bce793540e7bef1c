"""The trainer side of ``batchcast.DataLoader(share=KEY)``: one share stream per process.

What it is: :class:`SharedStream` finds or starts the detached producer of a key (module
``_share_producer``), checks that it serves the same pipeline, attaches a :class:`Loader` and
positions it for each iteration (the trainer's ``sampler.epoch``, a resumed position, or the
next epoch), and switches it to another view of the stream when the trainer's transform changes
(:meth:`follow`). Helpers: :func:`share_paths`, :func:`distributed_rank`, :func:`native_plan`.

Thread-safety: none; a SharedStream belongs to the DataLoader that made it, used by one thread.
Ownership and lifetime: the SharedStream owns its Loader (closed by ``close()``); the producer
process is owned by nobody: it exits once no Loader reads its stream (``_share_producer``).

Protocol (files ``/tmp/batchcast-<uid>-<effective key>.{sock,lock,json,log}``): under an fcntl
lock on ``.lock`` a trainer reads ``.json`` (the producer's pid, the pipeline's fingerprint);
with no live producer it pickles the pipeline (a native plan alone, else the dataset, sampler,
loader arguments, plus its sys.path, cwd and main script) and starts ``python -m
batchcast._share_producer`` through ``sh -c '... &'`` (own session, output to ``.log``) with the
read end of a pipe, the claim: the producer does not exit for want of Loaders while the starting
trainer holds the write end (until it attached, closed, or died). A native plan's producer
starts when the DataLoader is made (:meth:`start`), overlapping the trainer's start-up; any other
at the first iteration (the dataset pickled as torch's workers would see it). There, under the
lock, the trainer waits for the socket and attaches, so the producer, which decides to exit
under the same lock, counts it. The effective key is KEY, plus ``-rank<r>of<w>`` for one of
w > 1 distributed ranks: rank r of every job shares one stream. Inside a sweep
(``$BATCHCAST_SHARE_SCOPE``, set by ``batchcast sweep``) KEY is first scoped to it
(``_share_scope.scoped_key``); the Loader's progress goes to ``$BATCHCAST_SWEEP_PROGRESS``.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import logging
import os
import pickle
import re
import sys
import time
from typing import Any, Dict, Iterator, Optional, Tuple, Union

import torch
import torch.utils.data

from . import _batchcast, _torchvision_plan
from ._fingerprint import plan_view, view_of
from ._share_producer import _lock, launch
from .loader import Loader
from ._share_scope import scoped_key
from ._sweep_progress import report_progress
from ._proc import pid_running

__all__ = ["SharedStream", "distributed_rank", "native_plan", "pipeline_of", "share_paths"]

_log = logging.getLogger("batchcast")


def share_paths(key: str) -> Dict[str, str]:
    """Files of an effective share key: endpoint, socket, lock, state and log."""
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


def distributed_rank() -> Tuple[int, int]:
    """(rank, world size): torch.distributed's once initialised, else the torchrun
    environment (RANK, or LOCAL_RANK, and WORLD_SIZE), else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK"))
    world = os.environ.get("WORLD_SIZE")
    if rank is None or world is None:
        return 0, 1
    return int(rank), int(world)


def native_plan(
    loader: torch.utils.data.DataLoader,
    user_args: Dict[str, Any],
    seed: Optional[int],
    pin_memory: bool,
    pin_memory_device: str,
) -> Union[_torchvision_plan.NativePlan, _torchvision_plan.Fallback]:
    """The native plan of the loader's pipeline, or the Fallback saying why there is none
    (_torchvision_plan.plan logs it).
    ``user_args`` are the DataLoader arguments as the user gave them (sampler, collate_fn...).

    Where it decodes: pinned batches say the trainer moves them to a GPU, so with
    ``pin_memory`` (a CUDA device usable, nvJPEG in this build) the native server decodes into a
    pool on ``pin_memory_device`` (default: the current CUDA device), its ``num_workers`` CPU
    threads first and nvJPEG what a trainer waits for (the mixed decoder), and batches
    arrive as CUDA tensors there; otherwise the CPU decoder fills a host pool."""
    device, nvjpeg = None, False
    if pin_memory and _batchcast.has_nvjpeg and torch.cuda.is_available():
        device = pin_memory_device or f"cuda:{torch.cuda.current_device()}"
        nvjpeg = True
    try:
        found = _torchvision_plan.plan(
            loader.dataset, user_args, seed=seed or 0, device=device, nvjpeg=nvjpeg
        )
    except Exception as e:  # noqa: BLE001 - a transform that surprises the recogniser
        why = f"recognising its pipeline failed ({type(e).__name__}: {e})"
        _log.warning("batchcast: the dataset runs in Python, not natively: %s", why)
        return _torchvision_plan.Fallback(why)
    return found


def _producer_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    # An empty cmdline: the process is in execve (sh -> python) at this instant.
    return (not cmdline or b"batchcast._share_producer" in cmdline) and pid_running(pid)


class SharedStream:
    """The stream of one share key as one trainer reads it (see the module doc).

    ``pipeline`` is what the producer rebuilds (pickled): dataset, sampler, seed, batch_size,
    drop_last, collate_fn and the torch arguments that shape decoding (``loader_args``); its
    batch_size and drop_last are also this trainer's own, cut from the stream's chunks.
    ``augment_seed``: this trainer's own augmentation seed (a view of the stream), or None;
    ``python_why``: why the pipeline has no native plan ("" when it has one).
    """

    def __init__(
        self, key: str, pipeline: Dict[str, Any], prints: Dict[str, Any], loader_args: dict,
        augment_seed: Optional[int] = None, python_why: str = "",
    ) -> None:
        self.key = key
        rank, world = distributed_rank()
        scoped = scoped_key(key, prints)
        self.effective_key = scoped if world == 1 else f"{scoped}-rank{rank}of{world}"
        self.paths = share_paths(self.effective_key)
        self._pipeline = pipeline
        self._fingerprint = prints
        self._loader_args = loader_args  # Loader(...) arguments: timeout, pin_memory, order
        self._augment_seed = augment_seed
        self._python_why = python_why
        self._loader: Optional[Loader] = None
        self._resume: Optional[Dict[str, Any]] = None  # a loaded state, for the next iteration
        self._private = False
        self._view: Optional[str] = None  # follow()'s view; None: the one the fingerprint says
        self._claim: Optional[int] = None  # write end of the claim of a producer we started

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_claim"] = None  # a descriptor of this process only
        return state

    # -- iteration ---------------------------------------------------------------------------

    def iterate(self, sampler_epoch: Optional[int]) -> Iterator[Any]:
        """One epoch: the resumed position if one was loaded, else the sampler's epoch (when
        the sampler has one), else the next epoch of the stream."""
        asked = time.time()  # a first epoch's attach (the producer starting) is data's time too
        loader = self._attach() if self._loader is None else self._loader
        if self._resume is not None:
            state, self._resume = self._resume, None
            batches = self._seek(state)
        elif sampler_epoch is not None:
            batches = self._seek({"epoch": sampler_epoch, "sample": 0})
        else:
            batches = iter(loader)
        return report_progress(self._told(batches), self.effective_key, lambda: self.stats, asked)

    def _told(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches``, where a failed or vanished producer's error also says where its log is
        (see :meth:`_raise_naming_log`)."""
        try:
            yield from batches
        except _batchcast.BatchcastError as e:
            self._raise_naming_log(e)
            raise

    def _raise_naming_log(self, e: Exception) -> None:
        """Where ``e`` says the producer failed or vanished, raises the same error saying where
        the producer's log is (a producer keeps its log unless it exits cleanly)."""
        if isinstance(e, _batchcast.ServerGoneError) or str(e).startswith("server failed"):
            raise type(e)(f"{e}; the share producer's log is kept: {self.paths['log']}") from e

    def _seek(self, state: Dict[str, Any]) -> Iterator[Any]:
        """The Loader's batches from the position of ``state`` (Loader.load_state_dict's)."""
        assert self._loader is not None
        self._loader.load_state_dict(state)
        batches = iter(self._loader)
        try:
            # The server answers a seek with the position's first batch or a refusal, which
            # surfaces from the first next(): take it here, where a fallback is still possible.
            first = next(batches)
        except StopIteration:
            return iter(())
        except _batchcast.PositionUnavailableError as e:
            if self._private:
                raise
            _log.warning(
                "DataLoader(share=%r): the shared stream cannot serve epoch %d sample %d (%s); "
                "this trainer reads a private producer of the same pipeline from now on "
                "(its samples are decoded again)", self.key, state["epoch"], state["sample"], e,
            )
            self.close()
            self._private = True
            self.effective_key += f"-private{os.getpid()}"
            self.paths = share_paths(self.effective_key)
            self._attach()
            return self._seek(state)
        return itertools.chain((first,), batches)

    # -- state -------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        if self._resume is not None:
            return dict(self._resume)
        if self._loader is None:
            return {"epoch": None, "sample": 0}
        return self._loader.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state.get("epoch") is not None:
            self._resume = {"sample": 0, **state}

    @property
    def stats(self) -> Any:
        return self._loader.stats if self._loader is not None else None

    @property
    def attached(self) -> bool:
        """Whether this trainer reads the stream yet (its first iteration attached it)."""
        return self._loader is not None

    def restate(self, fields: Dict[str, Any]) -> None:
        """Before the first iteration of a Python pipeline: the dataset's fields changed, and
        the producer it starts will run the dataset as it is then."""
        self._fingerprint.update(fields)

    def follow(self, view: str) -> None:
        """Reads ``view`` (a view text of the stream) from the next epoch on: the trainer's
        transform changed (progressive resizing); see Loader.set_view."""
        self._view = view
        if self._loader is not None:
            self._loader.set_view(view)

    def close(self) -> None:
        self._release_claim()
        loader, self._loader = self._loader, None
        if loader is not None:
            loader.close()

    # -- share protocol ----------------------------------------------------------------------

    def start(self) -> None:
        """Starts the key's producer now unless one is running (one that serves another
        pipeline is told at the first iteration, as without start)."""
        fd = _lock(self.paths["lock"])
        try:
            if self._running_producer() is None:
                self._start_producer()
        finally:
            os.close(fd)

    def _release_claim(self) -> None:
        claim, self._claim = self._claim, None
        if claim is not None:
            os.close(claim)

    def _attach(self) -> Loader:
        fd = _lock(self.paths["lock"])
        try:
            state = self._running_producer()
            plan = self._pipeline.get("native")
            if state is None:
                state = self._start_producer()
                view = "" if self._augment_seed is None else plan_view(plan, self._augment_seed)
            else:
                view = view_of(self.key, self._fingerprint, state.get("fingerprint", {}), plan,
                               self._python_why, self._augment_seed)
            if self._view is not None:
                view = self._view
            self._wait_socket(int(state["pid"]))
            _log.debug("DataLoader(share=%r): producer %s serving", self.key, state["pid"])
            # Attach while holding the lock: the producer decides to exit under it, so it
            # counts this Loader before deciding. A producer that regenerates gives a late
            # joiner whole epochs from its first batch; one that cannot, the next whole epoch.
            try:
                self._loader = Loader(
                    self.paths["endpoint"],
                    batch_size=self._pipeline["batch_size"],
                    drop_last=self._pipeline["drop_last"],
                    late_join="replay" if state.get("regenerates") else "next_epoch",
                    name=f"share:{self.effective_key}:{os.getpid()}",
                    view=view or None,
                    **self._loader_args,
                )
            except _batchcast.BatchcastError as e:  # failed before this trainer attached
                self._raise_naming_log(e)
                raise
            self._release_claim()  # counted: the producer no longer needs it
            _log.debug("DataLoader(share=%r): attached", self.key)
            return self._loader
        finally:
            os.close(fd)  # releases the lock

    def _running_producer(self) -> Optional[Dict[str, Any]]:
        try:
            with open(self.paths["state"]) as f:
                state = json.load(f)
            pid = int(state["pid"])
        except (OSError, ValueError, KeyError):
            return None
        return state if _producer_alive(pid) else None

    def _start_producer(self) -> Dict[str, Any]:
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        spec = {
            "key": self.effective_key,
            "paths": self.paths,
            "sys_path": [p or os.getcwd() for p in sys.path],
            "cwd": os.getcwd(),
            "main_path": os.path.abspath(main_file) if main_file else None,
        }
        native = self._pipeline.get("native")
        # A native plan is all its producer needs: no dataset to pickle, nor torch to load it.
        carried = self._pipeline if native is None else {
            "native": native, "decoding": {"num_workers": self._pipeline["decoding"]["num_workers"]},
            "memory": self._pipeline.get("memory", 0),
            "cache": self._pipeline.get("cache", "off"),
        }
        try:
            payload = pickle.dumps(carried, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise TypeError(
                f"DataLoader(share={self.key!r}) must pickle the dataset, sampler and loader "
                f"arguments for its producer process, which failed: {e}; define datasets, "
                "collate_fn and worker_init_fn at module level (no lambdas or local classes)"
            ) from e
        self._release_claim()  # of a producer this stream started before, now gone
        try:  # no producer of the key lives: a failure recorded on its endpoint is an old one
            os.unlink(self.paths["socket"] + ".failed")
        except FileNotFoundError:
            pass
        pid, self._claim = launch(spec, payload)
        state = {
            "pid": pid,
            "started_by": os.getpid(),
            "fingerprint": self._fingerprint,
            "regenerates": self._pipeline["sampler"] is not None,
        }
        with open(self.paths["state"] + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(self.paths["state"] + ".tmp", self.paths["state"])
        _log.debug("DataLoader(share=%r): started its producer (pid %d, log %s)", self.key,
                   state["pid"], self.paths["log"])
        return state

    def _wait_socket(self, pid: int) -> None:
        """Waits while the producer starts (its first batch may need a worker pool); torch's
        ``timeout`` bounds it when > 0, the producer's death or failure always does (a producer
        that failed waits for this lock to remove its files, and leaves a failure record).
        Polled often: the socket appears as soon as the producer serves."""
        timeout = float(self._loader_args.get("timeout") or 0)
        deadline = time.monotonic() + timeout if timeout > 0 else None
        while not os.path.exists(self.paths["socket"]):
            if os.path.exists(self.paths["socket"] + ".failed"):
                return  # it served and failed at once: the Loader reads why from the record
            if not _producer_alive(pid):
                raise _batchcast.BatchcastError(
                    f"the producer of DataLoader(share={self.key!r}) (pid {pid}) exited before "
                    f"serving; its log {self.paths['log']} ends with:\n{self._log_tail()}"
                )
            if deadline is not None and time.monotonic() > deadline:
                raise _batchcast.TimeoutError(
                    f"the producer of DataLoader(share={self.key!r}) (pid {pid}) did not serve "
                    f"within timeout={timeout} s; see {self.paths['log']}"
                )
            time.sleep(0.02)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.paths["log"], "rb") as f:
                return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def pipeline_of(loader: torch.utils.data.DataLoader, multiprocessing_context: Any) -> tuple:
    """(pipeline to pickle for the producer, the seed the user chose or None): the loader's
    dataset and sampler, the sampler's generator replaced by its seed (generators do not
    pickle; the producer orders epoch e from seed + e, so that any epoch can be regenerated).
    Without a generator the seed is drawn here, like torch's RandomSampler draws one."""
    iterable = isinstance(loader.dataset, torch.utils.data.IterableDataset)
    sampler = None if iterable else copy.copy(loader.sampler)
    chosen: Optional[int] = None
    seed: Optional[int] = None
    if isinstance(sampler, torch.utils.data.RandomSampler):
        generator = sampler.generator or loader.generator
        if generator is not None:
            seed = chosen = int(generator.initial_seed())
        else:
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
        sampler.generator = None
    if multiprocessing_context is not None and not isinstance(multiprocessing_context, str):
        multiprocessing_context = multiprocessing_context.get_start_method()
    decoding = {
        "num_workers": loader.num_workers,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": multiprocessing_context,
        "persistent_workers": loader.persistent_workers,
    }
    if loader.num_workers > 0:
        decoding["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        decoding["in_order"] = loader.in_order
    pipeline = {
        "dataset": loader.dataset,
        "sampler": sampler,
        "seed": seed,
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "collate_fn": loader.collate_fn,
        "decoding": decoding,
    }
    return pipeline, chosen
