"""batchcast.tools.metrics (track, summarize) and batchcast.tools.report on real run directories.

Run: .venv/bin/python -m pytest tests/python/test_metrics.py
CPU assertions compare CPU time with CPU time (getrusage of the same processes), so a loaded
machine makes the tests slower, not flaky.
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from batchcast.tools import metrics, report

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(metrics.__file__)))

# A trainer with its own DataLoader (2 worker processes that burn CPU per sample). It prints the
# CPU it and its children used between just before track() and just after stop(), measured
# with getrusage (the workers are reaped by then, so RUSAGE_CHILDREN holds them).
TRAINER = textwrap.dedent(
    """
    import json, resource, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    from batchcast.tools import metrics

    torch.set_num_threads(1)

    def burn(seconds):
        t0 = time.process_time()
        while time.process_time() - t0 < seconds:
            pass

    class Burn(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            burn(0.02)
            return torch.zeros(3, 4, 4), i

    def cpu():
        s = resource.getrusage(resource.RUSAGE_SELF)
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    c0 = cpu()
    with metrics.track(sys.argv[1], interval=0.2) as t:
        loader = DataLoader(Burn(), batch_size=8, num_workers=2)
        for images, labels in t.wrap(loader):
            burn(0.05)
    c1 = cpu()
    print(json.dumps({"cpu": c1 - c0, "dir": t.dir, "samples": t.samples}))
    """
)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """Two independent trainers recording into one run directory at the same time."""
    pytest.importorskip("torch")
    run = tmp_path_factory.mktemp("runs") / "baseline"
    procs = [
        subprocess.Popen([sys.executable, "-c", TRAINER, str(run)], env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return run, results


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A server-like run made by the collector with a Python snapshot source: this process as
    the server, a child process as a consumer, a ring that fills and drains."""
    run = tmp_path_factory.mktemp("runs") / "shared"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state = {"samples": 0, "ring": 0}

        def source():
            return {
                "producer_blocked_s": state["samples"] / 1000.0,
                "ring_used": state["ring"],
                "ring_size": 4,
                "processes": [
                    {"role": "server", "id": "", "pid": os.getpid()},
                    {"role": "consumer", "id": "c0", "pid": child.pid,
                     "samples": state["samples"], "wait_s": state["samples"] / 2000.0},
                ],
            }

        c = metrics._native().MetricsCollector(str(run), source, interval=0.2)
        c.start()
        t_end = time.monotonic() + 1.5
        while time.monotonic() < t_end:
            state["samples"] += 16
            state["ring"] = (state["ring"] + 1) % 5
            x = 0
            for i in range(20000):  # a little server CPU
                x += i
            time.sleep(0.02)
        c.stop()
        summary = c.summary()
    finally:
        child.kill()
        child.wait()
    return run, summary


def test_track_records_trainer_and_dataloader_workers(baseline):
    run, results = baseline
    for r in results:
        part = metrics.summarize(r["dir"])
        assert part["samples"] == 64 == r["samples"]
        recorded = part["cpu_core_s"]["consumers"]
        # 64 samples x 20 ms in the workers + 8 batches x 50 ms in the trainer = 1.68 s at least.
        assert recorded > 1.5, part
        assert recorded == pytest.approx(r["cpu"], rel=0.15, abs=0.1), (recorded, r["cpu"])
        proc = part["processes"][0]
        assert proc["role"] == "trainer" and proc["pid"] == int(r["dir"].rsplit("-", 1)[1])
        assert proc["max_procs"] >= 3  # the trainer and its two live workers were seen
        assert proc["wait_s"] > 0
        assert part["complete"] is True
        for name in ("processes.csv", "system.csv", "server.csv", "summary.json"):
            assert os.path.isfile(os.path.join(r["dir"], name))


def test_summarize_combines_independent_trainers(baseline):
    run, results = baseline
    s = metrics.summarize(run)
    assert sorted(s["parts"]) == sorted(os.path.basename(r["dir"]) for r in results)
    parts = [metrics.summarize(r["dir"]) for r in results]
    assert s["samples"] == 128
    assert s["cpu_core_s"]["all"] == pytest.approx(sum(p["cpu_core_s"]["all"] for p in parts))
    assert s["cpu_core_s_per_sample"]["all"] == pytest.approx(s["cpu_core_s"]["all"] / 128)
    assert len(s["processes"]) == 2
    assert s["duration_s"] >= max(p["duration_s"] for p in parts)
    assert s["run_name"] == "baseline"


def test_collector_with_python_source(shared):
    run, summary = shared
    assert summary["complete"] is True
    assert summary["ring_size"] == 4
    assert summary["samples"] > 0
    assert summary["cpu_core_s"]["server"] > 0
    assert [p["role"] for p in summary["processes"]] == ["server", "consumer"]
    has_gpu = os.path.exists("/dev/nvidia0")  # NVML reports the GPUs a driver exposes
    assert bool(summary["gpus"]) == has_gpu
    with open(run / "summary.json") as f:
        assert json.load(f) == summary


def _is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_report_renders_png_and_html(shared, tmp_path):
    run, _ = shared
    index = report.render([str(run)], str(tmp_path / "out"))
    assert index == str(tmp_path / "out" / "index.html")
    page = open(index).read()
    for png in ("cpu.png", "throughput.png", "ring.png", "cpu_per_sample.png"):
        assert _is_png(tmp_path / "out" / png), png
        assert f"src='{png}'" in page
    assert "CPU core-ms/sample: all" in page and "shared" in page


def test_report_two_runs_side_by_side_from_the_command_line(shared, baseline, tmp_path):
    out = tmp_path / "cmp"
    p = subprocess.run(
        [sys.executable, "-m", "batchcast.tools.report", str(shared[0]), str(baseline[0]),
         "--out", str(out)],
        env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(out / "index.html")
    page = (out / "index.html").read_text()
    assert "<th>shared</th>" in page and "<th>baseline</th>" in page
    assert "CPU/sample (all) vs first" in page and "×" in page
    assert _is_png(out / "cpu.png") and _is_png(out / "cpu_per_sample.png")


def test_report_errors_are_clear(tmp_path):
    p = subprocess.run([sys.executable, "-m", "batchcast.tools.report", str(tmp_path)],
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert str(tmp_path) in p.stderr and "summary.json" in p.stderr


def test_wrap_counts_samples_and_waiting(tmp_path):
    torch = pytest.importorskip("torch")

    def slow_batches():
        for n in (4, 8, 2):
            time.sleep(0.05)
            yield {"x": torch.zeros(n, 3)}, torch.zeros(n)

    with metrics.track(tmp_path / "run", interval=0.1) as t:
        got = [b for b in t.wrap(slow_batches())]
    assert len(got) == 3
    s = t.summary()
    assert s["samples"] == t.samples == 14
    assert 0.1 < s["wait_s"] < 5.0
    assert s["processes"][0]["pid"] == os.getpid()
    assert os.path.basename(t.dir) == f"trainer-{os.getpid()}"
    assert t.stop() == s  # idempotent


def test_batch_size_of():
    torch = pytest.importorskip("torch")
    assert metrics.batch_size_of((torch.zeros(5, 2), torch.zeros(5))) == 5
    assert metrics.batch_size_of({"a": [torch.zeros(3)]}) == 3
    assert metrics.batch_size_of([[1, 2], [3, 4]]) == 2
    assert metrics.batch_size_of(7) == 1


def test_unwritable_directory_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(Exception) as e:
        metrics.track(tmp_path / "file" / "run")
    assert str(tmp_path / "file") in str(e.value)


def test_collector_dropped_without_stop_and_raising_source(tmp_path):
    calls = []

    def source():
        calls.append(1)
        if len(calls) > 1:
            raise ValueError("boom")
        return {"processes": [{"role": "server", "pid": os.getpid()}]}

    c = metrics._native().MetricsCollector(str(tmp_path / "r"), source, interval=0.05)
    c.start()
    deadline = time.monotonic() + 60
    while len(calls) < 2 and time.monotonic() < deadline:  # the raising call has happened
        time.sleep(0.02)
    assert len(calls) >= 2
    del c  # the destructor stops it with the GIL released: no deadlock
    with open(tmp_path / "r" / "summary.json") as f:
        assert json.load(f)["complete"] is True


def test_the_readmes_python_imports_work():
    readme = os.path.join(os.path.dirname(__file__), "..", "..", "metrics", "README.md")
    with open(readme) as f:
        lines = [l.strip() for l in f if l.strip().startswith(("from batchcast", "import batchcast"))]
    assert lines
    for line in lines:
        exec(line, {})  # raises ImportError where the README names a module that is not there
