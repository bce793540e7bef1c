"""GPU sharing under stress: GPU pools with small chunks, several trainer processes that
differ (batch size, a random pause, a ``break`` mid-epoch, a ``state_dict`` resume), through the
drop-in (``batchcast.DataLoader(share=, pin_memory=True)``: the mixed decoder) and through
``Loader(device="cuda")`` on ``batchcast serve --decoder nvjpeg``. Every round must end: every epoch a trainer reads whole
holds each sample exactly once, trainers of one batch size get identical bytes, every process
exits within EXIT_BOUND_S of its last batch, and the share producer within the leak check's 5 s.
A trainer that ends by an exception, SIGINT or SIGTERM frees the others and the producer alike.

Round r takes row r of MATRIX (consumers x batch size x num_workers, covered in full by 18
rounds) with the roles rotated by r; where a second GPU is present, odd rounds put the pool on
cuda:1 and every trainer calls ``torch.cuda.set_device(1)``. ``BATCHCAST_GPU_STRESS_ROUNDS``
(default 4) sets how many rounds each test runs, from ``BATCHCAST_GPU_STRESS_FIRST`` (default 0):
the acceptance runs use 20, as pytest runs side by side (FIRST 0, 7 and 14, 7 rounds each).
Skipped without a GPU, or where the build has no nvJPEG.
Run on the GPU machine: python3 -m pytest -q tests/python/test_gpu_stress.py
"""

from __future__ import annotations

import itertools
import json
import os
import textwrap
import time
import uuid

import numpy as np
import pytest
import torch

import batchcast
from conftest import photo_like, watch_endpoint

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="no CUDA device: torch.cuda is not available")

ROUNDS = int(os.environ.get("BATCHCAST_GPU_STRESS_ROUNDS", "4"))
FIRST = int(os.environ.get("BATCHCAST_GPU_STRESS_FIRST", "0"))  # several runs side by side
MATRIX = list(itertools.product((2, 3, 4), (8, 16, 32), (1, 4)))  # consumers, batch, workers
ROLES = ("plain", "pause", "break", "resume")
IMAGES = 72  # one image per class: the label is the sample
EPOCHS = 2
SIZE = 64
EXIT_BOUND_S = 15.0  # from a trainer's last batch to its process's exit
TIMEOUT_S = 180.0  # a stalled round fails here instead of hanging the suite

TRAINER = textwrap.dedent(
    """
    import hashlib, json, os, random, signal, sys, time, torch, batchcast
    a = json.loads(sys.argv[1])
    torch.cuda.set_device(a["device"])
    rng = random.Random(a["seed"])

    def open_loader():
        if a["mode"] == "loader":
            return batchcast.Loader(a["endpoint"], batch_size=a["batch"], device="cuda",
                                    timeout=120)
        from torchvision import datasets, transforms as T
        tf = T.Compose([T.RandomResizedCrop(a["size"]), T.RandomHorizontalFlip(), T.ToTensor(),
                        T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
        return batchcast.DataLoader(datasets.ImageFolder(a["root"], tf), batch_size=a["batch"],
                                    shuffle=True, num_workers=a["workers"], pin_memory=True,
                                    timeout=120, share=a["key"])

    loader = open_loader()
    role, epochs = a["role"], []
    for epoch in range(a["epochs"]):
        labels, digest, cut = [], hashlib.sha1(), None
        if role in ("break", "resume") and epoch == 0:
            cut = rng.randrange(1, len(loader))  # batches read before the break / the restart
        for k, (x, y) in enumerate(loader):
            assert x.is_cuda and x.device.index == a["device"], x.device
            digest.update(x.cpu().numpy().tobytes())
            labels += y.tolist()
            if role.startswith("end-") and k == 1:  # this trainer ends here, the way named
                print(json.dumps({"epochs": [], "done_at": time.monotonic()}), flush=True)
                if role == "end-exception":
                    raise RuntimeError("a planned failure of the training loop")
                os.kill(os.getpid(), signal.SIGINT if role == "end-sigint" else signal.SIGTERM)
                time.sleep(60)  # the signal ends the process first
            if role == "pause" and rng.random() < 0.2:
                time.sleep(rng.uniform(0.05, 1.0))
            if cut is not None and k + 1 == cut:
                if role == "break":
                    break
                state = loader.state_dict()  # restart: a new loader resumes where this one was
                del x, y
                loader.close()
                loader = open_loader()
                loader.load_state_dict(state)
                for x, y in loader:
                    digest.update(x.cpu().numpy().tobytes())
                    labels += y.tolist()
                break
        epochs.append({"labels": labels, "digest": digest.hexdigest()})
    loader.close()
    print(json.dumps({"epochs": epochs, "done_at": time.monotonic()}), flush=True)
    """
)


@pytest.fixture(scope="module")
def one_per_class(tmp_path_factory):
    """IMAGES baseline JPEGs of sizes from 160x120 to 1600x1200, one per class folder: the
    label names the sample, and the sizes keep nvJPEG's buffers growing through the stream."""
    from PIL import Image

    root = tmp_path_factory.mktemp("stress") / "images"
    rng = np.random.default_rng(0)
    for i in range(IMAGES):
        w = int(rng.integers(160, 1600))
        h = int(w * rng.uniform(0.6, 1.4))
        path = root / f"c{i:03d}" / "0.jpg"
        path.parent.mkdir(parents=True)
        Image.fromarray(photo_like(w, h, i)).save(path, "JPEG", quality=85)
    return str(root)


def round_config(r: int) -> dict:
    consumers, batch, workers = MATRIX[r % len(MATRIX)]
    roles = [ROLES[(r + k) % len(ROLES)] for k in range(consumers)]
    device = 1 if torch.cuda.device_count() > 1 and r % 2 else 0
    return {"consumers": consumers, "batch": batch, "workers": workers, "roles": roles,
            "device": device}


def run_trainers(run_py, configs: list, logs) -> list:
    """Starts one trainer per config at once and waits for all, noting when each process
    exits; returns their results, each with the seconds from its last batch to its exit."""
    errs = [open(logs / f"trainer{k}.err", "w+b") for k in range(len(configs))]
    procs = [run_py(TRAINER, json.dumps(c), stderr=e) for c, e in zip(configs, errs)]
    exited: dict = {}
    deadline = time.monotonic() + TIMEOUT_S
    while len(exited) < len(procs) and time.monotonic() < deadline:
        for k, p in enumerate(procs):
            if k not in exited and p.poll() is not None:
                exited[k] = time.monotonic()
        time.sleep(0.05)
    results = []
    for k, (c, p, e) in enumerate(zip(configs, procs, errs)):
        name = f"trainer {c['role']} (batch {c['batch']})"
        if k not in exited:
            p.kill()
        out = p.communicate()[0].decode()
        e.seek(0)
        err = e.read().decode(errors="replace")[-3000:]
        assert k in exited, f"{name} did not finish within {TIMEOUT_S} s: {err}"
        if c["role"].startswith("end-"):
            assert p.returncode != 0, f"{name} should have failed"
        else:
            assert p.returncode == 0, f"{name} failed: {err}"
        result = json.loads(out.strip().splitlines()[-1])
        result["exit_s"] = exited[k] - result["done_at"]
        results.append(result)
    return results


def check_coverage(configs: list, results: list, samples: int) -> None:
    whole = list(range(samples))
    digests: dict = {}
    for c, res in zip(configs, results):
        name = f"trainer {c['role']} (batch {c['batch']})"
        assert res["exit_s"] < EXIT_BOUND_S, f"{name} exited {res['exit_s']:.1f} s after its end"
        if c["role"].startswith("end-"):
            continue
        assert len(res["epochs"]) == EPOCHS
        for e, epoch in enumerate(res["epochs"]):
            labels = epoch["labels"]
            assert len(set(labels)) == len(labels), f"{name}: a sample twice in epoch {e}"
            if c["role"] == "break" and e == 0:
                assert 0 < len(labels) < samples and set(labels) <= set(whole)
                continue
            assert sorted(labels) == whole, f"{name}: epoch {e} is not exactly the dataset"
            if c["role"] != "resume" or e > 0:
                digests.setdefault((c["batch"], e), set()).add(epoch["digest"])
    for (batch, e), seen in digests.items():
        assert len(seen) == 1, f"trainers of batch {batch} got different bytes in epoch {e}"


@needs_gpu
@pytest.mark.parametrize("r", range(FIRST, FIRST + ROUNDS))
def test_dropin_trainers_that_differ_share_a_gpu_pool(one_per_class, run_py, tmp_path, r):
    cfg = round_config(r)
    key = f"stress-{uuid.uuid4().hex[:8]}"
    watch_endpoint(_share_endpoint(key))
    configs = [{"mode": "dropin", "root": one_per_class, "key": key, "batch": cfg["batch"],
                "workers": cfg["workers"], "device": cfg["device"], "role": role,
                "seed": 100 * r + k, "epochs": EPOCHS, "size": SIZE}
               for k, role in enumerate(cfg["roles"])]
    results = run_trainers(run_py, configs, tmp_path)
    check_coverage(configs, results, IMAGES)


def _share_endpoint(key: str) -> str:
    from batchcast.dataloader import share_paths

    return share_paths(key)["endpoint"]


@needs_gpu
@pytest.mark.parametrize("r", range(FIRST, FIRST + ROUNDS))
def test_loaders_that_differ_share_an_nvjpeg_pool_of_small_chunks(one_per_class, run_py,
                                                                   endpoint, tmp_path, r):
    cfg = round_config(r)
    chunk = 8
    # Batch sizes of the trainers: never all the chunk size (batches spanning chunks are copies).
    batches = [(8, 16, 32, 24)[(r + k) % 4] for k in range(cfg["consumers"])]
    try:
        server = batchcast.serve(data=one_per_class, endpoint=endpoint, batch_size=chunk,
                                 image_size=SIZE, epochs=EPOCHS, shuffle=True,
                                 workers=cfg["workers"], device=f"cuda:{cfg['device']}",
                                 decoder="nvjpeg", min_consumers=cfg["consumers"])
    except batchcast.BatchcastError as e:
        if "no CUDA support" in str(e) or "no nvJPEG" in str(e):
            pytest.skip(f"this build cannot decode on the GPU: {e}")
        raise
    with server:
        configs = [{"mode": "loader", "endpoint": endpoint, "batch": b, "device": cfg["device"],
                    "role": role, "seed": 100 * r + k, "epochs": EPOCHS}
                   for k, (role, b) in enumerate(zip(cfg["roles"], batches))]
        results = run_trainers(run_py, configs, tmp_path)
        assert server.wait(30) == 0
    check_coverage(configs, results, IMAGES)


@needs_gpu
@pytest.mark.parametrize("ending", ["exception", "sigint", "sigterm"])
def test_a_trainer_ending_any_way_frees_the_others_and_the_producer(one_per_class, run_py,
                                                                     tmp_path, ending):
    # The other trainer reads both epochs whole, the ending one's process exits within the
    # bound, and the share producer exits once the last trainer left (the leak check).
    key = f"stress-{uuid.uuid4().hex[:8]}"
    watch_endpoint(_share_endpoint(key))
    configs = [{"mode": "dropin", "root": one_per_class, "key": key, "batch": 8, "workers": 1,
                "device": 0, "role": role, "seed": k, "epochs": EPOCHS, "size": SIZE}
               for k, role in enumerate(["plain", f"end-{ending}"])]
    results = run_trainers(run_py, configs, tmp_path)
    check_coverage(configs, results, IMAGES)
