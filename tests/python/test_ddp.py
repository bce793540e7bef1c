"""DDP with batchcast.DataLoader(share=): two data-parallel jobs of two ranks each, started as
torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), gloo on CPU,
DistributedSampler with set_epoch. Rank r of job A and rank r of job B read one stream. On a
machine with two GPUs, the same with nccl, one job under torchrun and one under
torch.multiprocessing.spawn, each rank's share decoding with nvJPEG on its own GPU.

Run: .venv/bin/python -m pytest tests/python/test_ddp.py
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from torch.utils.data import DistributedSampler

from batchcast.dataloader import share_paths
from conftest import in_threads_per_job_and_rank, watch_endpoint

SAMPLES, EPOCHS, SEED = 24, 2, 7

RANK = textwrap.dedent(
    f"""
    import json, sys, torch, torch.distributed as dist, batchcast
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import Dataset, DistributedSampler

    class Numbers(Dataset):
        def __len__(self):
            return {SAMPLES}
        def __getitem__(self, i):
            return torch.full((4,), float(i)), i

    if __name__ == "__main__":
        dist.init_process_group("gloo")
        data = Numbers()
        sampler = DistributedSampler(data, shuffle=True, seed={SEED})
        loader = batchcast.DataLoader(data, batch_size=3, sampler=sampler, share=sys.argv[1])
        model = DistributedDataParallel(torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        epochs = []
        for epoch in range({EPOCHS}):
            sampler.set_epoch(epoch)
            labels = []
            for x, y in loader:
                assert torch.equal(x[:, 0].long(), y)
                loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y.float())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                labels += y.tolist()
            epochs.append(labels)
        print(json.dumps({{"rank": dist.get_rank(), "endpoint": loader.endpoint,
                          "epochs": epochs}}), flush=True)
        loader.close()
        dist.destroy_process_group()
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shard(rank: int, epoch: int) -> list:
    sampler = DistributedSampler(range(SAMPLES), num_replicas=2, rank=rank, shuffle=True,
                                 seed=SEED)
    sampler.set_epoch(epoch)
    return list(sampler)


def _launch_as_torchrun(script: str, key: str, job: int, rank: int, port: int):
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return subprocess.Popen([sys.executable, script, key], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _launch_node_as_torchrun_nnodes(script: str, key: str, job: int, node: int, port: int):
    # One "node" of a two-node job (docs/multi_node.md) with the environment that
    # `torchrun --nnodes 2 --nproc-per-node 1 --node-rank NODE` gives its one process: local
    # rank 0 on every node, the global rank node * nproc + local rank. (Debian's torch 1.13
    # torchrun fails on Python 3.11 before it starts a worker, so it is not run itself.)
    env = dict(os.environ, RANK=str(node), LOCAL_RANK="0", GROUP_RANK=str(node),
               ROLE_RANK=str(node), LOCAL_WORLD_SIZE="1", WORLD_SIZE="2", GROUP_WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return subprocess.Popen([sys.executable, script, key], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


@pytest.mark.parametrize("launch", [_launch_as_torchrun, _launch_node_as_torchrun_nnodes],
                         ids=["one-node", "two-nodes"])
def test_two_ddp_jobs_share_per_rank_and_each_rank_gets_its_shard(tmp_path, launch):
    key = f"test-ddp-{uuid.uuid4().hex[:8]}"
    rank_paths = [share_paths(f"{key}-rank{r}of2") for r in range(2)]
    for paths in rank_paths:
        watch_endpoint(paths["endpoint"])
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    procs = []
    try:
        for job in range(2):
            port = free_port()
            for rank in range(2):
                procs.append(launch(str(script), key, job, rank, port))
        results = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()[-3000:]
            results.append(json.loads(out.decode().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for paths in rank_paths:
            for name in ("lock", "state", "log"):
                if os.path.exists(paths[name]):
                    os.unlink(paths[name])
    for result in results:
        rank = result["rank"]
        assert result["endpoint"] == rank_paths[rank]["endpoint"]  # the sharing is per rank
        assert result["epochs"] == [shard(rank, e) for e in range(EPOCHS)]
    by_rank = {r: [res["epochs"] for res in results if res["rank"] == r] for r in range(2)}
    assert all(len(v) == 2 and v[0] == v[1] for v in by_rank.values())  # job A == job B


def test_one_node_wide_server_gives_every_rank_its_shard_and_jobs_share_it(endpoint):
    """``serve --every-rank``: one process serves both ranks' shards; rank r of job A and of
    job B read rank r's stream (``Loader(endpoint, rank=r)``), with DistributedSampler's shards."""
    import torch

    import batchcast

    for r in range(2):
        watch_endpoint(batchcast.rank_endpoint(endpoint, r))
    for shuffle in (False, True):
        with batchcast.serve(synthetic=SAMPLES, sample_bytes=8, endpoint=endpoint, batch_size=5,
                             epochs=EPOCHS, workers=2, world_size=2, every_rank=True,
                             min_consumers=2, shuffle=shuffle, seed=SEED) as server:
            def read(job: str, rank: int) -> list:
                with batchcast.Loader(endpoint, rank=rank, timeout=30) as loader:
                    return [torch.cat([y for _, y in loader]).tolist() for _ in range(EPOCHS)]

            labels = in_threads_per_job_and_rank(read, timeout=60)
            assert server.wait(30) == 0, server.log_tail()
        assert len(labels) == 4
        for rank in range(2):
            assert labels["A", rank] == labels["B", rank]  # the jobs share rank r's stream
        for epoch in range(EPOCHS):
            both = labels["A", 0][epoch] + labels["A", 1][epoch]
            assert sorted(both) == list(range(SAMPLES))  # disjoint shards, the whole epoch
            if not shuffle:  # DistributedSampler(shuffle=False): rank r takes r, r + 2, ...
                for rank in range(2):
                    sampler = DistributedSampler(range(SAMPLES), num_replicas=2, rank=rank,
                                                 shuffle=False)
                    assert labels["A", rank][epoch] == list(sampler)


# --- nccl on two GPUs, the native nvJPEG path ----------------------------------------------

GPU_RANK = textwrap.dedent(
    """
    import hashlib, json, os, sys, time, torch, torch.distributed as dist, batchcast
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DistributedSampler
    from torchvision import datasets, transforms as T

    def train(rank, key, root, out, seed, epochs):
        torch.cuda.set_device(rank)
        tf = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(),
                        T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
        data = datasets.ImageFolder(root, tf)
        sampler = DistributedSampler(data, shuffle=True, seed=seed)
        loader = batchcast.DataLoader(data, batch_size=8, sampler=sampler, num_workers=1,
                                      pin_memory=True, share=key, timeout=120)
        model = DistributedDataParallel(torch.nn.Linear(3 * 32 * 32, len(data.classes)).cuda(),
                                        device_ids=[rank])
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        epochs_seen = []
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            labels, digest = [], hashlib.sha1()
            for x, y in loader:
                assert x.is_cuda and x.device.index == rank, x.device
                digest.update(x.cpu().numpy().tobytes())
                loss = torch.nn.functional.cross_entropy(model(x.flatten(1)), y.cuda())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                labels += y.tolist()
            epochs_seen.append({"labels": labels, "digest": digest.hexdigest()})
        with open(f"{out}.rank{dist.get_rank()}", "w") as f:
            json.dump({"endpoint": loader.endpoint, "epochs": epochs_seen,
                       "done_at": time.monotonic()}, f)
        loader.close()
        dist.destroy_process_group()

    def spawned(rank, *args):  # torch.multiprocessing.spawn, as PyTorch's ImageNet example
        dist.init_process_group("nccl", init_method=os.environ["INIT"], world_size=2, rank=rank)
        train(rank, *args)

    if __name__ == "__main__":
        key, root, out, seed, epochs = sys.argv[2], sys.argv[3], sys.argv[4], 7, 2
        if sys.argv[1] == "spawn":
            torch.multiprocessing.spawn(spawned, args=(key, root, out, seed, epochs), nprocs=2)
        else:  # under torchrun
            dist.init_process_group("nccl")
            train(int(os.environ["LOCAL_RANK"]), key, root, out, seed, epochs)
    """
)


def test_two_nccl_jobs_on_two_gpus_share_gpu_pools_per_rank(tmp_path):
    """Job A under torchrun, job B under torch.multiprocessing.spawn, each 2 ranks with nccl and
    DistributedSampler, ``DataLoader(share=, pin_memory=True)``: rank r's share decodes on
    cuda:r. Each rank gets its half of every epoch, rank r of both jobs the same samples and
    bytes, and every process exits."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, torch sees {torch.cuda.device_count()}")
    from PIL import Image

    root = tmp_path / "images"
    for i in range(40):  # one image per class: the label names the sample
        (root / f"c{i:02d}").mkdir(parents=True)
        Image.new("RGB", (200 + 20 * i, 180 + 9 * i), (6 * i, 255 - 6 * i, 90)).save(
            root / f"c{i:02d}" / "0.jpg", quality=90)
    key = f"test-nccl-{uuid.uuid4().hex[:8]}"
    for r in range(2):
        watch_endpoint(share_paths(f"{key}-rank{r}of2")["endpoint"])
    script = tmp_path / "gpu_rank.py"
    script.write_text(GPU_RANK)
    launchers = [
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", str(free_port()), str(script), "torchrun", key, str(root),
         str(tmp_path / "A")],
        [sys.executable, str(script), "spawn", key, str(root), str(tmp_path / "B")],
    ]
    env = dict(os.environ, INIT=f"tcp://127.0.0.1:{free_port()}")
    logs = [open(tmp_path / f"{job}.log", "w+b") for job in "AB"]
    procs = [subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
             for cmd, log in zip(launchers, logs)]
    exited = {}
    deadline = time.monotonic() + 240
    try:
        while len(exited) < 2 and time.monotonic() < deadline:
            for k, p in enumerate(procs):
                if k not in exited and p.poll() is not None:
                    exited[k] = time.monotonic()
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for r in range(2):
            for name in ("lock", "state", "log"):
                path = share_paths(f"{key}-rank{r}of2")[name]
                if os.path.exists(path):
                    os.unlink(path)
    for k, p in enumerate(procs):
        logs[k].seek(0)
        output = logs[k].read().decode(errors="replace")[-4000:]
        assert k in exited, f"job {'AB'[k]} did not exit within 240 s: {output}"
        assert p.returncode == 0, output
    results = {(job, r): json.loads((tmp_path / f"{job}.rank{r}").read_text())
               for job in "AB" for r in range(2)}
    for (job, r), res in results.items():
        assert res["endpoint"] == share_paths(f"{key}-rank{r}of2")["endpoint"]
        assert exited["AB".index(job)] - res["done_at"] < 30, f"job {job} exited late"
    for r in range(2):
        assert results["A", r]["epochs"] == results["B", r]["epochs"], f"rank {r} differs"
    # The native pipeline shards as DistributedSampler does (rank r takes every 2nd sample of
    # the epoch's order) but draws the order from its own seeded source, not torch's generator
    # (_torchvision_plan.py): each epoch the two shards are disjoint halves of the dataset.
    orders = []
    for e in range(EPOCHS):
        halves = [results["A", r]["epochs"][e]["labels"] for r in range(2)]
        assert sorted(halves[0] + halves[1]) == list(range(40)), f"epoch {e}: not the dataset"
        assert len(halves[0]) == len(halves[1]) == 20
        orders.append(halves)
    assert orders[0] != orders[1], "set_epoch(e) should select a new order"

