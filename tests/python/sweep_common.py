"""Helpers of the sweep tests (test_sweep.py, test_sweep_input.py): a tiny JPEG ImageFolder, the
trial script that reads it through ``batchcast.DataLoader(share=...)``, running ``batchcast
sweep``, and what a sweep must leave behind (nothing of its scope in /tmp nor /dev/shm, no
process of its scope alive).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Dict, List

from conftest import segment_of
from test_decoders import photo, save_jpeg

# A trial: reads EPOCHS epochs of the folder through a shared DataLoader of key "train" at SIZE
# px, then prints how many samples it read. MODE "crash" exits 3 after the first batch; "hold"
# writes its pid to HOLD_DIR/<pid> after the first epoch and sleeps until stopped ("hold-hard":
# ignoring SIGTERM, so only SIGKILL ends it).
TRIAL = textwrap.dedent("""
    import os, signal, sys, time
    import torchvision, torchvision.transforms as T
    import batchcast
    root, size, epochs, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    ds = torchvision.datasets.ImageFolder(root, T.Compose([
        T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor()]))
    loader = batchcast.DataLoader(ds, batch_size=4, shuffle=True, share="train")
    n = 0
    for epoch in range(epochs):
        for x, y in loader:
            assert x.shape[-1] == size
            n += len(y)
            if mode == "crash":
                print("boom: this trial crashes on purpose", flush=True)
                sys.exit(3)
    print("samples", n, flush=True)
    if mode.startswith("hold"):
        if mode == "hold-hard":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(os.path.join(os.environ["HOLD_DIR"], str(os.getpid())), "w").close()
        it = iter(loader)
        next(it)  # attached to the stream while it waits
        while True:
            time.sleep(1)
""")

# An unchanged script: torch's own DataLoaders (a shuffled training loader, an evaluation
# loader, a loader over a list), no batchcast; prints what its training loader became. It
# spends STARTUP_S before its first epoch, as a script builds its model.
STARTUP_S = 2.0
PLAIN = textwrap.dedent(f"""
    import sys, time
    import torch, torchvision, torchvision.transforms as T
    from torch.utils.data import DataLoader
    root, size, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    train = torchvision.datasets.ImageFolder(root, T.Compose([
        T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor()]))
    val = torchvision.datasets.ImageFolder(root, T.Compose([
        T.Resize(size), T.CenterCrop(size), T.ToTensor()]))
    loader = torch.utils.data.DataLoader(train, batch_size=4, shuffle=True)
    evaluation = DataLoader(val, batch_size=4)
    listed = DataLoader(list(range(10)), batch_size=2, shuffle=True)
    print("training loader:", type(loader).__module__, isinstance(loader, DataLoader))
    print("evaluation loader:", type(evaluation).__module__)
    time.sleep({STARTUP_S})  # its model being built
    n = 0
    for epoch in range(epochs):
        for x, y in loader:
            n += len(y)
        for x, y in evaluation:
            assert x.shape[-1] == size
    print("samples", n, flush=True)
""")

IMAGES = 12  # in the folder: 2 classes x 6


def make_folder(root: str) -> str:
    base = photo(90, 70)
    for c in range(2):
        for i in range(IMAGES // 2):
            save_jpeg(base.crop((c, i, c + 48, i + 40)), os.path.join(root, f"c{c}", f"i{i}.jpg"))
    return root


def write_trial(folder: str) -> str:
    """trial.py (TRIAL) and plain.py (PLAIN) in ``folder``; the path of trial.py."""
    with open(os.path.join(folder, "plain.py"), "w") as f:
        f.write(PLAIN)
    path = os.path.join(folder, "trial.py")
    with open(path, "w") as f:
        f.write(TRIAL)
    return path


def run_sweep(cli: str, args: List[str], **kwargs: Any) -> subprocess.CompletedProcess:
    kwargs.setdefault("timeout", 600)
    return subprocess.run([cli, "sweep", *args], capture_output=True, text=True, **kwargs)


def start_sweep(cli: str, args: List[str], **kwargs: Any) -> subprocess.Popen:
    return subprocess.Popen([cli, "sweep", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def summary(out: str) -> Dict[str, Any]:
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def python() -> str:
    return sys.executable


def scope_processes(scope: str) -> List[int]:
    """Live processes naming sweep ``scope`` on their command line: its share producers."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if scope.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def scope_leftovers(scope: str, producers: List[Dict[str, Any]]) -> List[str]:
    """What a sweep of id ``scope`` left: files of its scope in /tmp, its producers' pools in
    /dev/shm, and live processes naming its scope."""
    prefix = f"/tmp/batchcast-{os.getuid()}-{scope}."
    left = [os.path.join("/tmp", n) for n in os.listdir("/tmp")
            if os.path.join("/tmp", n).startswith(prefix)]
    for p in producers:
        endpoint = f"ipc://{prefix}{p['key']}.sock"
        if os.path.exists(segment_of(endpoint)):
            left.append(segment_of(endpoint))
    return left + [f"process {pid}" for pid in scope_processes(scope)]
