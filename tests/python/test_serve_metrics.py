"""The server's built-in collector on a real run: `batchcast serve --metrics-dir` records the
server and its consumer processes (CPU, samples), and `python3 -m batchcast report` renders that
directory."""

import csv
import json
import os
import signal
import subprocess
import textwrap
import time

import pytest

import batchcast
from batchcast.tools import metrics

TRAINER = textwrap.dedent(
    """
    import sys, time, batchcast
    loader = batchcast.Loader(sys.argv[1], batch_size=int(sys.argv[2]), timeout=60)
    seen = 0
    for epoch in range(2):
        for x, y in loader:
            seen += len(y)
            time.sleep(0.005)  # it trains
    print(seen, flush=True)
    """
)


def test_serve_records_server_and_consumers_and_report_renders(tmp_path, endpoint, batchcast_bin,
                                                               batchcast_cli):
    run = tmp_path / "run"
    with batchcast.serve(endpoint=endpoint, synthetic=3000, sample_bytes=4096, batch_size=50,
                         epochs=2, metrics_dir=str(run),
                         extra_args=["--metrics-interval", "0.2"]) as server:
        loader = batchcast.Loader(endpoint, batch_size=50)
        seen = 0
        for _ in range(2):
            for _, labels in loader:
                seen += len(labels)
                time.sleep(0.01)  # a consumer that trains: several metric ticks see it
        loader.close()
        server.wait()
    assert seen == 6000
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] is True
    roles = {p["role"] for p in summary["processes"]}
    assert roles == {"server", "consumer"}
    (consumer,) = [p for p in summary["processes"] if p["role"] == "consumer"]
    assert consumer["pid"] == os.getpid()
    assert consumer["samples"] == 6000  # the final counters came with the consumer's Goodbye
    assert summary["cpu_core_s"]["server"] > 0
    assert summary["cpu_core_s"]["all"] >= summary["cpu_core_s"]["server"]
    for name in ("processes.csv", "server.csv", "system.csv"):
        assert (run / name).stat().st_size > 0

    out = tmp_path / "report"
    proc = subprocess.run([batchcast_cli, "report", str(run), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    html = (out / "index.html").read_text()
    for png in ("cpu.png", "throughput.png", "ring.png"):
        assert (out / png).stat().st_size > 1000
        assert png in html


def test_every_sample_two_trainers_consumed_is_counted_and_the_run_complete(
        tmp_path, endpoint, batchcast_bin, run_py):
    # Two trainer processes read 2 epochs each; the server's summary counts exactly what they
    # consumed (not what heartbeats had said by the last tick), each trainer its own record.
    run = tmp_path / "run"
    with batchcast.serve(endpoint=endpoint, synthetic=600, sample_bytes=4096, batch_size=20,
                         epochs=2, min_consumers=2, metrics_dir=str(run), ring=4,
                         extra_args=["--metrics-interval", "0.2"]) as server:
        trainers = [run_py(TRAINER, endpoint, b) for b in ("20", "7")]
        outs = []
        for p in trainers:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, err.decode()
            outs.append(int(out.decode()))
        assert server.wait(60) == 0
    assert outs == [1200, 1200]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] is True and summary["incomplete_reason"] is None
    assert summary["samples"] == 2400
    consumers = {p["pid"]: p["samples"] for p in summary["processes"] if p["role"] == "consumer"}
    assert consumers == {t.pid: 1200 for t in trainers}
    with open(run / "server.csv") as f:
        blocked = [float(r["producer_blocked_percent"]) for r in csv.DictReader(f)
                   if r["producer_blocked_percent"]]
    assert blocked and max(blocked) <= 100.0, blocked


def test_a_server_stopped_while_trainers_read_says_its_counts_are_incomplete(
        tmp_path, endpoint, batchcast_bin):
    run = tmp_path / "run"
    with batchcast.serve(endpoint=endpoint, synthetic=400, sample_bytes=64, batch_size=20,
                         epochs=0, metrics_dir=str(run)) as server:
        loader = batchcast.Loader(endpoint, timeout=30)
        next(iter(loader))
        server.process.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
        loader.close()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] is False
    assert "1 consumer(s) still attached when the server stopped" in summary["incomplete_reason"]


def _part(dir, start, duration, samples):
    os.makedirs(dir)
    with open(os.path.join(dir, "summary.json"), "w") as f:
        json.dump({"format": "batchcast-metrics", "complete": True, "start_unix_s": start,
                   "duration_s": duration, "interval_s": 1.0, "samples": samples,
                   "cpu_core_s": {"server": 0.0, "consumers": 1.0, "all": 1.0},
                   "processes": []}, f)


def test_a_folder_of_separate_runs_is_never_added_up(tmp_path, batchcast_cli):
    # A parent of a baseline measured before a shared run: two runs, never one.
    root = tmp_path / "runs"
    _part(str(root / "baseline" / "trainer-1"), 1000.0, 50.0, 100)
    _part(str(root / "baseline" / "trainer-2"), 1001.0, 50.0, 100)
    _part(str(root / "shared"), 2000.0, 30.0, 200)
    _part(str(root / "shared" / "trainer-3"), 2001.0, 20.0, 0)
    assert metrics.separate_runs(root) == [
        [str(root / "baseline" / "trainer-1"), str(root / "baseline" / "trainer-2")],
        [str(root / "shared"), str(root / "shared" / "trainer-3")]]
    with pytest.raises(ValueError, match="holds 2 runs that did not run at the same time"):
        metrics.summarize(root)
    assert metrics.summarize(root / "baseline")["samples"] == 200
    out = tmp_path / "report"
    p = subprocess.run([batchcast_cli, "report", str(root), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (f"{root} holds 2 runs that did not run at the same time; reporting them one by one: "
            f"{root / 'baseline'}, {root / 'shared'}") in p.stderr, p.stderr
    html = (out / "index.html").read_text()
    assert "batchcast metrics: baseline, shared" in html
