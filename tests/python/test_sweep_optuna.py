"""``batchcast sweep --optuna``: trials asked of an Optuna study (Debian's python3-optuna,
scripts/setup.sh installs it) through its ask-and-tell interface, the search space declared in
the command, the objective reported by the trial.

Two sweep processes on one machine share a sqlite storage, as the nodes of a Slurm job share
one: the study ends with N complete trials in all, none run twice, each told the objective its
trial printed (or wrote to $BATCHCAST_OBJECTIVE_FILE). A trial that fails is told FAIL. A
search space that cannot be read is refused before anything starts.
"""

from __future__ import annotations

import os

import optuna
import pytest

from sweep_common import python, run_sweep, start_sweep, summary

# The objective: a function of the suggested values, reported one way or the other.
TRIAL = ("import os, sys; lr, bs, how = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]; "
         "value = (lr - 0.01) ** 2 + bs / 1000; "
         "sys.exit(4) if lr > 0.05 and how == 'fail' else None; "
         "print('batchcast-objective:', value) if how != 'file' else "
         "open(os.environ['BATCHCAST_OBJECTIVE_FILE'], 'w').write(repr(value))")


def space(how: str) -> list:
    return [python(), "-c", TRIAL, "{lr:1e-4..1e-1:log}", "{bs:32,64}", how]


@pytest.mark.parametrize("how", ["line", "file"])
def test_two_sweeps_on_one_storage_run_n_trials_in_all_none_twice(how, batchcast_cli,
                                                                   tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    args = ["--optuna", "s", "--storage", storage, "--n-trials", "5", "--slots", "2"]
    first = start_sweep(batchcast_cli, [*args, "--out", str(tmp_path / "a"), "--", *space(how)])
    second = run_sweep(batchcast_cli, [*args, "--out", str(tmp_path / "b"), "--", *space(how)])
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0 and second.returncode == 0, err + second.stderr
    ran = [t for node in "ab" for t in summary(str(tmp_path / node))["trials"]]
    assert sorted(t["optuna_trial"] for t in ran) == [0, 1, 2, 3, 4]  # each once, N in all
    study = optuna.load_study(study_name="s", storage=storage)
    done = {t.number: t for t in study.trials if t.state.name == "COMPLETE"}
    assert sorted(done) == [0, 1, 2, 3, 4]
    for t in ran:
        trial = done[t["optuna_trial"]]
        lr, bs = trial.params["lr"], trial.params["bs"]
        assert 1e-4 <= lr <= 1e-1 and bs in (32, 64)
        assert t["command"][3:5] == [str(lr), str(bs)]
        assert trial.value == pytest.approx((lr - 0.01) ** 2 + bs / 1000)
        assert t["objective"] == pytest.approx(trial.value)
    # Beyond the N run, only the trials a process asked for as the other filled the study:
    # told FAIL at once, never run.
    assert all(t.state.name == "FAIL" for t in study.trials if t.number >= 5)


def test_a_failed_trial_is_told_fail(batchcast_cli, tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    done = run_sweep(batchcast_cli, ["--optuna", "s", "--storage", storage, "--n-trials", "6",
                                     "--slots", "2", "--out", str(tmp_path / "o"), "--",
                                     python(), "-c", TRIAL, "{lr:0.06..0.09}", "{bs:32,64}",
                                     "fail"])
    assert done.returncode == 1
    study = optuna.load_study(study_name="s", storage=storage)
    assert [t.state.name for t in study.trials] == ["FAIL"] * 6
    assert all(t["exit_code"] == 4 and t["objective"] is None
               for t in summary(str(tmp_path / "o"))["trials"])


@pytest.mark.parametrize("args, message", [
    (["--", "true", "{lr:1e-4..1e-1:log}"], "declares an Optuna search space"),
    (["--optuna", "s", "--", "true", "{lr:1..2}"], "needs --storage URL"),
    (["--optuna", "s", "--storage", "sqlite:///S", "--n-trials", "2", "--", "true", "x"],
     "the command declares no search space"),
    (["--optuna", "s", "--storage", "sqlite:///S", "--n-trials", "2", "--", "true",
      "{lr:1..2}", "{a,b}"], "with --optuna every value set is named"),
    (["--optuna", "s", "--storage", "sqlite:///S", "--n-trials", "2", "--", "true",
      "{lr:0..1:log}"], "above 0 on a log scale"),
    (["--optuna", "s", "--storage", "sqlite:///S", "--n-trials", "0", "--", "true",
      "{lr:1..2}"], "--n-trials 0: give 1 or more"),
])
def test_a_search_space_that_cannot_be_read_is_refused(args, message, batchcast_cli, tmp_path):
    args = [a.replace("sqlite:///S", f"sqlite:///{tmp_path / 'study.db'}") for a in args]
    cut = args.index("--")
    out = tmp_path / "out"
    done = run_sweep(batchcast_cli, [*args[:cut], "--out", str(out), *args[cut:]])
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
    assert not os.path.exists(out / "summary.json")
