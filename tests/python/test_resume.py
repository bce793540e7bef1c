"""Resume: a trainer that checkpoints DataLoader(share=).state_dict() at (epoch, batch) and
restarts reads the same next samples as an uninterrupted run, while another trainer keeps
reading the stream; in relaxed order, the rest of its epoch once.

Run: .venv/bin/python -m pytest tests/python/test_resume.py
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

from batchcast.dataloader import share_paths
from conftest import watch_endpoint
import batchcast
from test_dataloader import labels_of, make
from test_share_joins import CHUNK, SAMPLES, folder, images  # noqa: F401 (folder: a fixture)


@pytest.fixture
def key():
    key = f"test-{uuid.uuid4().hex[:8]}"
    paths = share_paths(key)
    watch_endpoint(paths["endpoint"])
    yield key
    for name in ("lock", "state", "log"):
        if os.path.exists(paths[name]):
            os.unlink(paths[name])


def test_a_restarted_trainer_reads_the_same_next_samples(key):
    with make(key) as other:
        with make(key) as trainer:
            assert trainer.state_dict() == {"epoch": None, "sample": 0}  # nothing read yet
            reference, before = [], []
            it_other, it_trainer = iter(other), iter(trainer)
            for _ in range(3):
                reference += labels_of([next(it_other)])
                before += labels_of([next(it_trainer)])
            checkpoint = json.loads(json.dumps(trainer.state_dict()))  # a checkpoint's copy
            assert checkpoint == {"epoch": 0, "sample": 12}
        # the trainer died; the other one reads on
        reference += labels_of(it_other)
        assert before == reference[:12]
        with make(key) as restarted:
            restarted.load_state_dict(checkpoint)
            assert restarted.state_dict() == checkpoint  # loaded, not yet read
            assert labels_of(restarted) == reference[12:]  # the rest of epoch 0, in order
            pairs = list(zip(other, restarted))  # epoch 1 again with the others
            assert labels_of(b for b, _ in pairs) == labels_of(b for _, b in pairs)


def labels(batches) -> list:
    """The labels of image batches (one image per class: a label names its sample)."""
    return [label for _, y in batches for label in y.tolist()]


def test_a_restarted_relaxed_trainer_reads_the_rest_of_its_epoch_once(key, folder):
    """Relaxed order (docs/stream.md, Order; a native pipeline: a Python one is served in exact
    order): the checkpoint keeps the samples yielded in the epoch; the restarted trainer, on a
    producer started afresh, reads exactly the others, then whole epochs."""
    def relaxed() -> batchcast.DataLoader:
        return batchcast.DataLoader(images(folder), batch_size=CHUNK, shuffle=True, timeout=30,
                                    share=key, share_order="relaxed")

    with relaxed() as trainer:
        it = iter(trainer)
        before = labels([next(it) for _ in range(2)])
        checkpoint = json.loads(json.dumps(trainer.state_dict()))  # a checkpoint's copy
    assert checkpoint["epoch"] == 0 and checkpoint["sample"] == 2 * CHUNK, checkpoint
    assert checkpoint["order"] == "relaxed" and checkpoint["had"]
    with relaxed() as restarted:
        restarted.load_state_dict(checkpoint)
        rest = labels(restarted)
        assert len(rest) == SAMPLES - 2 * CHUNK
        assert sorted(before + rest) == list(range(SAMPLES))
        assert sorted(labels(restarted)) == list(range(SAMPLES))
