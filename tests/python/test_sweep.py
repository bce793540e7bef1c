"""``batchcast sweep`` end to end, with real trials: Python scripts reading a tiny JPEG
ImageFolder through ``batchcast.DataLoader(share="train")`` (sweep_common.TRIAL), real share
producers, real signals.

A grid's trials run in order, every one of them sharing the sweep's stream (one key of the
sweep's scope; the image size a view of it), their samples in summary.json; with
--share-dataloaders an unchanged script's shuffled torch DataLoader joins it, its other loaders
stay torch's, each saying so in one line, and without it that loader stays torch's, counted; a trials file gives one trial per line; a crashing
trial is recorded and its slot goes to the next; SIGTERM stops every trial (one that ignores
SIGTERM too) and the share producer, leaving nothing in /tmp nor /dev/shm, and a sweep killed
outright takes its trials with it; --resume runs only the trials that did not finish. No
assertion on durations.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from sweep_common import (IMAGES, STARTUP_S, make_folder, python, run_sweep, scope_leftovers,
                          scope_processes, start_sweep, summary, write_trial)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    make_folder(str(root / "data"))
    write_trial(str(root))
    return str(root)


def trial_command(folder: str, size: str, epochs: str, mode: str) -> list:
    return [python(), os.path.join(folder, "trial.py"), os.path.join(folder, "data"), size,
            epochs, mode]


def test_a_grid_runs_every_combination_in_order_on_one_shared_stream(folder, batchcast_cli,
                                                                   tmp_path):
    out = str(tmp_path / "out")
    done = run_sweep(batchcast_cli, ["--slots", "2", "--out", out, "--",
                                     *trial_command(folder, "{24,32}", "2", "{a,b}")])
    assert done.returncode == 0, done.stderr + done.stdout
    s = summary(out)
    trials = s["trials"]
    assert [t["command"][3:] for t in trials] == [
        ["24", "2", "a"], ["24", "2", "b"], ["32", "2", "a"], ["32", "2", "b"]]
    assert [t["params"] for t in trials] == [
        {"arg3": size, "arg5": mode} for size in ("24", "32") for mode in "ab"]
    for t in trials:
        assert t["exit_code"] == 0 and t["state"] == "finished", t
        assert t["samples"] == 2 * IMAGES, t
        assert t["samples_per_s"] > 0 and t["end"] >= t["start"]
        assert t["gpu"] is None
        with open(t["log"]) as f:
            assert f"samples {2 * IMAGES}" in f.read()
    # One stream: every producer the sweep saw served the one scoped key (the two sizes are
    # views of it); nothing of the scope is left in /tmp nor /dev/shm.
    data = s["data"]
    keys = {p["key"] for p in data["producers"]}
    assert len(keys) == 1 and next(iter(keys)).startswith("train."), data
    assert data["samples_consumed"] == 4 * 2 * IMAGES
    # The producers made their samples through the decoded cache (the sweep's default): what was
    # decoded from its files is its misses (every image fits), each image at least once; the
    # rest were crops of it.
    assert data["cache"] is not None, data
    assert data["samples_decoded"] == data["cache"]["misses"] >= IMAGES, data
    assert data["cache"]["hits"] > 0, data
    assert data["gpu_joules"] is None  # no GPU here
    with open(s["sweep"]["plot"], "rb") as f:  # the sweep's plot
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert s["sweep"]["plot"] == os.path.join(out, "sweep.png")
    assert scope_leftovers(s["sweep"]["id"], data["producers"]) == []
    # Not a terminal: plain lines, one per trial and state.
    assert "trial  gpu  state" in done.stdout
    assert done.stdout.count("finished") >= 4


def plain_sweep(folder: str, batchcast_cli: str, out: str, *options: str, slots: int = 2
                ) -> tuple:
    """The sweep of sweep_common.PLAIN (an unchanged script) at 24 and 32 px, 2 epochs, in
    ``slots`` slots: its summary and each trial's log."""
    done = run_sweep(batchcast_cli, [*options, "--slots", str(slots), "--out", out, "--", python(),
                                     os.path.join(folder, "plain.py"),
                                     os.path.join(folder, "data"), "{24,32}", "2"])
    assert done.returncode == 0, done.stderr + done.stdout
    s = summary(out)
    logs = []
    for t in s["trials"]:
        with open(t["log"]) as f:
            logs.append(f.read())
    return s, logs


def assert_rate_leaves_out_startup(trial: dict) -> None:
    """A trial's samples_per_s is over its reading time: PLAIN's start-up (STARTUP_S before its
    first epoch) is not in it, though it is in the trial's start..end."""
    reading_s = trial["samples"] / trial["samples_per_s"]
    assert reading_s <= trial["end"] - trial["start"] - STARTUP_S + 0.01, trial


def test_share_dataloaders_swaps_an_unchanged_scripts_training_loader(folder, batchcast_cli,
                                                                     tmp_path):
    s, logs = plain_sweep(folder, batchcast_cli, str(tmp_path / "out"), "--share-dataloaders")
    for t, log in zip(s["trials"], logs):
        assert "training loader: batchcast.dataloader True" in log
        assert "evaluation loader: torch.utils.data.dataloader" in log
        # One line per loader: what it became, or why not.
        said = [line for line in log.splitlines() if line.startswith("batchcast sweep:")]
        assert len(said) == 3, log
        assert "joins the sweep's stream" in said[0]
        assert "not shuffled" in said[1] and "list left as torch's" in said[2]
        assert t["samples"] == 2 * IMAGES
        assert_rate_leaves_out_startup(t)
    keys = {p["key"] for p in s["data"]["producers"]}
    assert len(keys) == 1 and next(iter(keys)).startswith("dataloader."), keys
    assert scope_leftovers(s["sweep"]["id"], s["data"]["producers"]) == []


def test_trials_one_after_another_read_one_stream_and_its_cache(folder, batchcast_cli, tmp_path):
    # One slot: the second trial starts after the first one ended. The stream's producer serves
    # for the whole sweep, so the second reads the first one's decoded cache: each image is
    # decoded once in the sweep, not once per trial.
    s, _ = plain_sweep(folder, batchcast_cli, str(tmp_path / "out"), "--share-dataloaders",
                       slots=1)
    assert [t["exit_code"] for t in s["trials"]] == [0, 0]
    assert s["trials"][1]["start"] >= s["trials"][0]["end"]
    assert len(s["data"]["producers"]) == 1, s["data"]["producers"]
    assert s["data"]["cache"]["misses"] == IMAGES, s["data"]
    assert s["data"]["cache"]["hits"] >= 3 * IMAGES, s["data"]
    assert scope_leftovers(s["sweep"]["id"], s["data"]["producers"]) == []


def test_without_share_dataloaders_a_scripts_training_loader_is_counted(folder, batchcast_cli,
                                                                        tmp_path):
    s, logs = plain_sweep(folder, batchcast_cli, str(tmp_path / "out"))
    for t, log in zip(s["trials"], logs):
        # torch's own loader, untouched and silent; its evaluation loader is not counted.
        assert "training loader: torch.utils.data.dataloader True" in log
        assert not [x for x in log.splitlines() if x.startswith("batchcast sweep:")], log
        assert "samples 24" in log
        assert t["samples"] == 2 * IMAGES and t["epochs"] == 2, t
        assert t["wait_percent"] is not None and t["samples_per_s"] > 0
        assert_rate_leaves_out_startup(t)
    assert s["data"]["samples_consumed"] == 4 * IMAGES
    assert s["data"]["producers"] == []  # nothing was shared


def test_a_trials_file_gives_one_trial_per_line(folder, batchcast_cli, tmp_path):
    trials = tmp_path / "trials.txt"
    data = os.path.join(folder, "data")
    trials.write_text(f"# size epochs mode\n{data} 24 1 a\n\n{data} 32 1 b  # the second\n")
    out = str(tmp_path / "out")
    done = run_sweep(batchcast_cli, ["--trials", str(trials), "--slots", "2", "--out", out,
                                     "--", python(), os.path.join(folder, "trial.py")])
    assert done.returncode == 0, done.stderr + done.stdout
    trials_run = summary(out)["trials"]
    assert [t["command"][3:] for t in trials_run] == [["24", "1", "a"], ["32", "1", "b"]]
    assert [t["samples"] for t in trials_run] == [IMAGES, IMAGES]


def test_a_crashing_trial_is_recorded_and_its_slot_goes_to_the_next(folder, batchcast_cli,
                                                                    tmp_path):
    out = str(tmp_path / "out")
    done = run_sweep(batchcast_cli, ["--slots", "1", "--out", out, "--",
                                     *trial_command(folder, "24", "1", "{a,crash,b}")])
    assert done.returncode == 1, done.stderr + done.stdout
    s = summary(out)
    ok, crashed, after = s["trials"]
    assert (ok["exit_code"], crashed["exit_code"], after["exit_code"]) == (0, 3, 0)
    assert crashed["state"] == "failed"
    assert any("boom: this trial crashes on purpose" in line for line in crashed["last_lines"])
    assert after["start"] >= crashed["end"]  # one slot: the next trial got it
    assert after["samples"] == IMAGES
    assert "2 of 3 trials finished" in done.stdout
    assert scope_leftovers(s["sweep"]["id"], s["data"]["producers"]) == []


def wait_for(predicate, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_sigterm_stops_every_trial_and_the_share_producer(folder, batchcast_cli, tmp_path):
    out, hold = str(tmp_path / "out"), tmp_path / "held"
    hold.mkdir()
    sweep = start_sweep(batchcast_cli, ["--slots", "2", "--out", out, "--",
                                        *trial_command(folder, "24", "1", "{hold,hold-hard}")],
                        env=dict(os.environ, HOLD_DIR=str(hold)))
    try:
        wait_for(lambda: len(os.listdir(hold)) == 2, "both trials to hold the stream")
        trials = [int(p) for p in os.listdir(hold)]
        producers = scope_processes(summary(out)["sweep"]["id"])
        assert producers, "the trials read a share producer of the sweep's scope"
        sweep.send_signal(signal.SIGTERM)
        _, err = sweep.communicate(timeout=120)
    finally:
        if sweep.poll() is None:
            sweep.kill()  # its trials die with it
            sweep.wait()
    assert sweep.returncode == 128 + signal.SIGTERM, err
    s = summary(out)
    assert s["sweep"]["stopped_by"] == signal.SIGTERM
    assert [t["state"] for t in s["trials"]] == ["stopped", "stopped"]
    assert not [pid for pid in trials + producers if alive(pid)]
    assert scope_leftovers(s["sweep"]["id"], s["data"]["producers"]) == []


def test_a_sweep_killed_outright_takes_its_trials_with_it(folder, batchcast_cli, tmp_path):
    out, hold = str(tmp_path / "out"), tmp_path / "held"
    hold.mkdir()
    sweep = start_sweep(batchcast_cli, ["--slots", "2", "--out", out, "--",
                                        *trial_command(folder, "24", "1", "{hold,hold-hard}")],
                        env=dict(os.environ, HOLD_DIR=str(hold)))
    try:
        wait_for(lambda: len(os.listdir(hold)) == 2, "both trials to hold the stream")
        scope = summary(out)["sweep"]["id"]
    finally:
        sweep.kill()  # no chance to stop anything itself
        sweep.communicate()
    trials = [int(p) for p in os.listdir(hold)]
    wait_for(lambda: not [pid for pid in trials if alive(pid)], "the trials to be killed")
    # Their share producer exits once they are gone (a second's grace: the sweep it would wait
    # for is gone too), removing its pool and socket; only its log (and a failure record) stay
    # in /tmp, as no sweep is left to move it. Well under SWEEP_LINGER_S: it did not wait.
    wait_for(lambda: not scope_processes(scope), "the share producer to exit", timeout=20)
    prefix = f"batchcast-{os.getuid()}-{scope}."
    left = [n for n in os.listdir("/tmp") if n.startswith(prefix)]
    for name in left:
        os.unlink(os.path.join("/tmp", name))
    assert all(n.endswith((".log", ".failed")) for n in left), left


def test_resume_runs_only_the_trials_that_did_not_finish(batchcast_cli, tmp_path):
    fixed = tmp_path / "fixed"
    script = ("import os, sys; print('ran', sys.argv[1]); "
              f"sys.exit(0 if sys.argv[1] == 'a' or os.path.exists({str(fixed)!r}) else 5)")
    out = str(tmp_path / "out")
    first = run_sweep(batchcast_cli, ["--slots", "2", "--out", out, "--", python(), "-c",
                                      script, "{a,b}"])
    assert first.returncode == 1
    assert [t["exit_code"] for t in summary(out)["trials"]] == [0, 5]
    fixed.touch()
    again = run_sweep(batchcast_cli, ["--resume", "--out", out])
    assert again.returncode == 0, again.stderr + again.stdout
    a, b = summary(out)["trials"]
    assert (a["exit_code"], b["exit_code"]) == (0, 0)
    with open(a["log"]) as f:
        assert f.read().count("ran a") == 1  # not run again
    with open(b["log"]) as f:
        assert f.read().count("ran b") == 2


def test_track_makes_each_trial_an_mlflow_run(batchcast_cli, tmp_path):
    out = str(tmp_path / "out")
    done = run_sweep(batchcast_cli, ["--track", "--slots", "2", "--out", out, "--", python(),
                                     "-c", "import sys; sys.exit(int(sys.argv[1]))", "{0,3}"])
    assert done.returncode == 1, done.stderr + done.stdout
    s = summary(out)
    assert [t["exit_code"] for t in s["trials"]] == [0, 3]  # the command's, through track
    runs = {}
    for top, _, files in os.walk(s["sweep"]["mlflow"]):
        param = os.path.join(os.path.dirname(top), "params", "arg3")
        if os.path.basename(top) == "tags" and os.path.exists(param):  # a trial's, not its parent's
            with open(os.path.join(top, "mlflow.runName")) as f, open(param) as g:
                runs[f.read().split("-")[0]] = g.read()
    assert runs == {"t000": "0", "t001": "3"}


def test_share_memory_reaches_every_trial(batchcast_cli, tmp_path):
    """--share-memory is each trial's DataLoader(share=) default (test_share_memory.py shows
    what the drop-in makes of it)."""
    out = str(tmp_path / "out")
    show = "import os; print('memory', os.environ['BATCHCAST_SHARE_MEMORY'])"
    done = run_sweep(batchcast_cli, ["--slots", "1", "--share-memory", "2MiB", "--out", out,
                                     "--", python(), "-c", show])
    assert done.returncode == 0, done.stderr + done.stdout
    (trial,) = summary(out)["trials"]
    with open(trial["log"]) as f:
        assert f"memory {2 << 20}" in f.read()
