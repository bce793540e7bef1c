"""Share keys inside a sweep: ``batchcast sweep`` sets ``$BATCHCAST_SHARE_SCOPE`` (its id) for
its trials, and :func:`scoped_key` makes each trial's ``DataLoader(share=KEY)`` a key of that
sweep's own, one per stream (docs/sweep.md, "Sharing"). Outside a sweep a key is itself.
Pure function of its arguments and the environment; no state.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict

from ._fingerprint import STREAM_FIELDS
from ._sweep_progress import SCOPE_ENV

__all__ = ["scoped_key"]


def scoped_key(key: str, prints: Dict[str, Any]) -> str:
    """The key a trainer's ``share=KEY`` stands for: KEY itself, or inside a sweep
    (``$BATCHCAST_SHARE_SCOPE``, the sweep's id) ``<scope>.<KEY>.<digest of the stream
    fields>``: every trial of the sweep that uses KEY with the same stream (``STREAM_FIELDS``:
    dataset, sampler, seed, ...; and the decoding) reads one stream, a batch size or transform
    that differs reads it as the drop-in joins any key, and trials whose streams differ (a seed
    swept) get a stream each instead of the error one key of two streams gives. A stream
    decoded into a GPU pool is one per GPU too (``$CUDA_VISIBLE_DEVICES``, which the sweep sets
    per trial): a trial reads a GPU pool on its own GPU only. Another sweep, or a process
    outside any, never meets them."""
    scope = os.environ.get(SCOPE_ENV, "")
    if not scope:
        return key
    stream = {name: prints.get(name) for name in (*STREAM_FIELDS, "decoding")}
    if "pool on cuda" in str(prints.get("decoding")):
        stream["gpus"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    digest = hashlib.sha1(json.dumps(stream, sort_keys=True, default=str).encode()).hexdigest()
    return f"{scope}.{key}.{digest[:8]}"
