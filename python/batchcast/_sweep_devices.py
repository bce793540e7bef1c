"""Where a sweep's trials run: the GPUs it may use, its slots, and how trials share a GPU.

What it is: :func:`visible_gpus` lists the GPUs this process may use (``nvidia-smi -L``: GPUs
and MIG instances, filtered by ``$CUDA_VISIBLE_DEVICES`` where set); :func:`make_slots` turns
``--gpus``/``--per-gpu``/``--slots`` into the slots trials run in (each a GPU or none);
:class:`Collocation` is how trials share a GPU: ``mps`` starts a private MPS control daemon
(pipe and log folders under the sweep's output folder, every trial its client through
``CUDA_MPS_PIPE_DIRECTORY``/``CUDA_MPS_LOG_DIRECTORY``; the GPU's compute mode untouched) and
``time-slicing`` is the driver's default. ``auto`` tries MPS and falls back to time-slicing
with one line saying why.

Thread-safety: none; used by the sweep's one thread. Ownership: a Collocation owns its daemon
until :meth:`Collocation.stop` (idempotent; the sweep calls it on every exit path).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from ._sweep_trials import SweepInputError

__all__ = ["Gpu", "Collocation", "make_slots", "visible_gpus"]

_MPS = "nvidia-cuda-mps-control"


@dataclass
class Gpu:
    """A GPU a trial may get: ``index`` (its number for ``--gpus``), ``device`` (what the
    trial's CUDA_VISIBLE_DEVICES says: a UUID, or the entry of ours), ``name``."""

    index: int
    device: str
    name: str


def _smi_list() -> List[Gpu]:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    # "GPU 0: NVIDIA H200 (UUID: GPU-...)", then its MIG instances, if any, indented below it
    # ("  MIG 1g.18gb Device 0: (UUID: MIG-...)"): a GPU split into instances is its instances.
    found: List[List[Gpu]] = []  # per GPU: itself, or its MIG instances
    for line in out.stdout.splitlines():
        if "(UUID: " not in line:
            continue
        uuid = line.rsplit("(UUID: ", 1)[1].rstrip(")").strip()
        head, _, rest = line.partition(":")
        name = rest.rsplit("(UUID", 1)[0].strip() or head.strip()
        if line.lstrip().startswith("MIG") and found:
            if found[-1][0].device.startswith("GPU-"):
                found[-1] = []
            found[-1].append(Gpu(0, uuid, f"{head.strip()}"))
        else:
            found.append([Gpu(0, uuid, name)])
    flat = [g for group in found for g in group]
    return [Gpu(i, g.device, g.name) for i, g in enumerate(flat)]


def visible_gpus(env: Optional[Dict[str, str]] = None) -> List[Gpu]:
    """The GPUs (MIG instances count as GPUs) this process may use, numbered from 0."""
    env = os.environ if env is None else env
    listed = _smi_list()
    chosen = env.get("CUDA_VISIBLE_DEVICES")
    if chosen is None:
        return listed
    picked = []
    for entry in (e.strip() for e in chosen.split(",") if e.strip()):
        if entry.isdigit():
            match = [g for g in listed if g.index == int(entry)]
        else:
            match = [g for g in listed if g.device.startswith(entry)]
        picked.append(Gpu(len(picked), match[0].device if match else entry,
                          match[0].name if match else entry))
    return picked


def make_slots(gpus: Optional[Sequence[int]], per_gpu: Optional[str], slots: Optional[int],
               visible: Sequence[Gpu]) -> List[Optional[Gpu]]:
    """The slots trials run in: ``per_gpu`` slots on each GPU of ``gpus`` (indices into
    ``visible``; None: all; "auto": one, until _sweep_packing adds more), or with no GPU
    ``slots`` slots without one. SweepInputError for what cannot be honoured."""
    k = None
    if per_gpu == "auto":  # one each until the first trial is measured (_sweep_packing)
        k = 1
    elif per_gpu is not None:
        try:
            k = int(per_gpu)
        except ValueError:
            raise SweepInputError(f"--per-gpu {per_gpu!r}: give a number of trials per GPU "
                                  "(1 or more)") from None
        if k < 1:
            raise SweepInputError(f"--per-gpu {k}: each GPU needs at least 1 trial slot; give "
                                  "--per-gpu 1 or more")
    if slots is not None and slots < 1:
        raise SweepInputError(f"--slots {slots}: give 1 or more")
    if gpus is not None:
        missing = [i for i in gpus if not 0 <= i < len(visible)]
        if missing:
            shown = ", ".join(f"{g.index} ({g.name})" for g in visible) or "none"
            raise SweepInputError(
                f"--gpus {','.join(map(str, gpus))}: GPU {missing[0]} does not exist; this "
                f"process sees {len(visible)} GPU(s): {shown} (nvidia-smi -L, "
                "CUDA_VISIBLE_DEVICES)")
        if slots is not None:
            raise SweepInputError("--slots is for a machine without GPUs; with --gpus give "
                                  "--per-gpu K")
    used = [visible[i] for i in gpus] if gpus is not None else list(visible)
    if per_gpu == "auto" and any(g.device.startswith("MIG-") for g in used):
        raise SweepInputError("--per-gpu auto measures whole GPUs' memory, and MIG instances "
                              "are used: give --per-gpu K")
    if used and slots is None:
        return [g for g in used for _ in range(k or 2)]
    if k is not None and not used:
        raise SweepInputError("--per-gpu: this process sees no GPU (nvidia-smi -L); give "
                              "--slots N to run N trials at once without GPUs")
    return [None] * (slots or 2)


class Collocation:
    """How trials share a GPU (see the module doc): :attr:`mode` (``mps`` or
    ``time-slicing``), :attr:`why` (the fallback's reason), :meth:`env` for each trial."""

    def __init__(self, asked: str, out_dir: str, gpus: Sequence[Gpu]) -> None:
        self.asked = asked
        self.mode = "time-slicing"
        self.why = ""
        self._env: Dict[str, str] = {}
        if asked == "time-slicing" or not gpus:
            self.why = "asked for" if asked == "time-slicing" else "no GPU is used"
            return
        refusal = self._mps_refusal(gpus)
        if refusal is None:
            refusal = self._start(out_dir)
        if refusal is not None:
            if asked == "mps":
                raise SweepInputError(f"--collocation mps: {refusal}; use --collocation auto "
                                      "or time-slicing")
            self.why = refusal
            return
        self.mode = "mps"

    @staticmethod
    def _mps_refusal(gpus: Sequence[Gpu]) -> Optional[str]:
        if shutil.which(_MPS) is None:
            return f"{_MPS} is not on PATH (the NVIDIA driver's MPS tools)"
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=uuid,compute_mode",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        modes = dict(line.split(", ", 1) for line in out.splitlines() if ", " in line)
        for g in gpus:
            mode = modes.get(g.device, "")
            if mode.lower().startswith("prohibited") or "exclusive" in mode.lower():
                return f"GPU {g.index} is in compute mode {mode}, where MPS cannot serve it"
        return None

    def _start(self, out_dir: str) -> Optional[str]:
        pipe, log = os.path.join(out_dir, "mps", "pipe"), os.path.join(out_dir, "mps", "log")
        os.makedirs(pipe, exist_ok=True)
        os.makedirs(log, exist_ok=True)
        env = {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": log}
        try:
            started = subprocess.run([_MPS, "-d"], env=dict(os.environ, **env),
                                     capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{_MPS} -d failed: {e}"
        if started.returncode != 0:
            said = (started.stderr or started.stdout).strip().splitlines()
            return f"{_MPS} -d exited with {started.returncode}: {' '.join(said[-2:])}"
        self._env = env
        return None

    def env(self) -> Dict[str, str]:
        """What a trial's environment needs for this collocation (MPS's folders, or nothing)."""
        return dict(self._env)

    def line(self) -> str:
        """The one line a sweep prints about it."""
        if self.mode == "mps":
            return f"collocation: MPS (a private daemon, {self._env['CUDA_MPS_PIPE_DIRECTORY']})"
        if self.asked == "time-slicing":
            return "collocation: time-slicing"
        return f"collocation: time-slicing, as MPS cannot start: {self.why}"

    def stop(self) -> None:
        """Stops the MPS daemon (``quit``; it stops its server too). Idempotent."""
        env, self._env = self._env, {}
        if not env:
            return
        try:
            # Bounded: a stopped sweep is done within 10 s (the trials' and producers' grace
            # periods take at most 7 of them).
            subprocess.run([_MPS], input="quit\n", env=dict(os.environ, **env), text=True,
                           capture_output=True, timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass  # the daemon is gone already, or stuck: nothing more this process can do
