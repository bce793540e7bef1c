"""Runs a sweep's trials in its slots until every one ended, or until stopped.

What it is: :class:`Runner` starts each queued trial in a free slot (its own process group and
session, its output to ``OUT/trials/<id>.log``, its environment: the slot's GPU as
``CUDA_VISIBLE_DEVICES``, the collocation's variables, the sweep's share scope and progress
file), records how each ended (exit code; a crash keeps its log's last lines) and gives its slot
to the next, keeps ``OUT/summary.json`` and the live table current, and on SIGINT/SIGTERM/SIGHUP
stops every trial's process group (SIGTERM, then SIGKILL after ``TRIAL_GRACE_S``) and the share
producers of the sweep's scope (detached from the trials: found by the endpoint on their command
line), all within 10 s. The data side is what can be read honestly from outside: the share
producers' CPU seconds from /proc (read every second while they run), the samples the trials'
shared loaders report (``_sweep_progress``), the samples each native producer decoded (its last
log line), and the GPUs' energy (NVML); the producers' logs end up in ``OUT/data/``.

The share producers linger between trials (``SWEEP_PID_ENV``: a trial that starts after the
others ended reads the same stream and decoded cache), and the sweep stops them when its last
trial ended. A sweep that dies without stopping them (SIGKILL) takes its trials with it: each is
started with the kernel's parent-death signal (SIGKILL), and their producers then exit by
themselves.

Thread-safety: none; one thread runs it. Signal handlers only set a flag the loop reads.
Ownership: the Runner owns the trials' processes; the caller owns the Collocation.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional

from ._energy import GpuEnergy
from ._proc import stat_fields
from ._sweep_devices import Collocation, Gpu
from ._sweep_packing import MemoryPacking
from ._sweep_progress import PROGRESS_ENV, SCOPE_ENV, SWEEP_PID_ENV, read_progress
from ._sweep_table import LiveTable

__all__ = ["Runner", "TRIAL_GRACE_S"]

TRIAL_GRACE_S = 4.0  # a stopped trial's group gets SIGKILL after this
PRODUCER_GRACE_S = 3.0  # a share producer of the scope: SIGTERM, then SIGKILL after this
_POLL_S = 0.2  # trials' exits and free slots
_REPORT_S = 1.0  # progress, the scope's producers, the table and summary.json (and on changes)
_TAIL_LINES = 12
_CLOCK = os.sysconf("SC_CLK_TCK")
_PR_SET_PDEATHSIG = 1
# A native share producer's last line (server/serve/serve.cpp): its samples decoded in all and,
# with the decoded cache, the cache's hits and misses.
_DONE = re.compile(r"done: .*?; (\d+) samples decoded in all"
                   r"(?:; decoded cache: \d+ images, [^,]*, (\d+) hits, (\d+) misses)?")


def _cpu_s(pid: int) -> Optional[float]:
    """CPU seconds of a process and its reaped children, from /proc/PID/stat."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    return sum(int(v) for v in fields[11:15]) / _CLOCK  # utime, stime, cutime, cstime


def _die_with(parent: int) -> Callable[[], None]:
    """The child side of a trial's start: the kernel kills it (SIGKILL) when the sweep dies,
    however it dies (SIGKILL, its terminal gone), so that no trial outlives its sweep; then
    the share producers go too, once their last trial is gone. Linux's PR_SET_PDEATHSIG."""
    libc = ctypes.CDLL(None, use_errno=True)

    def arm() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the sweep died before the line above
            os._exit(1)

    return arm


def _log_tail(path: str, lines: int = _TAIL_LINES) -> List[str]:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 65536))
            return f.read().decode(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


class Runner:
    """The sweep's run loop over ``records`` (summary.json's trial dicts, those to run with
    state ``queued``); ``slots``: a GPU or None each; ``argv``: what runs a record (default: its
    command); ``source``: where more records come from once none is queued (``next()``: a
    record or None, ``exhausted``, ``ended(record)``: told each that ends; _sweep_optuna);
    ``packing``: adds slots on each GPU once it measured the first trial (_sweep_packing)."""

    def __init__(self, records: List[Dict[str, Any]], slots: List[Optional[Gpu]],
                 collocation: Collocation, out: str, scope: str, summary: Dict[str, Any],
                 table: LiveTable, env: Optional[Dict[str, str]] = None,
                 argv: Optional[Callable[[Dict[str, Any]], List[str]]] = None,
                 source: Any = None, packing: Optional[MemoryPacking] = None) -> None:
        self.records = records
        self.slots: List[Optional[str]] = [None] * len(slots)  # the trial id in each slot
        self._gpus = list(slots)  # the GPU of each slot (None: none)
        self._collocation = collocation
        self._out = out
        self._scope = scope
        self._summary = summary
        self._table = table
        self._env = dict(os.environ if env is None else env)
        self._argv = argv or (lambda record: record["command"])
        self._source = source
        self._packing = packing
        self._running: Dict[str, subprocess.Popen] = {}
        self._producers: Dict[int, Dict[str, Any]] = {}  # pid -> key, cpu_s
        self._stop_signal: Optional[int] = None
        self._reported = 0.0  # when the last report was made (time.monotonic())
        self._marker = f"/tmp/batchcast-{os.getuid()}-{scope}.".encode()
        self._energy = GpuEnergy(sorted({g.index for g in slots if g is not None}))
        self._joules0 = self._energy.read()

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> Optional[int]:
        """Runs every queued trial; returns None, or the signal that stopped the sweep."""
        previous = {s: signal.signal(s, self._on_signal)
                    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            while self._stop_signal is None:
                ended = self._reap()
                if ended:
                    self._pack()  # the first trial's end decides before its slot is reused
                changed = ended + self._fill()
                if changed or time.monotonic() - self._reported >= _REPORT_S:
                    self._observe()
                    self._pack()
                    self._table.draw(self.records)
                    self.write_summary()
                    self._reported = time.monotonic()
                if not self._running and not any(r["state"] == "queued" for r in self.records) \
                        and (self._source is None or self._source.exhausted):
                    break
                time.sleep(_POLL_S)
        finally:
            self._stop_trials()
            self._stop_producers()
            self._collect_logs()
            for s, handler in previous.items():
                signal.signal(s, handler)
        self._table.draw(self.records)
        return self._stop_signal

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._stop_signal = signum

    def _pack(self) -> None:
        if self._packing is None:
            return
        decision = self._packing.update(self.records)
        if decision is None:
            return
        by_index = {g.index: g for g in self._gpus if g is not None}
        for index, slots in decision.items():
            self._gpus += [by_index[index]] * (slots - 1)
            self.slots += [None] * (slots - 1)
        self._summary["sweep"]["per_gpu"] = decision
        self._summary["sweep"]["slots"] = len(self.slots)
        self._table.say(f"batchcast sweep: {self._packing.line}")

    def _fill(self) -> int:
        """Starts queued trials (then the source's) in free slots; how many it started."""
        started = 0
        for record in self.records:
            if record["state"] != "queued":
                continue
            if None not in self.slots:
                return started
            self._start(record, self.slots.index(None))
            started += 1
        while self._source is not None and None in self.slots:
            record = self._source.next()
            if record is None:
                break
            self.records.append(record)
            self._start(record, self.slots.index(None))
            started += 1
        return started

    def _start(self, record: Dict[str, Any], slot: int) -> None:
        gpu = self._gpus[slot]
        env = dict(self._env, **self._collocation.env(), **record.get("env", {}))
        env[SCOPE_ENV] = self._scope
        env[SWEEP_PID_ENV] = str(os.getpid())
        env[PROGRESS_ENV] = os.path.join(self._out, "trials", f"{record['id']}.progress.json")
        try:
            os.unlink(env[PROGRESS_ENV])  # a resumed trial's earlier run's
        except FileNotFoundError:
            pass
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu.device
        record.update(gpu=None if gpu is None else gpu.index, slot=slot, start=time.time(),
                      end=None, exit_code=None, last_lines=None, samples=None,
                      samples_per_s=None, epochs=None, wait_percent=None)
        with open(record["log"], "ab") as log:
            log.write(f"# batchcast sweep: trial {record['id']}: {record['command']}\n".encode())
            log.flush()
            try:
                # Its own session: the terminal's Ctrl-C reaches the sweep, which stops every
                # trial's whole group (DataLoader workers included) the same way.
                process = subprocess.Popen(self._argv(record), stdin=subprocess.DEVNULL,
                                           stdout=log, stderr=subprocess.STDOUT, env=env,
                                           start_new_session=True,
                                           preexec_fn=_die_with(os.getpid()))
            except OSError as e:
                log.write(f"# cannot start it: {e}\n".encode())
                record.update(state="failed", exit_code=127, end=time.time(),
                              last_lines=[f"cannot start it: {e}"])
                if self._source is not None:
                    self._source.ended(record)
                return
        record["state"] = "running"
        self.slots[slot] = record["id"]
        if self._packing is not None:
            self._packing.started(record, gpu)
        self._running[record["id"]] = process

    def _reap(self) -> int:
        """Records the trials that exited; how many."""
        ended = 0
        for record in self.records:
            process = self._running.get(record["id"])
            if process is None or process.poll() is None:
                continue
            self._ended(record, process, "finished" if process.returncode == 0 else "failed")
            ended += 1
        return ended

    def _ended(self, record: Dict[str, Any], process: subprocess.Popen, state: str) -> None:
        code = process.returncode
        record.update(state=state, exit_code=code if code >= 0 else 128 - code, end=time.time())
        self._kill_group(process.pid, signal.SIGKILL)  # what it left behind in its group
        self._progress(record)
        if record["exit_code"] != 0:
            record["last_lines"] = _log_tail(record["log"])
        if self._source is not None:
            self._source.ended(record)
        del self._running[record["id"]]
        self.slots[record["slot"]] = None

    # -- what is observed --------------------------------------------------------------------

    def _observe(self) -> None:
        for record in self.records:
            if record["id"] in self._running:
                self._progress(record)
        for pid, key in self._scope_producers().items():
            cpu = _cpu_s(pid)
            entry = self._producers.setdefault(pid, {"key": key, "pid": pid, "cpu_s": 0.0})
            if cpu is not None:
                entry["cpu_s"] = max(entry["cpu_s"], cpu)

    def _progress(self, record: Dict[str, Any]) -> None:
        seen = read_progress(os.path.join(self._out, "trials",
                                          f"{record['id']}.progress.json"))
        if seen is None:
            return
        # From the first batch asked for: a trial's start-up (imports, its model) is no reading.
        since = max(record["start"], seen["since"])
        span = (record["end"] or time.time()) - since
        record.update(samples=seen["samples"], epochs=seen["epochs"])
        if span > 0:
            record["samples_per_s"] = round(seen["samples"] / span, 3)
            record["wait_percent"] = round(min(100.0, 100.0 * seen["wait_s"] / span), 1)

    def _scope_producers(self) -> Dict[int, str]:
        """The live share producers of this sweep's scope: pid -> the share file's stem."""
        found = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if b"batchcast._share_producer" in cmdline and self._marker in cmdline:
                at = cmdline.index(self._marker) + len(self._marker)
                found[int(entry)] = cmdline[at:].split(b"\0")[0].decode(errors="replace")
        return found

    def _decoded(self) -> Dict[str, Any]:
        """What the native share producers that ended decoded, from the ``done:`` line each
        writes to its log (in /tmp while the sweep runs, in OUT/data/ after): the samples
        decoded from their files (the samples a producer made less those it cropped from its
        decoded cache), and the cache's hits and misses where it ran. None where no producer
        ended yet (or none was native)."""
        decoded, hits, misses, cached = 0, 0, 0, False
        found = False
        logs = glob.glob(glob.escape(self._marker.decode()) + "*.log")
        logs += glob.glob(os.path.join(glob.escape(self._out), "data", "*.log"))
        for path in logs:
            try:
                with open(path, errors="replace") as f:
                    text = f.read()
            except OSError:
                continue
            for m in _DONE.finditer(text):
                found = True
                decoded += int(m.group(1))
                if m.group(2) is not None:
                    cached = True
                    hits += int(m.group(2))
                    misses += int(m.group(3))
        return {"samples_decoded": decoded - hits if found else None,
                "cache": {"hits": hits, "misses": misses} if cached else None}

    def data(self) -> Dict[str, Any]:
        """summary.json's ``data``: what the sweep can tell about the data side (see the module
        doc; ``how`` says where each figure comes from)."""
        consumed = [r["samples"] for r in self.records if r.get("samples") is not None]
        producers = [dict(p, key=p["key"].rsplit(".sock", 1)[0])
                     for p in self._producers.values()]
        joules = self._energy.read()
        gpu_j = None if joules is None or self._joules0 is None else joules - self._joules0
        samples = sum(consumed) if consumed else None
        return {
            "samples_consumed": samples,
            **self._decoded(),
            "cpu_s": round(sum(p["cpu_s"] for p in producers), 3),
            "gpu_joules": None if gpu_j is None else round(gpu_j, 1),
            "gpu_joules_per_sample": round(gpu_j / samples, 5) if gpu_j and samples else None,
            "producers": producers,
            "how": "samples_decoded and cache: each native share producer's done line, once it "
                   "ended (samples decoded: the samples it made less its cache hits); cpu_s: "
                   "each share producer's CPU read from /proc every "
                   f"{_REPORT_S:g} s while it ran (its last interval is missing); gpu_joules: "
                   "the sweep's GPUs' energy counters (NVML) since the sweep started, trials "
                   "and data side together",
        }

    # -- stopping ----------------------------------------------------------------------------

    @staticmethod
    def _kill_group(pgid: int, signum: int) -> None:
        try:
            os.killpg(pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass  # nothing left in it

    def _stop_trials(self) -> None:
        if not self._running:
            return
        for process in self._running.values():
            self._kill_group(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + TRIAL_GRACE_S
        while self._running and time.monotonic() < deadline:
            self._reap_stopped("stopped")
            time.sleep(0.05)
        for process in self._running.values():
            self._kill_group(process.pid, signal.SIGKILL)
        for process in self._running.values():
            process.wait()
        self._reap_stopped("stopped")

    def _reap_stopped(self, state: str) -> None:
        for record in self.records:
            process = self._running.get(record["id"])
            if process is not None and process.poll() is not None:
                self._ended(record, process, state)

    def _stop_producers(self) -> None:
        """The scope's share producers, once no trial is left: SIGTERM (each writes its last
        line, which summary.json reads), then SIGKILL after PRODUCER_GRACE_S."""
        self._observe()
        left = self._scope_producers()
        for pid in left:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + PRODUCER_GRACE_S
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = {pid: k for pid, k in left.items() if pid in self._scope_producers()}
        for pid, key in left.items():
            self._table.say(f"batchcast sweep: the share producer {pid} ({key}) ignored "
                            "SIGTERM; killed")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # -- output ------------------------------------------------------------------------------

    def _collect_logs(self) -> None:
        """Moves the scope's share logs (/tmp/batchcast-<uid>-<scope>.<key>.log) into
        ``OUT/data/`` and removes its producers' failure records: the sweep leaves nothing of
        its own in /tmp."""
        prefix = self._marker.decode()
        # A producer's failure record tells Loaders that come later: none will, in this scope.
        for path in glob.glob(glob.escape(prefix) + "*.failed"):
            os.unlink(path)
        for path in glob.glob(glob.escape(prefix) + "*.log"):
            os.makedirs(os.path.join(self._out, "data"), exist_ok=True)
            target = os.path.join(self._out, "data", path[len(prefix):])
            with open(path, "rb") as src, open(target, "ab") as dst:
                shutil.copyfileobj(src, dst)
            os.unlink(path)

    def write_summary(self) -> None:
        self._summary["trials"] = self.records
        self._summary["data"] = self.data()
        path = os.path.join(self._out, "summary.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self._summary, f, indent=1)
        os.replace(path + ".tmp", path)
