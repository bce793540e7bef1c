"""The CPU figures against the kernel's (metrics/README.md, "What each figure counts"): a tracked
process tree (threads, a grandchild) against its own getrusage, a process it leaves behind
counted once wherever it ends, and a real `batchcast serve` against wait4. CPU time is compared,
not wall time, with work far above /proc's 10 ms steps, so a busy machine only makes them
slower. Tolerance: 10 % + 0.05 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

import batchcast
from batchcast.tools import metrics


def near(recorded: float, kernel: float) -> bool:
    return abs(recorded - kernel) <= 0.1 * kernel + 0.05


def track(tmp_path, *command: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batchcast", "track", "--out", str(tmp_path),
                           "--no-gpu", "--run-name", "r", "--interval", "0.2", "--", *command],
                          capture_output=True, text=True, timeout=300, env=env)


# Burns CPU in two threads and in a grandchild it waits for, then writes what the kernel says
# it and its reaped descendants used (RUSAGE_SELF + RUSAGE_CHILDREN) to argv[1].
TREE = textwrap.dedent(
    """
    import resource, subprocess, sys, threading, time
    def burn(seconds):
        until = time.thread_time() + seconds
        while time.thread_time() < until:
            sum(range(1000))
    threads = [threading.Thread(target=burn, args=(0.5,)) for _ in range(2)]
    for t in threads:
        t.start()
    grandchild = subprocess.Popen([sys.executable, "-c", "import time\\n"
        "until = time.process_time() + 0.8\\n"
        "while time.process_time() < until: sum(range(1000))"])
    for t in threads:
        t.join()
    grandchild.wait()
    cpu = sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF,
              resource.RUSAGE_CHILDREN) for f in ("ru_utime", "ru_stime"))
    with open(sys.argv[1], "w") as f:
        f.write(repr(cpu))
    """
)


def test_a_tracked_process_tree_is_what_the_kernel_says(tmp_path):
    kernel_file = tmp_path / "kernel"
    p = track(tmp_path, sys.executable, "-c", TREE, str(kernel_file))
    assert p.returncode == 0, p.stderr
    kernel = float(kernel_file.read_text())
    assert kernel > 1.5
    s = metrics.summarize(tmp_path / "batchcast" / "default" / "r")
    assert near(s["cpu_core_s"]["all"], kernel), (s["cpu_core_s"], kernel)
    (command,) = s["processes"]
    assert command["cpu_exact"] is True


# Starts a detached process (double fork through sh, its own session: how the share producer
# starts) that records itself as a server under BATCHCAST_METRICS_DIR from its start, burns CPU
# and writes its own kernel figure; the command burns too. With argv[2] == "wait" the command
# waits for the detached one to have exited (then track reaps it); with "outlives" the detached
# one ends only once track has finished its run (summary.json complete), so it outlived it.
LEAVES = textwrap.dedent(
    """
    import os, resource, shlex, subprocess, sys, time
    out, mode = sys.argv[1], sys.argv[2]
    detached = (
        "import json, os, resource, sys, time\\n"
        "from batchcast._tracking import track\\n"
        "run = os.environ['BATCHCAST_METRICS_DIR']\\n"
        "t = track(run, role='server', interval=0.2, gpu=False, since_start=True)\\n"
        "until = time.process_time() + 1.0\\n"
        "while time.process_time() < until: sum(range(1000))\\n"
        "def done():\\n"
        "    try: return json.load(open(run + '/command/summary.json'))['complete']\\n"
        "    except (OSError, ValueError, KeyError): return False\\n"
        "while sys.argv[2] == 'outlives' and not done(): time.sleep(0.05)\\n"
        "t.stop()\\n"
        "ru = resource.getrusage(resource.RUSAGE_SELF)\\n"
        "open(sys.argv[1] + '.part', 'w').write(repr(ru.ru_utime + ru.ru_stime))\\n"
        "os.rename(sys.argv[1] + '.part', sys.argv[1])\\n")
    command = shlex.join([sys.executable, "-c", detached, out + ".detached", mode])
    pid = int(subprocess.run(["/bin/sh", "-c", command + " </dev/null >/dev/null 2>&1 & echo $!"],
                             start_new_session=True, check=True, capture_output=True).stdout)
    until = time.process_time() + 0.6
    while time.process_time() < until:
        sum(range(1000))

    def running(pid):
        try:
            stat = open(f"/proc/{pid}/stat", "rb").read()
        except OSError:
            return False  # exited, and track has reaped it
        return stat[stat.rindex(b")") + 2:].split()[0] != b"Z"

    while mode == "wait" and running(pid):
        time.sleep(0.05)
    cpu = sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF,
              resource.RUSAGE_CHILDREN) for f in ("ru_utime", "ru_stime"))
    open(out + ".command", "w").write(repr(cpu))
    """
)


@pytest.mark.parametrize("mode", ["outlives", "wait"])
def test_a_process_the_command_leaves_behind_is_counted_once(tmp_path, mode):
    out = str(tmp_path / "kernel")
    p = track(tmp_path, sys.executable, "-c", LEAVES, out, mode)
    assert p.returncode == 0, p.stderr
    deadline = time.monotonic() + 120
    while not os.path.exists(out + ".detached") and time.monotonic() < deadline:
        time.sleep(0.1)  # it writes its figure after its summary.json
    command = float(open(out + ".command").read())
    detached = float(open(out + ".detached").read())
    s = metrics.summarize(tmp_path / "batchcast" / "default" / "r")
    assert near(s["cpu_core_s"]["all"], command + detached), (s["cpu_core_s"], command, detached)
    adopted = [q for q in s["processes"] if q.get("id") == metrics.ADOPTED]
    assert len(adopted) == 1
    assert adopted[0]["cpu_exact"] is (mode == "wait")
    if mode == "outlives":
        assert "still running" in p.stderr


TRAINER = textwrap.dedent(
    """
    import sys, batchcast
    loader = batchcast.Loader(sys.argv[1], batch_size=16, timeout=120)
    for epoch in range(2):
        for x, y in loader:
            pass
    loader.close()
    """
)


def test_the_servers_summary_cpu_is_what_wait4_says(tmp_path, endpoint, batchcast_cli, run_py):
    data = tmp_path / "data"
    made = subprocess.run([batchcast_cli, "make-dataset", "--out", str(data), "--classes", "3",
                           "--per-class", "100"], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    run = tmp_path / "run"
    server = batchcast.serve(str(data), endpoint=endpoint, batch_size=16, epochs=2,
                             min_consumers=2, workers=2, metrics_dir=str(run),
                             extra_args=["--metrics-interval", "0.2"], timeout=120)
    try:
        trainers = [run_py(TRAINER, endpoint) for _ in range(2)]
        for t in trainers:
            _, err = t.communicate(timeout=300)
            assert t.returncode == 0, err
        _, _, ru = os.wait4(server.pid, 0)
        server.process.returncode = 0
    finally:
        server.stop()
    kernel = ru.ru_utime + ru.ru_stime
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] is True
    assert near(summary["cpu_core_s"]["server"], kernel), (summary["cpu_core_s"], kernel)
