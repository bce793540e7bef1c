"""The server's built-in collector on a real run: `batchcast serve --metrics-dir` records the
server and its consumer processes (CPU, samples), and `python3 -m batchcast report` renders that
directory."""

import json
import os
import subprocess
import time

import batchcast


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
    assert 0 < consumer["samples"] <= 6000  # from heartbeats: the last one may precede the end
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
