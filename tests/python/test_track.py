"""`batchcast track` end to end (real processes), its MLflow file store read back by a reader
written here from MLflow's documented layout, experiment files, and the summary rules."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any, Dict, List

import pytest

from batchcast.tools import metrics, report

PY = "/usr/bin/python3"  # the commands under test need nothing but the standard library


def track(tmp_path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batchcast", "track", "--out", str(tmp_path),
                           "--no-gpu", *args], capture_output=True, text=True, timeout=timeout)


# --- a reader of MLflow's file store, written from its documented layout ----------------------


def read_store(root: str) -> Dict[str, Any]:
    """experiments: {id: meta}; runs: {run_id: {meta, params, tags, metrics}} with metrics
    {key: [(int timestamp_ms, float value, int step)]}; keys with "/" are nested files."""
    yaml = pytest.importorskip("yaml")
    out: Dict[str, Any] = {"experiments": {}, "runs": {}}
    for exp in os.listdir(root):
        exp_dir = os.path.join(root, exp)
        if not os.path.isfile(os.path.join(exp_dir, "meta.yaml")):
            continue
        with open(os.path.join(exp_dir, "meta.yaml")) as f:
            out["experiments"][exp] = yaml.safe_load(f)
        for run in os.listdir(exp_dir):
            run_dir = os.path.join(exp_dir, run)
            if not os.path.isfile(os.path.join(run_dir, "meta.yaml")):
                continue
            with open(os.path.join(run_dir, "meta.yaml")) as f:
                r: Dict[str, Any] = {"meta": yaml.safe_load(f)}
            for kind in ("params", "tags", "metrics"):
                r[kind] = {}
                base = os.path.join(run_dir, kind)
                for d, _, files in os.walk(base):
                    for name in files:
                        key = os.path.relpath(os.path.join(d, name), base)
                        with open(os.path.join(d, name)) as f:
                            text = f.read()
                        if kind == "metrics":
                            pts = []
                            for line in text.splitlines():
                                ts, value, step = line.split(" ")
                                pts.append((int(ts), float(value), int(step)))
                            text = pts
                        r[kind][key] = text
            out["runs"][run] = r
    return out


def grandchild_burner(tmp_path, seconds: float) -> List[str]:
    """A command whose child burns `seconds` of CPU in a grandchild (reaped by the child) and
    writes the grandchild's own CPU count to burned.txt."""
    script = tmp_path / "burn.py"
    script.write_text(textwrap.dedent(f"""
        import resource, subprocess, sys
        code = '''
        import resource
        t = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        x = 0
        while t() < {seconds}:
            x += 1
        print(t())
        '''
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        open(sys.argv[1], "w").write(out.stdout)
    """))
    return [PY, str(script), str(tmp_path / "burned.txt")]


def test_grandchild_cpu_is_attributed_to_its_run_within_ten_percent(tmp_path):
    r = track(tmp_path, "--experiment", "exp", "--workload", "burn", "--run-name", "r1",
              "--interval", "0.2", "--samples", "1000", "--", *grandchild_burner(tmp_path, 1.5))
    assert r.returncode == 0, r.stderr
    burned = float((tmp_path / "burned.txt").read_text())
    s = metrics.summarize(tmp_path / "exp" / "burn" / "r1")
    recorded = s["cpu_core_s"]["all"]
    # The two interpreters' start-up adds a few tens of ms on top of the burn.
    assert abs(recorded - burned) <= 0.1 * burned, (recorded, burned)
    assert s["samples"] == 1000
    assert s["cpu_core_s_per_sample"]["all"] == pytest.approx(recorded / 1000)
    assert s["collocation"] == "none"  # no GPU here
    assert s["run_queue_wait_s"] >= 0
    # The sampler's own cost, Python snapshot callback included: < 1 % of a core at 1 s.
    cmd = json.loads((tmp_path / "exp/burn/r1/command/summary.json").read_text())
    assert cmd["sampler"]["cpu_s"] / cmd["ticks"] < 0.01

    store = read_store(str(tmp_path / "mlruns"))
    assert store["experiments"]["0"]["name"] == "Default"
    exp_id = next(i for i, m in store["experiments"].items() if m["name"] == "exp")
    assert store["experiments"][exp_id]["experiment_id"] == exp_id
    runs = {r["tags"]["mlflow.runName"]: (rid, r) for rid, r in store["runs"].items()}
    parent_id, parent = runs["burn"]
    run_id, run = runs["r1"]
    assert run["meta"]["run_id"] == run_id and run["meta"]["experiment_id"] == exp_id
    assert run["meta"]["status"] == 3 and run["meta"]["end_time"] >= run["meta"]["start_time"]
    assert run["tags"]["mlflow.parentRunId"] == parent_id
    assert "mlflow.parentRunId" not in parent["tags"]
    assert run["params"]["workload"] == "burn" and "burn.py" in run["params"]["command"]
    assert run["params"]["collocation"] == "none"
    m = run["metrics"]
    assert m["cpu_core_s"][-1][1] == pytest.approx(recorded)
    assert m["samples"][-1][1] == 1000
    cpu_series = m[os.path.join("system", "cpu_utilization_percentage")]
    steps = [p[2] for p in cpu_series]
    assert len(steps) >= 3 and steps == sorted(set(steps))
    assert len(m[os.path.join("process", "cpu_core_s")]) >= 3


def test_exit_status_is_the_commands_and_the_run_is_failed(tmp_path):
    r = track(tmp_path, "--run-name", "bad", "--", PY, "-c", "import sys; sys.exit(3)")
    assert r.returncode == 3
    store = read_store(str(tmp_path / "mlruns"))
    (run,) = [r for r in store["runs"].values() if r["tags"]["mlflow.runName"] == "bad"]
    assert run["meta"]["status"] == 4
    assert track(tmp_path, "--", "/nonexistent/cmd").returncode == 127


def test_command_gets_its_stdout_and_the_run_dir_for_a_server(tmp_path):
    r = track(tmp_path, "--run-name", "env", "--", PY, "-c",
              "import os; print(os.environ['BATCHCAST_METRICS_DIR'])")
    assert r.returncode == 0
    assert r.stdout.strip() == str(tmp_path / "batchcast" / "default" / "env")


def test_csv_experiment_runs_collocated_rows_writes_status_back_and_resumes(tmp_path):
    exp = tmp_path / "exp.csv"
    with open(exp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Experiment", "Workload", "Status", "Run", "Devices", "Collocation", "File",
                    "Listeners", "Params"])
        w.writerow(["e", "pair", "", "", "", "", f"{PY} -c", "smi", "'print(1)'"])
        w.writerow(["e", "pair", "", "", "", "", f"{PY} -c", "smi", "'print(2)'"])
        w.writerow(["e", "done", "finished", "old", "", "", "/nonexistent", "", ""])
        w.writerow(["e", "bad", "", "", "", "", f"{PY} -c", "", "'import sys; sys.exit(2)'"])
    r = subprocess.run([sys.executable, "-m", "batchcast", "track", "--out", str(tmp_path / "o"),
                        "--file", str(exp)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr  # the "bad" row failed
    rows = list(csv.DictReader(open(exp)))
    assert [row["Status"] for row in rows] == ["finished", "finished", "finished",
                                               "failed (exit 2)"]
    assert rows[0]["Collocation"] == "none" and rows[0]["Run"].startswith("pair-0")
    assert rows[2]["Run"] == "old"  # skipped
    pair = metrics.summarize(tmp_path / "o" / "e" / "pair")
    assert len(pair["parts"]) == 2
    runs_before = len(read_store(str(tmp_path / "o" / "mlruns"))["runs"])
    # Resume: only the unfinished row runs again.
    subprocess.run([sys.executable, "-m", "batchcast", "track", "--out", str(tmp_path / "o"),
                    "--file", str(exp)], capture_output=True, text=True, timeout=120)
    assert len(read_store(str(tmp_path / "o" / "mlruns"))["runs"]) == runs_before + 1


def test_yaml_experiment_file(tmp_path):
    yaml = pytest.importorskip("yaml")
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"experiment": "y", "runs": [
        {"workload": "w", "file": f"{PY} -c", "params": "'pass'"}]}))
    r = subprocess.run([sys.executable, "-m", "batchcast", "track", "--out", str(tmp_path / "o"),
                        "--file", str(exp)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(exp.read_text())
    assert doc["experiment"] == "y" and doc["runs"][0]["status"] == "finished"


# --- summary rules and the report (pure logic on hand-written parts) ---------------------------


def _part(d, **kw) -> None:
    os.makedirs(d, exist_ok=True)
    s = {"start_unix_s": 100.0, "duration_s": 10.0, "samples": 0, "wait_s": 0.0, "ticks": 10,
         "cpu_core_s": {"server": 0.0, "consumers": 0.0, "all": 0.0}, "processes": [],
         "complete": True, "run_queue_wait_s": 0.0}
    s.update(kw)
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(s, f)


def _proc(role, pid, cpu, samples=0, **kw):
    return dict(role=role, id=kw.pop("id", ""), pid=pid, cpu_core_s=cpu, samples=samples, **kw)


def test_tracked_parts_count_cpu_once(tmp_path):
    run = tmp_path / "shared"
    # A tracked server command (its tree: 4 core-s) whose own collector also counted 3 core-s
    # of server and consumers, and a tracked trainer (2 core-s) that consumed 100 samples.
    _part(run / "serve" / "command", cpu_core_s={"server": 0, "consumers": 0, "all": 4.0},
          run_queue_wait_s=0.5, energy_joules={"gpu": 500.0, "cpu": None, "all": 500.0},
          duration_s=12.0, processes=[_proc("command", 10, 4.0, cpu_exact=True)])
    _part(run / "serve", cpu_core_s={"server": 2.0, "consumers": 1.0, "all": 3.0}, samples=100,
          run_queue_wait_s=9.0,
          processes=[_proc("server", 10, 2.0), _proc("consumer", 20, 1.0, 100)])
    _part(run / "train" / "command", cpu_core_s={"server": 0, "consumers": 0, "all": 2.0},
          run_queue_wait_s=0.25, processes=[_proc("command", 20, 2.0, cpu_exact=True)])
    s = metrics.summarize(run)
    assert s["cpu_core_s"] == {"server": 2.0, "consumers": 1.0, "all": 6.0}
    assert s["cpu_core_s_per_sample"]["all"] == pytest.approx(0.06)
    assert s["run_queue_wait_s"] == pytest.approx(0.75)
    assert s["joules_per_sample"]["all"] == pytest.approx(5.0)
    assert s["warnings"] == []


def test_a_producer_that_outlived_its_trainer_counts_by_its_own_record(tmp_path):
    # Trial 0 started the detached producer (pid 30): track saw it outlive the command (1 core-s
    # so far), and the producer's own record, from its start to its end, says 4.17.
    run = tmp_path / "shared"
    _part(run / "t0" / "command", samples=10, processes=[
        _proc("command", 20, 2.0, 10, cpu_exact=True),
        _proc("command", 30, 1.0, id=metrics.ADOPTED, cpu_exact=False)])
    _part(run / "t0", samples=960, processes=[
        _proc("server", 30, 4.17), _proc("consumer", 20, 0.5, 480), _proc("consumer", 21, 0.5, 480)])
    _part(run / "t1" / "command", samples=10,
          processes=[_proc("command", 21, 2.0, 10, cpu_exact=True)])
    s = metrics.summarize(run)
    assert s["cpu_core_s"]["all"] == pytest.approx(2.0 + 4.17 + 2.0)
    # --samples 10 each was declared, the consumers were seen: what was seen counts, once.
    assert s["samples"] == 960
    assert len(s["warnings"]) == 1 and "declared 20" in s["warnings"][0]
    # Reaped before its command ended, it is in that command's exact total instead.
    _part(run / "t0" / "command", processes=[
        _proc("command", 20, 2.0, cpu_exact=True),
        _proc("command", 30, 4.2, id=metrics.ADOPTED, cpu_exact=True)])
    assert metrics.summarize(run)["cpu_core_s"]["all"] == pytest.approx(2.0 + 4.2 + 2.0)


def test_samples_are_counted_the_same_way_for_a_baseline_and_a_shared_run(tmp_path):
    # Baseline: trainers that record themselves (metrics.track()) are seen, no flag needed.
    base = tmp_path / "baseline"
    for i, pid in enumerate((40, 41)):
        _part(base / f"t{i}" / "command", processes=[_proc("command", pid, 3.0, cpu_exact=True)])
        _part(base / f"t{i}" / f"trainer-{pid}", samples=480,
              processes=[_proc("trainer", pid, 2.5, 480)])
    s = metrics.summarize(base)
    assert s["samples"] == 960 and s["warnings"] == [] and s["cpu_core_s"]["all"] == 6.0
    # A shared run whose trainers also record themselves: each trainer once, not also as the
    # server's consumer.
    shared = tmp_path / "shared"
    _part(shared / "t0" / "command", processes=[_proc("command", 50, 1.0, cpu_exact=True)])
    _part(shared / "t0" / "trainer-50", samples=480, processes=[_proc("trainer", 50, 0.9, 480)])
    _part(shared / "t0", samples=480,
          processes=[_proc("server", 60, 2.0), _proc("consumer", 50, 0.9, 480)])
    assert metrics.summarize(shared)["samples"] == 480
    # Nothing seen and nothing declared: no per-sample figures, and the summary says why.
    blind = tmp_path / "blind"
    _part(blind / "t0" / "command", processes=[_proc("command", 70, 3.0, cpu_exact=True)])
    s = metrics.summarize(blind)
    assert s["samples"] == 0 and s["cpu_core_s_per_sample"]["all"] is None
    assert len(s["warnings"]) == 1 and "--samples N" in s["warnings"][0]
    # Declared only: the declaration counts.
    _part(blind / "t0" / "command", samples=960,
          processes=[_proc("command", 70, 3.0, 960, cpu_exact=True)])
    s = metrics.summarize(blind)
    assert s["samples"] == 960 and s["warnings"] == []


def test_the_example_sweep_counts_both_workloads_alike(tmp_path):
    pytest.importorskip("torchvision")
    root = os.path.join(os.path.dirname(__file__), "..", "..", "metrics")
    for name in ("sweep_example.csv", "sweep_trial.py"):
        with open(os.path.join(root, name)) as src, open(tmp_path / name, "w") as dst:
            dst.write(src.read())
    r = subprocess.run([sys.executable, "-m", "batchcast", "track", "--out", str(tmp_path / "o"),
                        "--file", str(tmp_path / "sweep_example.csv")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("workload baseline: 1024 samples") == 1, r.stderr
    assert r.stderr.count("workload shared: 1024 samples") == 1, r.stderr
    assert "omitted" not in r.stderr, r.stderr  # what the machine cannot measure: the report
    shared = metrics.summarize(tmp_path / "o" / "sweep" / "shared")
    assert shared["warnings"] == []
    (producer,) = [p for p in shared["processes"] if p["role"] == "server"]
    assert producer["cpu_core_s"] > 0
    # The producer outlived the trial that started it, or was reaped by its track: either way
    # its CPU is in the total once.
    left = {p["pid"] for p in shared["processes"]
            if p.get("id") == metrics.ADOPTED and not p["cpu_exact"]}
    expected = sum(p["cpu_core_s"] for p in shared["processes"]
                   if p["role"] == "command" and p["pid"] not in left)
    if producer["pid"] in left:
        expected += producer["cpu_core_s"]
    assert shared["cpu_core_s"]["all"] == pytest.approx(expected)


def test_savings_three_ways():
    base = {"cpu_core_s_per_sample": {"all": 0.010}, "joules_per_sample": {"all": 2.0},
            "samples_per_s": 800.0}
    shared = {"cpu_core_s_per_sample": {"all": 0.004}, "joules_per_sample": {"all": 1.5},
              "samples_per_s": 1000.0}
    got = metrics.savings(shared, base)
    assert got["cpu_core_s_per_sample"] == pytest.approx(0.006)
    assert got["joules_per_sample"] == pytest.approx(0.5)
    assert got["cores"] == pytest.approx(6.0)  # 6 core-ms per sample at 1000 samples/s
    assert metrics.savings(dict(shared, joules_per_sample={"all": None}), base)[
        "joules_per_sample"] is None


def test_report_compares_a_run_tree_and_an_mlflow_run(tmp_path):
    r = track(tmp_path, "--experiment", "x", "--workload", "w", "--run-name", "a",
              "--interval", "0.2", "--samples", "10", "--", PY, "-c", "sum(range(10**6))")
    assert r.returncode == 0, r.stderr
    store = tmp_path / "mlruns"
    exp_id = next(e for e in os.listdir(store) if e not in ("0", ".trash")
                  and os.path.isdir(store / e))
    (mlflow_run,) = [store / exp_id / d for d in os.listdir(store / exp_id)
                     if (store / exp_id / d / "params" / "command").exists()]
    index = report.render([str(tmp_path / "x" / "w"), str(mlflow_run)], str(tmp_path / "rep"))
    page = open(index).read()
    assert "J/sample" in page and "saved vs first: CPU cores" in page and "run-queue" in page
    assert (tmp_path / "rep" / "comparison.png").stat().st_size > 1000
    s = metrics.summarize(mlflow_run)
    assert s["samples"] == 10 and s["cpu_core_s"]["all"] > 0


def test_collocation_mode_is_detected():
    assert metrics.collocation_mode() in {"none", "time-slicing", "mps", "mig"}
    assert metrics.collocation_mode("/nonexistent/libnvidia-ml.so.1") == "none"  # no GPU


def test_sigterm_reaches_the_command_and_sigint_stays_default(tmp_path):
    flag = tmp_path / "started"
    code = ("import signal, sys, time\n"
            "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
            f"open({str(flag)!r}, 'w').close()\n"
            "time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-m", "batchcast", "track", "--out", str(tmp_path),
                          "--no-gpu", "--run-name", "term", "--", PY, "-c", code],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 7
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate()
    s = metrics.summarize(tmp_path / "batchcast" / "default" / "term")
    assert s["complete"]
