"""GPU pools from Python: ``batchcast serve --device cuda:0|all`` and Loader consumer processes:
GPU batches shared by two processes, --device by GPU or MIG UUID, pin_memory copies of host
pools, one server for every GPU of a node (nvJPEG decoding: test_cuda_nvjpeg.py).

GPU tests are skipped (with the reason) where torch sees no CUDA device or the build has no
CUDA support; the command-line errors of a machine without a GPU are tested everywhere.
Run on the GPU machine (scripts/README.md): python3 -m pytest tests/python/test_cuda*.py
Synthetic sample i: "#0" = uint8 bytes synthetic_byte(i, j), "#1" = int64 label i.
"""

from __future__ import annotations

import textwrap
import threading

import pytest
import torch

import batchcast
from conftest import in_threads_per_job_and_rank, synthetic_rows, watch_endpoint
from cuda_common import needs_gpu, serve_or_skip


SAMPLE_BYTES = 2048
SAMPLES_PER_EPOCH = 320

CONSUMER = textwrap.dedent(
    """
    import hashlib, sys, torch, batchcast
    from conftest import synthetic_rows
    loader = batchcast.Loader(sys.argv[1], timeout=60)
    out = []
    for x, y in (batch for _ in range(2) for batch in loader):  # 2 epochs
        assert x.is_cuda and y.is_cuda, (x.device, y.device)
        # Slow work queued on the current stream, then the batch is dropped at once: its slot
        # must not be rewritten before that work has run.
        torch.cuda._sleep(200000)
        want = synthetic_rows(y, x.shape[1])
        same = (x == want).all()
        digest = x.to("cpu", non_blocking=True)
        del x, y
        torch.cuda.current_stream().synchronize()
        assert bool(same), "payload does not match its label"
        out.append(hashlib.sha1(digest.numpy().tobytes()).hexdigest())
    print(len(out), hashlib.sha1(" ".join(out).encode()).hexdigest())
    """
)


@needs_gpu
def test_two_loader_processes_share_gpu_batches(endpoint, batchcast_bin, run_py):
    try:
        server = batchcast.serve(synthetic=300, sample_bytes=SAMPLE_BYTES, endpoint=endpoint,
                                 batch_size=32, epochs=2, workers=2, ring=4, device="cuda:0",
                                 min_consumers=2)
    except Exception as e:  # a CPU-only build refuses --device cuda at once
        if "no CUDA support" in str(e):
            pytest.skip(f"this build has no CUDA support: {e}")
        raise
    with server:
        a = run_py(CONSUMER, endpoint)
        b = run_py(CONSUMER, endpoint)
        out_a, err_a = a.communicate(timeout=120)
        out_b, err_b = b.communicate(timeout=120)
        assert a.returncode == 0, err_a.decode()
        assert b.returncode == 0, err_b.decode()
        assert out_a == out_b
        assert out_a.split()[0] == str(2 * ((300 + 31) // 32)).encode()
        assert server.wait(30) == 0


# --- device identity: --device by UUID (MIG instances) ------------------------------------------

def test_device_takes_gpu_and_mig_uuids_and_refuses_an_unseen_one_naming_the_fix(endpoint):
    with pytest.raises(batchcast.BatchcastError, match=r"MIG-<uuid> from nvidia-smi -L"):
        batchcast.serve(synthetic=8, endpoint=endpoint, device="MIG-GPU-" + "1" * 8 + "/1/0")
    with pytest.raises(batchcast.BatchcastError, match=r"cuda:K .*MIG-<uuid>"):
        batchcast.serve(synthetic=8, endpoint=endpoint, device="MIG-12")
    # Well formed but not this machine's: refused before anything starts, naming the fix (a
    # CPU-only build says it has no CUDA; a CUDA build lists its devices and the variable).
    unseen = "MIG-11111111-2222-3333-4444-555555555555"
    with pytest.raises(batchcast.BatchcastError,
                       match=rf"no CUDA support|CUDA_VISIBLE_DEVICES={unseen}"):
        batchcast.serve(synthetic=8, endpoint=endpoint, device=unseen)


# --- pin_memory: host pools copied to the GPU from page-locked memory -------------------------

@needs_gpu
def test_loaders_catching_up_together_on_a_gpu_pool_read_intact_copies(endpoint, batchcast_bin):
    # test_loader_positions' lockstep catch-up on a GPU pool: three loaders join mid-epoch at once, catch
    # up on private chunks read in lockstep (the leader in a thread of its own) and keep
    # every batch. Each private chunk is copied device to device as it arrives
    # (client/chunk_copy.h): its slot goes back once the copy has run, its batches wait for the
    # copy on the user's stream, and the copy lives as long as they do.
    server = serve_or_skip(synthetic=400, sample_bytes=SAMPLE_BYTES, endpoint=endpoint,
                           batch_size=4, epochs=2, workers=2, ring=16, device="cuda:0")
    with server:
        loaders = [batchcast.Loader(endpoint, timeout=60)]
        lead = iter(loaders[0])
        head = [y.cpu() for _, y in (next(lead) for _ in range(40))]  # the ring lost chunk 0
        loaders += [batchcast.Loader(endpoint, timeout=60) for _ in range(3)]
        kept = [[[], []] for _ in loaders]  # per loader, per epoch: every batch, kept

        def in_lockstep(epoch: int, batches: dict) -> None:
            while batches:  # one batch of each in turn, as zip() does
                for k, it in list(batches.items()):
                    batch = next(it, None)
                    if batch is None:
                        del batches[k]
                    else:
                        kept[k][epoch].append(batch)

        leader = threading.Thread(target=lambda: kept[0][0].extend(lead))
        leader.start()
        in_lockstep(0, {k: iter(loaders[k]) for k in (1, 2, 3)})
        leader.join(120)
        assert not leader.is_alive()
        in_lockstep(1, {k: iter(loader) for k, loader in enumerate(loaders)})
        torch.cuda.synchronize()
        assert all(x.is_cuda and torch.equal(x, synthetic_rows(y, SAMPLE_BYTES))
                   for per_epoch in kept for x, y in per_epoch[0] + per_epoch[1]), "a bad batch"
        labels = [[torch.cat([y for _, y in batches]).cpu().tolist() for batches in per_epoch]
                  for per_epoch in kept]
        whole = torch.cat(head).tolist() + labels[0][0]
        assert sorted(whole) == list(range(400))
        for k in (1, 2, 3):
            assert labels[k] == [whole, labels[0][1]], f"joiner {k} differs from the leader"
        kept.clear()  # a GPU pool's server exits once every batch is released
        for loader in loaders:
            loader.close()
        assert server.wait(30) == 0
        with open(server.log_path) as log:
            caught_up = log.read().count("chunks regenerated for it until it reaches the stream")
        assert caught_up == 3, "each joiner caught up on private chunks"


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the machine without a GPU")
def test_pin_memory_without_cuda_is_ignored_with_one_log_line(endpoint, batchcast_bin, caplog):
    with batchcast.serve(synthetic=40, sample_bytes=64, endpoint=endpoint, batch_size=16,
                         epochs=1, workers=1) as server:
        with caplog.at_level("INFO", logger="batchcast"):
            loader = batchcast.Loader(endpoint, pin_memory=True, timeout=60)
            batches = [(x.clone(), y.clone()) for x, y in loader]
        loader.close()
        assert server.wait(30) == 0
    notes = [r.getMessage() for r in caplog.records if "pin_memory" in r.getMessage()]
    assert notes == ["pin_memory=True is ignored: no CUDA device is usable"], notes
    assert sum(len(y) for _, y in batches) == 40
    assert all(torch.equal(x, synthetic_rows(y, 64)) for x, y in batches)


@needs_gpu
@pytest.mark.parametrize("batch_size", [32, 48], ids=["views", "copies"])
def test_pin_memory_copies_reach_the_gpu_intact_before_the_slot_is_reused(
        endpoint, batchcast_bin, batch_size):
    # Each copy is queued behind ~30 ms of GPU sleep and nothing waits for the GPU until the
    # end, while the host reads on: a slot released before its copy ran would be rewritten at
    # once in a ring of 3, and the batch copied late would not match its label.
    with batchcast.serve(synthetic=400, sample_bytes=4096, endpoint=endpoint, batch_size=32,
                         epochs=1, workers=2, ring=3) as server:
        loader = batchcast.Loader(endpoint, batch_size=batch_size, device="cuda:0",
                                  pin_memory=True, timeout=60)
        kept = []
        for x, y in loader:
            assert x.is_cuda and y.is_cuda
            kept.append((x, y))
            torch.cuda._sleep(50_000_000)  # the next batch's copy waits behind this
        torch.cuda.synchronize()
        assert all(torch.equal(x, synthetic_rows(y, 4096)) for x, y in kept), "a copy was late"
        seen = sum(len(y) for _, y in kept)
        print(f"batch {batch_size}: {len(kept)} batches, {loader.stats.copies} private copies")
        loader.close()
        assert seen == 400
        assert server.wait(30) == 0


@needs_gpu
def test_pin_memory_page_locks_the_mapping_or_says_why(endpoint, batchcast_bin, capfd):
    from batchcast import _batchcast

    with batchcast.serve(synthetic=64, sample_bytes=256, endpoint=endpoint, batch_size=32,
                         epochs=1, workers=1) as server:
        consumer = _batchcast.Consumer(
            _batchcast.ConsumerOptions(endpoint=endpoint, cuda_device=0, pin_memory=True))
        batch = consumer.next()
        pinned, copied = batch.pinned, batch.copied
        del batch
        while consumer.next() is not None:
            pass
        consumer.close()
        assert server.wait(30) == 0
    err = capfd.readouterr().err
    print(f"pool page-locked in place: {pinned}")
    assert not copied
    # Either the read-only mapping was registered, or the consumer said once why not.
    assert pinned or err.count("stays pageable") == 1, err


# --- one server for every GPU of a node (serve --device all) ------------------------------------
# On one GPU these run the same code paths with the pool on that GPU alone; on a multi-GPU
# machine every GPU has consumers of its own.

ON_DEVICE = textwrap.dedent(
    """
    import hashlib, sys, torch, batchcast
    from conftest import synthetic_rows
    device = sys.argv[2]
    torch.cuda.set_device(device)
    loader = batchcast.Loader(sys.argv[1], device=device, timeout=60)
    out, labels = [], []
    for x, y in loader:
        assert x.device == torch.device(device), (x.device, device)
        want = synthetic_rows(y, x.shape[1])
        assert bool((x == want).all()), "payload does not match its label"
        out.append(hashlib.sha1(x.cpu().numpy().tobytes()).hexdigest())
        labels += y.tolist()
    print(len(labels), sorted(labels) == list(range(300)),
          hashlib.sha1(" ".join(out).encode()).hexdigest())
    """
)


@needs_gpu
def test_one_server_on_every_gpu_serves_each_gpus_consumers_the_same_bytes(
        endpoint, batchcast_bin, run_py):
    gpus = torch.cuda.device_count()
    consumers = [f"cuda:{k}" for k in range(gpus) for _ in range(2)]  # two per GPU
    with serve_or_skip(synthetic=300, sample_bytes=SAMPLE_BYTES, endpoint=endpoint,
                       batch_size=32, epochs=1, workers=2, ring=4, device="all",
                       min_consumers=len(consumers)) as server:
        procs = [run_py(ON_DEVICE, endpoint, device) for device in consumers]
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()[-3000:]
            outs.append(out.split())
        assert server.wait(30) == 0, server.log_tail()
        log = server.log_tail(50)
    assert all(o[:2] == [b"300", b"True"] for o in outs), outs  # the whole epoch, each
    assert len({o[2] for o in outs}) == 1, outs  # identical bytes on every GPU
    if gpus > 1:
        assert f"the pool is on {gpus} GPUs" in log, log


@needs_gpu
def test_every_rank_server_on_gpus_gives_each_rank_its_shard_on_its_gpu(endpoint, batchcast_bin):
    # serve --every-rank --device all: rank r's pool is on GPU r mod G; rank r of job A and of job
    # B read the same bytes there, and the two ranks' shards cover the epoch once.
    gpus = torch.cuda.device_count()
    for r in range(2):
        watch_endpoint(batchcast.rank_endpoint(endpoint, r))
    with serve_or_skip(synthetic=SAMPLES_PER_EPOCH, sample_bytes=SAMPLE_BYTES,
                       endpoint=endpoint, batch_size=16, epochs=1, workers=2, ring=4,
                       world_size=2, every_rank=True, min_consumers=2, device="all") as server:
        def read(job: str, rank: int) -> tuple:
            device = f"cuda:{rank % gpus}"
            torch.cuda.set_device(device)
            with batchcast.Loader(endpoint, rank=rank, device=device, timeout=60) as loader:
                xs, ys = [], []
                for x, y in loader:
                    assert x.device == torch.device(device), (x.device, device)
                    assert torch.equal(x, synthetic_rows(y, SAMPLE_BYTES)), "a bad batch"
                    xs.append(x.cpu())
                    ys.append(y.cpu())
                return torch.cat(xs), torch.cat(ys)

        seen = in_threads_per_job_and_rank(read)
        assert server.wait(30) == 0, server.log_tail()
    assert len(seen) == 4, "a reader failed (see its exception above)"
    for rank in range(2):
        assert torch.equal(seen["A", rank][0], seen["B", rank][0])  # the jobs share rank r
    both = torch.cat([seen["A", 0][1], seen["A", 1][1]]).tolist()
    assert sorted(both) == list(range(SAMPLES_PER_EPOCH))  # disjoint shards, the whole epoch
