"""GPU pools from Python: ``batchcast serve --device cuda:0`` and two Loader consumer processes.

Skipped (with the reason) where torch sees no CUDA device or the build has no CUDA support.
Run on the GPU machine: BATCHCAST_BUILD_DIR=build-gpu python3 -m pytest tests/python/test_cuda.py
Synthetic sample i: "#0" = uint8 bytes synthetic_byte(i, j), "#1" = int64 label i.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

import batchcast

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: torch.cuda is not available", allow_module_level=True)

SAMPLE_BYTES = 2048

CONSUMER = textwrap.dedent(
    """
    import hashlib, sys, torch, batchcast
    loader = batchcast.Loader(sys.argv[1], timeout=60)
    out = []
    for x, y in (batch for _ in range(2) for batch in loader):  # 2 epochs
        assert x.is_cuda and y.is_cuda, (x.device, y.device)
        # Slow work queued on the current stream, then the batch is dropped at once: its slot
        # must not be rewritten before that work has run.
        torch.cuda._sleep(200000)
        i = y.to(torch.int64).unsqueeze(1)
        j = torch.arange(x.shape[1], device=x.device, dtype=torch.int64).unsqueeze(0)
        want = (((i * 2654435761 + j * 40503 + (i >> 8)) >> 3) & 0xFF).to(torch.uint8)
        same = (x == want).all()
        digest = x.to("cpu", non_blocking=True)
        del x, y
        torch.cuda.current_stream().synchronize()
        assert bool(same), "payload does not match its label"
        out.append(hashlib.sha1(digest.numpy().tobytes()).hexdigest())
    print(len(out), hashlib.sha1(" ".join(out).encode()).hexdigest())
    """
)


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
