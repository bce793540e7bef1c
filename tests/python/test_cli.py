"""The `batchcast` program's command line, run as a real subprocess: what a user typing it relies
on. Bad choices are errors that list the valid ones; --version works on every command; global
options work after the subcommand; options in conflict are errors that name the fix; `report`
and `bench` point to the Python package; SIGHUP stops a server as cleanly as SIGTERM."""

import os
import re
import signal
import subprocess

import pytest

import batchcast

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def run(argv, timeout=60):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def project_version() -> str:
    """The one source of the version: CMake's project(VERSION)."""
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(batchcast VERSION ([0-9.]+)", f.read()).group(1)


@pytest.mark.parametrize(
    "option, value, valid",
    [
        ("--decoder", "gpu", ["cpu", "mixed", "nvjpeg"]),
        ("--output", "float64", ["bfloat16", "float16", "float32", "uint8"]),
        ("--on-error", "ignore", ["raise", "skip"]),
        ("--stall-policy", "drop", ["decouple", "skip", "wait"]),
        ("--device", "tpu:0", ["cpu", "cuda"]),
        ("--log-level", "verbose", ["critical", "debug", "error", "info", "off", "trace", "warn"]),
    ],
)
def test_a_bad_choice_is_an_error_naming_the_valid_choices(batchcast_bin, option, value, valid):
    p = run([batchcast_bin, "serve", "--synthetic", "10", option, value])
    assert p.returncode == 2, p.stderr
    assert option in p.stderr and value in p.stderr, p.stderr
    assert "{" + ",".join(valid) + "}" in p.stderr, p.stderr


def test_serve_takes_rank_and_world_size_from_the_torchrun_environment(batchcast_bin):
    env = dict(os.environ, RANK="3", WORLD_SIZE="2")
    p = subprocess.run([batchcast_bin, "serve", "--synthetic", "10"], capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL, env=env)
    assert p.returncode != 0 and "--rank 3 must be below --world-size 2" in p.stderr, p.stderr


def test_a_malformed_device_index_names_the_form(batchcast_bin):
    p = run([batchcast_bin, "serve", "--synthetic", "10", "--device", "cuda:x"])
    assert p.returncode == 2
    assert "cuda:K" in p.stderr, p.stderr


@pytest.mark.parametrize("command", [[], ["serve"], ["make-dataset"], ["track"], ["report"],
                                     ["bench"], ["sweep"]])
def test_version_on_every_command(batchcast_bin, command):
    p = run([batchcast_bin, *command, "--version"])
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"batchcast {project_version()}"


def test_help_lists_every_command_and_says_where_the_python_ones_live(batchcast_cli):
    # The console script a user types: it execs the package's native program, which still
    # calls itself `batchcast`, not .../site-packages/batchcast/_bin/batchcast.
    p = run([batchcast_cli, "--help"])
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("batchcast: one shared data-loading server"), p.stdout
    assert "Usage: batchcast [OPTIONS] SUBCOMMAND" in p.stdout, p.stdout
    assert "_bin" not in p.stdout and "site-packages" not in p.stdout, p.stdout
    listed = re.findall(r"^  (\S+)\s", p.stdout.split("Subcommands:")[1], re.M)
    assert listed == ["serve", "make-dataset", "track", "report", "bench", "sweep"], p.stdout
    assert p.stdout.count("Python package") == 4, p.stdout


def test_serve_help_groups_its_options(batchcast_cli):
    p = run([batchcast_cli, "serve", "--help"])
    assert p.returncode == 0, p.stderr
    assert "Usage: batchcast serve [OPTIONS]" in p.stdout, p.stdout
    headers = re.findall(r"^(\S[^:\n]*):$", p.stdout, re.M)
    assert headers == ["Options", "Data", "Stream", "Pipeline", "GPU", "Metrics and logs"], p.stdout
    sections = dict(zip(headers, re.split(r"^\S[^:\n]*:$", p.stdout, flags=re.M)[1:]))
    for header, options in [("Data", ["--data", "--synthetic", "--on-error"]),
                            ("Stream", ["--endpoint", "--batch-size", "--epochs", "--ring"]),
                            ("Pipeline", ["--image-size", "--mean", "--output"]),
                            ("GPU", ["--device", "--decoder"]),
                            ("Metrics and logs", ["--metrics-dir", "--status-interval"])]:
        for option in options:
            assert re.search(rf"^\s+{option}\b", sections[header], re.M), (header, option)


@pytest.mark.parametrize("option, value, rule", [
    ("--batch-size", "0", "must be greater than 0 (got 0)"),
    ("--workers", "-1", "must be greater than 0 (got -1)"),
    ("--status-interval", "-2", "must be 0 or more (got -2)"),
])
def test_an_out_of_range_number_says_the_rule_in_words(batchcast_bin, option, value, rule):
    p = run([batchcast_bin, "serve", "--synthetic", "10", option, value])
    assert p.returncode == 2, p.stderr
    assert f"{option}: {rule}" in p.stderr, p.stderr
    assert not re.search(r"\d{20}", p.stderr), p.stderr  # no limit of a double spelled out


@pytest.mark.parametrize("argv, said", [
    (["frobnicate"], "batchcast: unknown command 'frobnicate': the commands are serve, "
                     "make-dataset, track, report, bench, sweep"),
    ([], "batchcast: give a command: serve, make-dataset, track, report, bench, sweep"),
])
def test_an_unknown_or_missing_command_names_the_commands(batchcast_cli, argv, said):
    p = run([batchcast_cli, *argv])
    assert p.returncode == 2, p.stderr
    assert said in p.stderr, p.stderr
    assert "A subcommand is required" not in p.stderr


@pytest.mark.parametrize("command", [["report", "runs/a", "--out", "x"], ["bench", "--quick"],
                                     ["track", "--workload", "w"], ["sweep", "--slots", "2"]])
def test_the_python_commands_point_to_the_python_package(batchcast_bin, command):
    p = run([batchcast_bin, *command])
    assert p.returncode == 2
    name = command[0]
    assert f"batchcast {name} is part of the Python package: run `python3 -m batchcast {name} ...`" in p.stderr
    assert "pip install puts a `batchcast` command on PATH" in p.stderr


@pytest.mark.parametrize(
    "args, fix",
    [
        ([], "give exactly one of --data DIR, --file-list FILE or --synthetic N"),
        (["--synthetic", "10", "--rank", "2", "--world-size", "2"], "lower --rank or raise --world-size"),
        (["--synthetic", "10", "--decoder", "nvjpeg"], "drop --decoder nvjpeg"),
        (["--synthetic", "10", "--decoder", "mixed"], "drop --decoder mixed"),
        (["--data", ROOT, "--decoder", "mixed"], "--decoder mixed decodes into a GPU pool: add --device cuda:K"),
        (["--data", ROOT, "--decoder", "nvjpeg"], "add --device cuda:K"),
    ],
)
def test_options_in_conflict_are_an_error_naming_the_fix(batchcast_bin, args, fix):
    p = run([batchcast_bin, "serve", *args])
    assert p.returncode == 2
    assert fix in p.stderr, p.stderr


def test_an_unknown_log_level_after_the_subcommand_is_an_error(batchcast_bin):
    p = run([batchcast_bin, "serve", "--synthetic", "10", "--log-level", "loud"])
    assert p.returncode == 2
    assert "loud not in {critical,debug,error,info,off,trace,warn}" in p.stderr, p.stderr


@pytest.mark.parametrize("level, logged", [(None, True), ("warn", False)])
def test_log_level_after_the_subcommand_takes_effect_and_sighup_stops_cleanly(
    endpoint, batchcast_bin, level, logged
):
    extra = ["--status-interval", "0"] + (["--log-level", level] if level else [])
    with batchcast.serve(endpoint=endpoint, synthetic=100, epochs=None, extra_args=extra) as server:
        server.process.send_signal(signal.SIGHUP)
        assert server.wait(timeout=30) == 0, server.log_tail()
        log = server.log_tail(100)
    # Info lines are there only at the default level; the no_leaks fixture checks that the
    # pool segment and the ipc socket file are gone.
    assert ("received SIGHUP: shutting down" in log) == logged, log
    assert ("done:" in log) == logged, log


@pytest.mark.parametrize("argv_level, env_level, traced", [
    (None, "debug", True), ("info", "debug", False), (None, None, False)])
def test_the_stall_trace_is_at_debug_level_from_the_flag_or_spdlog_level(
    endpoint, monkeypatch, argv_level, env_level, traced
):
    """SPDLOG_LEVEL sets the level where --log-level is not given (a share producer's user has
    no flag): at debug the server says once a second what each reader holds (docs/stream.md)."""
    if env_level:
        monkeypatch.setenv("SPDLOG_LEVEL", env_level)
    else:
        monkeypatch.delenv("SPDLOG_LEVEL", raising=False)
    # A ring of 4 slots: the stream cannot be made whole before the Loader reads it.
    extra = ["--ring", "4"] + (["--log-level", argv_level] if argv_level else [])
    with batchcast.serve(endpoint=endpoint, synthetic=64, batch_size=8, epochs=3,
                         extra_args=extra) as server:
        with batchcast.Loader(endpoint, timeout=30) as loader:
            for _ in range(3):
                for _ in loader:
                    pass
        assert server.wait(timeout=30) == 0, server.log_tail()
        log = server.log_tail(400)
    assert ("stalls: producer" in log and "consumer 1: next" in log) == traced, log
