"""``batchcast sweep``: bad input stops before anything starts, and placement on GPUs.

Bad input (a grid with no trial, --per-gpu 0, a GPU that does not exist, a command not found, an
unwritable --out, --resume of a folder that is not a sweep's, an order that is none) exits 2 with a
message naming it, and no trial ran. Placement and collocation on a machine's GPUs use stand-ins
for the driver's tools on PATH (the machine's own are hidden, so a GPU machine runs them alike):
``nvidia-smi`` listing two GPUs (or MIG instances), and ``nvidia-cuda-mps-control``, which
records its start and its ``quit``:
each trial gets its slot's GPU as CUDA_VISIBLE_DEVICES, --per-gpu trials at once on it, the
MPS daemon's folders in its environment, and the daemon is told to quit when the sweep ends;
under time-slicing its share producers serve GPU pools in chunks of at least 512 samples.
"""

from __future__ import annotations

import io
import json
import os
import stat

import pytest

from batchcast._batchcast import PipelineOptions
from batchcast._share_producer import gpu_chunk
from batchcast._sweep_devices import visible_gpus
from batchcast._torchvision_plan import NativePlan
from batchcast._sweep_table import LiveTable
from batchcast._sweep_trials import expand_grid
from sweep_common import python, run_sweep, summary

SMI = """#!/bin/sh
if [ "$1" = "-L" ]; then
  printf 'GPU 0: Stand-in A (UUID: GPU-aaaa)\\nGPU 1: Stand-in B (UUID: GPU-bbbb)\\n'
elif [ "$1" = "--query-gpu=uuid,memory.used,memory.total" ]; then
  used=$(cat "$GPU_USED" 2>/dev/null || echo 100)
  printf 'GPU-aaaa, %s, 10000\\nGPU-bbbb, 100, 10000\\n' "$used"
else
  printf 'GPU-aaaa, Default\\nGPU-bbbb, %s\\n' "${SMI_MODE:-Default}"
fi
"""
MIG_SMI = """#!/bin/sh
printf 'GPU 0: Stand-in A (UUID: GPU-aaaa)\\n  MIG 1g.18gb     Device  0: (UUID: MIG-one)\\n'
printf '  MIG 1g.18gb     Device  1: (UUID: MIG-two)\\nGPU 1: Stand-in B (UUID: GPU-bbbb)\\n'
"""
# Started with -d: records its folders and exits 0 (a real one daemonises); given "quit" on
# stdin: records it.
MPS = """#!/bin/sh
if [ "$1" = "-d" ]; then
  [ -n "$MPS_FAIL" ] && { echo "An instance of this daemon is already running" >&2; exit 1; }
  echo "$CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY" > "$MPS_RECORD.started"; exit 0
fi
cat > "$MPS_RECORD.said"
"""
# A trial that records its environment, and how many trials were running alongside.
TRIAL = ("import json, os, sys, time; d = sys.argv[1]; "
         "open(os.path.join(d, 'running-' + sys.argv[2]), 'w').close(); time.sleep(0.5); "
         "json.dump({k: os.environ.get(k) for k in ('CUDA_VISIBLE_DEVICES', "
         "'CUDA_MPS_PIPE_DIRECTORY', 'BATCHCAST_SHARE_SCOPE', 'BATCHCAST_SHARE_GPU_CHUNK')}, "
         "open(os.path.join(d, sys.argv[2] + '.json'), 'w'))")


DRIVER_TOOLS = ("nvidia-smi", "nvidia-cuda-mps-control")


def tools(tmp_path, **scripts: str) -> dict:
    """An environment whose PATH is a folder holding ``scripts`` (name -> text), then the
    machine's PATH without its GPU driver's tools (links to everything else): the stand-ins are
    the only driver this sweep sees, on a GPU machine too."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in scripts.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    rest = tmp_path / "path"
    if not rest.exists():
        rest.mkdir()
        for folder in os.environ["PATH"].split(os.pathsep):
            for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
                if name not in DRIVER_TOOLS and not os.path.lexists(rest / name):
                    os.symlink(os.path.join(folder, name), rest / name)
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{rest}", MPS_RECORD=str(tmp_path / "mps"))


@pytest.mark.parametrize("args, message", [
    (["--slots", "1", "--", "{}"], "lists no value, so the grid has no trial"),
    (["--per-gpu", "0", "--", "true"], "--per-gpu 0: each GPU needs at least 1"),
    (["--per-gpu", "2", "--", "true"], "this process sees no GPU"),
    (["--per-gpu", "auto", "--", "true"], "this process sees no GPU"),
    (["--gpus", "5", "--", "true"], "GPU 5 does not exist"),
    (["--", "no-such-command-here", "{a,b}"], "command not found: 'no-such-command-here'"),
    (["--order", "sideways", "--", "true"], "invalid choice: 'sideways'"),
    (["--share-memory", "lots", "--", "true"], "--share-memory='lots': a positive number"),
])
def test_bad_input_stops_before_anything_starts(args, message, batchcast_cli, tmp_path):
    out = tmp_path / "out"
    cut = args.index("--")
    done = run_sweep(batchcast_cli, [*args[:cut], "--out", str(out), *args[cut:]],
                     env=tools(tmp_path))  # no GPU driver, whatever the machine has
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
    assert not os.path.exists(out / "summary.json")


def test_an_unwritable_out_and_a_folder_that_is_no_sweep_are_refused(batchcast_cli, tmp_path):
    marker = tmp_path / "ran"
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    done = run_sweep(batchcast_cli, ["--out", str(a_file / "out"), "--", "touch", str(marker)])
    assert done.returncode == 2 and "cannot write there" in done.stderr, done.stderr
    assert not marker.exists()
    (tmp_path / "other").mkdir()
    done = run_sweep(batchcast_cli, ["--resume", "--out", str(tmp_path / "other")])
    assert done.returncode == 2 and "not a sweep's folder" in done.stderr, done.stderr
    empty = tmp_path / "trials.txt"
    empty.write_text("# nothing\n")
    done = run_sweep(batchcast_cli, ["--trials", str(empty), "--", "touch"])
    assert done.returncode == 2 and "holds no trial" in done.stderr, done.stderr


def test_trials_run_per_gpu_on_their_gpu_under_a_private_mps_daemon(batchcast_cli, tmp_path):
    env = tools(tmp_path, **{"nvidia-smi": SMI, "nvidia-cuda-mps-control": MPS})
    seen = tmp_path / "seen"
    seen.mkdir()
    out = tmp_path / "out"
    done = run_sweep(batchcast_cli, ["--gpus", "1", "--per-gpu", "2", "--out", str(out), "--",
                                     python(), "-c", TRIAL, str(seen), "{t0,t1,t2}"], env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "collocation: MPS" in done.stdout
    s = summary(str(out))
    assert [t["gpu"] for t in s["trials"]] == [1, 1, 1]
    assert s["sweep"]["collocation"] == "mps" and s["sweep"]["slots"] == 2
    started = (tmp_path / "mps.started").read_text().split()
    assert started == [str(out / "mps" / "pipe"), str(out / "mps" / "log")]
    assert (tmp_path / "mps.said").read_text().strip() == "quit"  # stopped at the end
    for name in ("t0", "t1", "t2"):
        with open(seen / f"{name}.json") as f:
            trial_env = json.load(f)
        assert trial_env["CUDA_VISIBLE_DEVICES"] == "GPU-bbbb"
        assert trial_env["CUDA_MPS_PIPE_DIRECTORY"] == started[0]
        assert trial_env["BATCHCAST_SHARE_SCOPE"] == s["sweep"]["id"]
        assert trial_env["BATCHCAST_SHARE_GPU_CHUNK"] is None  # under MPS: chunks of a batch
    # Two slots: the third trial started only once one of the first two had ended.
    first_end = min(t["end"] for t in s["trials"][:2])
    assert s["trials"][2]["start"] >= first_end


# --per-gpu auto: the first trial takes 2000 MiB of GPU 0 (10000 MiB, 10 % headroom: 4 fit);
# the others wait at a barrier until 4 of them run at once (exit 1 if that never happens).
PACKED = ("import os, sys, time; d, name = sys.argv[1], sys.argv[2]\n"
          "if name == 'first':\n"
          "    open(os.environ['GPU_USED'], 'w').write('2100'); sys.exit(0)\n"
          "open(os.path.join(d, 'running-' + name), 'w').close()\n"
          "deadline = time.monotonic() + 120\n"
          "while len([f for f in os.listdir(d) if f.startswith('running-')]) < 4:\n"
          "    if time.monotonic() > deadline: sys.exit(1)\n"
          "    time.sleep(0.1)\n")


def test_per_gpu_auto_packs_by_the_first_trials_gpu_memory(batchcast_cli, tmp_path):
    env = dict(tools(tmp_path, **{"nvidia-smi": SMI}), GPU_USED=str(tmp_path / "used"))
    seen = tmp_path / "seen"
    seen.mkdir()
    out = tmp_path / "out"
    done = run_sweep(batchcast_cli, ["--gpus", "0", "--per-gpu", "auto", "--out", str(out),
                                     "--", python(), "-c", PACKED, str(seen),
                                     "{first,a,b,c,d}"], env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--per-gpu auto: trial t000 added 2000 MiB to GPU 0's memory at most" in done.stdout
    s = summary(str(out))
    assert s["sweep"]["per_gpu"] == {"0": 4} and s["sweep"]["slots"] == 4
    assert [t["exit_code"] for t in s["trials"]] == [0] * 5
    first_end = s["trials"][0]["end"]
    assert all(t["start"] >= first_end for t in s["trials"][1:])  # measured alone


@pytest.mark.parametrize("why, extra, line", [
    ("no daemon", {}, "nvidia-cuda-mps-control is not on PATH"),
    ("exclusive", {"SMI_MODE": "Exclusive_Process"}, "compute mode Exclusive_Process"),
    ("taken", {"MPS_FAIL": "1"}, "An instance of this daemon is already running"),
])
def test_auto_falls_back_to_time_slicing_saying_why(why, extra, line, batchcast_cli, tmp_path):
    scripts = {"nvidia-smi": SMI}
    if why != "no daemon":
        scripts["nvidia-cuda-mps-control"] = MPS
    env = dict(tools(tmp_path, **scripts), **extra)
    out, seen = tmp_path / "out", tmp_path / "seen"
    seen.mkdir()
    done = run_sweep(batchcast_cli, ["--out", str(out), "--", python(), "-c", TRIAL, str(seen),
                                     "{a,b}"], env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    said = [x for x in done.stdout.splitlines() if "collocation:" in x]
    assert len(said) == 1 and "time-slicing, as MPS cannot start" in said[0], said
    assert line in said[0]
    s = summary(str(out))
    assert s["sweep"]["collocation"] == "time-slicing" and s["sweep"]["slots"] == 4
    assert not (tmp_path / "mps.said").exists()
    for name in ("a", "b"):  # the trials' GPU streams come in chunks of at least 512 samples
        with open(seen / f"{name}.json") as f:
            assert json.load(f)["BATCHCAST_SHARE_GPU_CHUNK"] == "512"
    strict = run_sweep(batchcast_cli, ["--collocation", "mps", "--out", str(out / "x"), "--",
                                       "true"], env=env)
    assert strict.returncode == 2 and line in strict.stderr, strict.stderr


def test_mig_instances_count_as_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", tools(tmp_path, **{"nvidia-smi": MIG_SMI})["PATH"])
    gpus = visible_gpus({})
    picked = visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-bbbb,MIG-two"})
    assert [g.device for g in gpus] == ["MIG-one", "MIG-two", "GPU-bbbb"]
    assert [(g.index, g.device) for g in picked] == [(0, "GPU-bbbb"), (1, "MIG-two")]


def test_the_table_redraws_in_place_on_a_terminal():
    screen = io.StringIO()
    table = LiveTable(screen, tty=True)
    row = {"id": "t000", "gpu": 0, "state": "running", "params": {"lr": "0.1"},
           "samples_per_s": 120.0, "wait_percent": 3.0, "epochs": 1}
    table.draw([row])
    table.draw([dict(row, state="finished", exit_code=0)])
    text = screen.getvalue()
    assert text.count("\x1b[2F\x1b[J") == 1  # the second drawing replaced the first's 2 lines
    assert "finished" in text.rsplit("\x1b[J", 1)[1]


def test_a_grid_is_braces_with_commas_and_no_spaces():
    trials = expand_grid(["python", "-c", "print({'a': 1, 'b': 2})", "--lr={0.1,1e-3}",
                          "--model", "{resnet18,mobilenet}", "{x}"])
    assert [t.command[3:6] for t in trials] == [
        ["--lr=0.1", "--model", "resnet18"], ["--lr=0.1", "--model", "mobilenet"],
        ["--lr=1e-3", "--model", "resnet18"], ["--lr=1e-3", "--model", "mobilenet"]]
    assert trials[0].command[2] == "print({'a': 1, 'b': 2})" and trials[0].command[-1] == "{x}"
    assert trials[3].params == {"lr": "1e-3", "model": "mobilenet"}
    assert [t.id for t in trials] == ["t000", "t001", "t002", "t003"]


@pytest.mark.parametrize("device, batch, fewest, chunk", [
    ("cuda:0", 128, 512, 512), ("cuda:1", 100, 512, 600), ("cuda:0", 1024, 512, 1024),
    ("cuda:0", 128, 0, 128), ("cpu", 128, 512, 128)])
def test_a_share_producer_serves_gpu_pools_in_chunks_of_at_least_the_sweeps(device, batch, fewest,
                                                                            chunk):
    plan = NativePlan(root="/data", transform=PipelineOptions(), batch_size=batch, shuffle=True,
                      drop_last=True, device=device, decoder="mixed")
    assert gpu_chunk(plan, fewest) == chunk
