"""Helpers of the Loader tests (test_loader*.py): a real `batchcast serve --synthetic` server of
SAMPLE_BYTES-byte samples (sample i: "#0" = uint8 bytes synthetic_byte(i, j), "#1" = int64 label i).
"""

from __future__ import annotations

import batchcast


SAMPLE_BYTES = 32


def serve(endpoint: str, samples: int = 100, batch: int = 16, epochs: int = 2, **kw):
    return batchcast.serve(synthetic=samples, sample_bytes=SAMPLE_BYTES, endpoint=endpoint,
                           batch_size=batch, epochs=epochs, workers=2, **kw)
