"""Helpers of the GPU tests from Python (test_cuda*.py): the mark of a test that needs a CUDA
device, and a server start that skips the test where this build cannot decode on the GPU.
"""

from __future__ import annotations

import pytest
import torch

import batchcast


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="no CUDA device: torch.cuda is not available")


def serve_or_skip(**kwargs):
    try:
        return batchcast.serve(**kwargs)
    except batchcast.BatchcastError as e:
        if "no CUDA support" in str(e) or "no nvJPEG" in str(e):
            pytest.skip(f"this build cannot decode on the GPU: {e}")
        raise
