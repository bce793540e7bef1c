"""The examples run as a user runs them (examples/README.md), with the installed package: its
environment's `python` and `batchcast` first on PATH, as after `source .venv/bin/activate` or
in the venv or conda env where a user ran `pip install .`."""

import os
import re
import subprocess
import sys

from batchcast.dataloader import share_paths
from conftest import watch_endpoint

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def activated() -> dict:
    """The environment of a shell where this interpreter's environment is activated."""
    bin_dir = os.path.dirname(sys.executable)
    return dict(os.environ, PATH=os.pathsep.join([bin_dir, os.environ.get("PATH", "")]))


def readme_commands() -> list:
    """The command lines examples/README.md shows (its indented code lines)."""
    with open(os.path.join(ROOT, "examples", "README.md")) as f:
        return [line.strip() for line in f if re.match(r" {6}\S", line)]


def test_the_readme_runs_the_examples_as_a_pip_user_can():
    commands = readme_commands()
    assert commands and all(re.match(r"(python|bash) examples/", c) for c in commands), commands


def test_two_train_shared_copies_run_as_the_readme_says(tmp_path):
    watch_endpoint(share_paths("train-shared-example")["endpoint"])
    pair = [c for c in readme_commands() if "train_shared.py" in c]
    script = "\n".join(pair) + "\n"
    p = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=activated(), stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    for lr in ("0.01", "0.05"):
        assert f"lr {lr} epoch 1:" in p.stdout, p.stdout + p.stderr


def test_standalone_server_with_a_folder_of_its_own_classes(tmp_path, batchcast_cli):
    # A folder with 3 classes: the trainers' model must have 3 outputs (labels 0..2), not the
    # 4 of the dataset the script makes when given no folder.
    data = tmp_path / "data"
    made = subprocess.run([batchcast_cli, "make-dataset", "--out", str(data), "--classes", "3",
                           "--per-class", "4"], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    p = subprocess.run(["bash", os.path.join(ROOT, "examples", "standalone_server.sh"),
                        str(data)], capture_output=True, text=True, timeout=300,
                       env=activated(), stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "IndexError" not in p.stderr and "Traceback" not in p.stderr, p.stderr
    for lr in ("0.01", "0.05"):
        assert f"lr {lr} epoch 1:" in p.stdout, p.stdout
    assert "server exited with 0" in p.stdout, p.stdout


def test_metrics_readme_serve_line_uses_real_options(batchcast_cli):
    with open(os.path.join(ROOT, "metrics", "README.md")) as f:
        line = next(l for l in f if "-- batchcast serve" in l)
    args = line.split("-- batchcast serve", 1)[1].split("&")[0].split()
    options = [a for a in args if a.startswith("--")]
    assert "--data" in options, line  # a folder is given as --data, not positionally
    help_text = subprocess.run([batchcast_cli, "serve", "--help"], capture_output=True,
                               text=True, timeout=60).stdout
    for option in options:
        assert f" {option} " in help_text, (option, line)
    # Every value follows an option: nothing positional (serve takes none).
    assert all(a.startswith("--") or args[i - 1].startswith("--") for i, a in enumerate(args)), line
