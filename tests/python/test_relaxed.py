"""Relaxed order (docs/stream.md, Order) against real `batchcast serve` servers and processes:
each epoch of a relaxed reader is its shard once, whatever its speed and whenever it joined; its
rows are the right samples' bytes; exact and relaxed readers share one stream; a late relaxed
joiner reads nothing regenerated for it alone; the drop-in's share_order; a relaxed reader
resumed from its state_dict() mid-epoch reads the rest of that epoch once, and a bad state is
refused naming what is wrong.

Run: .venv/bin/python -m pytest tests/python/test_relaxed.py
Synthetic sample i: "#0" = uint8 bytes synthetic_byte(i, j), "#1" = int64 label i.
"""

from __future__ import annotations

import json
import re
import textwrap
import threading
from typing import Dict, List

import pytest
import torch

import batchcast
from batchcast._resume_state import HadSet
from conftest import synthetic_rows
from loader_common import SAMPLE_BYTES, serve

SAMPLES = 120

# A reader process: reads every epoch with a pause per batch, checks each row's bytes against
# its label, prints each epoch's labels as a JSON line.
READER = textwrap.dedent("""
    import json, sys, time
    import torch
    import batchcast
    from conftest import synthetic_rows
    from loader_common import SAMPLE_BYTES
    endpoint, order, pause, batch = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    loader = batchcast.Loader(endpoint, batch_size=batch, timeout=60,
                              order=None if order == "server" else order)
    for epoch in range(int(sys.argv[5])):
        labels = []
        for x, y in loader:
            assert torch.equal(x, synthetic_rows(y, SAMPLE_BYTES)), "payload differs from label"
            labels += y.tolist()
            time.sleep(pause)
        print(json.dumps(labels), flush=True)
""")


def epochs_of(proc) -> List[List[int]]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    return [json.loads(line) for line in out.decode().splitlines() if line.startswith("[")]


def test_relaxed_readers_of_different_speeds_get_each_epoch_once(endpoint, batchcast_bin,
                                                                 run_py):
    with serve(endpoint, samples=SAMPLES, batch=8, epochs=3, min_consumers=2,
               order="relaxed") as server:
        fast = run_py(READER, endpoint, "server", "0", "8", "3")
        slow = run_py(READER, endpoint, "relaxed", "0.02", "5", "3")
        for proc in (fast, slow):
            epochs = epochs_of(proc)
            assert len(epochs) == 3
            for labels in epochs:
                assert sorted(labels) == list(range(SAMPLES)), "an epoch is not the shard once"
        assert server.wait(30) == 0


def test_exact_and_relaxed_readers_share_one_stream(endpoint, batchcast_bin, run_py):
    with serve(endpoint, samples=SAMPLES, batch=8, epochs=2, min_consumers=2) as server:
        exact = run_py(READER, endpoint, "exact", "0", "8", "2")
        relaxed = run_py(READER, endpoint, "relaxed", "0.01", "8", "2")
        exact_epochs, relaxed_epochs = epochs_of(exact), epochs_of(relaxed)
        assert server.wait(30) == 0
    for labels in exact_epochs + relaxed_epochs:
        assert sorted(labels) == list(range(SAMPLES))
    # The exact reader reads the seeded order: a second exact reader of a fresh server agrees.
    with serve(endpoint, samples=SAMPLES, batch=8, epochs=2) as server:
        again = epochs_of(run_py(READER, endpoint, "exact", "0", "8", "2"))
        assert server.wait(30) == 0
    assert again == exact_epochs


def test_a_late_relaxed_reader_reads_from_the_stream_at_once(endpoint, batchcast_bin):
    with serve(endpoint, samples=SAMPLES, batch=8, epochs=3, order="relaxed") as server:
        first = batchcast.Loader(endpoint, batch_size=8, timeout=30)
        it = iter(first)
        for _ in range(5):  # the first reader is well into its first epoch
            next(it)
        late = batchcast.Loader(endpoint, batch_size=8, timeout=30)
        late_epochs: List[List[int]] = []

        def read_late() -> None:
            for _ in range(3):
                late_epochs.append([int(v) for _, y in late for v in y])

        t = threading.Thread(target=read_late)
        t.start()
        for _ in it:
            pass
        for _ in range(2):
            for _ in first:
                pass
        t.join(60)
        first.close()
        late.close()
        assert server.wait(30) == 0
        with open(server.log_path) as f:
            text = f.read()
    assert len(late_epochs) == 3
    for labels in late_epochs:
        assert sorted(labels) == list(range(SAMPLES))
    done = re.search(r"(\d+) chunks regenerated", text)
    assert done and done.group(1) == "0", "a relaxed joiner was sent chunks made for it alone"


def test_relaxed_rows_are_copies_the_user_may_keep(endpoint, batchcast_bin):
    with serve(endpoint, samples=SAMPLES, batch=8, epochs=1, order="relaxed") as server:
        loader = batchcast.Loader(endpoint, batch_size=16, timeout=30)
        kept: Dict[int, torch.Tensor] = {}
        for x, y in loader:  # every batch kept: relaxed rows never pin the ring
            for row, label in zip(x, y.tolist()):
                kept[label] = row
        loader.close()
        assert server.wait(30) == 0
    assert sorted(kept) == list(range(SAMPLES))
    for label, row in kept.items():
        assert torch.equal(row, synthetic_rows(torch.tensor([label]), SAMPLE_BYTES)[0])


def test_a_bad_order_names_the_choices(endpoint):
    with pytest.raises(ValueError, match="exact, relaxed"):
        batchcast.Loader(endpoint, order="sideways", timeout=1)


def read_batches(it, n=None) -> List[int]:
    """The labels of the next ``n`` batches of ``it`` (all, for None), each row's bytes checked
    against its label."""
    labels: List[int] = []
    for i, (x, y) in enumerate(it):
        assert torch.equal(x, synthetic_rows(y, SAMPLE_BYTES)), "payload differs from label"
        labels += y.tolist()
        if n is not None and i + 1 == n:
            break
    return labels


def _had(state) -> set:
    """The dataset indices a relaxed state's ``had`` lists."""
    bits = HadSet.decode(state["epoch"], state["had"]).bits()
    return {8 * k + i for k, byte in enumerate(bits) for i in range(8) if byte >> i & 1}


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_resumed_relaxed_reader_reads_the_rest_of_its_epoch_once(endpoint, batchcast_bin,
                                                                    drop_last):
    # 120 samples in batches of 16: 7 whole batches and 8 samples, a short last batch.
    with serve(endpoint, samples=SAMPLES, batch=8, epochs=3, order="relaxed") as server:
        # Another trainer stays attached meanwhile: the stream lives on while one restarts.
        keeper = batchcast.Loader(endpoint, batch_size=16, timeout=30)
        first = batchcast.Loader(endpoint, batch_size=16, timeout=30, drop_last=drop_last)
        before = read_batches(iter(first), 3)
        state = json.loads(json.dumps(first.state_dict()))  # a checkpoint's copy
        first.close()
        assert state["epoch"] == 0 and state["sample"] == 48 and state["order"] == "relaxed"
        assert _had(state) == set(before), "the state's had is not the samples yielded"
        resumed = batchcast.Loader(endpoint, batch_size=16, timeout=30, drop_last=drop_last)
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state  # loaded, not yet read
        batches = 0
        rest: List[int] = []
        for x, y in resumed:
            assert torch.equal(x, synthetic_rows(y, SAMPLE_BYTES))
            rest += y.tolist()
            batches += 1
        assert batches + 3 == len(resumed) == (7 if drop_last else 8)
        if drop_last:  # the short last batch is dropped: 8 samples the epoch never yields
            assert len(rest) == 64 and len(set(before + rest)) == 112
        else:
            assert sorted(before + rest) == list(range(SAMPLES)), "not the shard once"
        assert resumed.state_dict()["epoch"] == 1 and resumed.state_dict()["sample"] == 0
        after = read_batches(resumed)  # the next epoch, whole
        assert len(after) == (112 if drop_last else SAMPLES) and len(set(after)) == len(after)
        resumed.close()
        keeper.close()
        assert server.wait(30) == 0


def test_a_relaxed_reader_resumes_on_a_new_server(endpoint, batchcast_bin):
    # The trainer and its server both stopped (a job restarted): its state resumes on a new one.
    with serve(endpoint, samples=SAMPLES, batch=8, epochs=2, order="relaxed") as server:
        first = batchcast.Loader(endpoint, batch_size=8, timeout=30)
        before = read_batches(iter(first), 6)
        state = first.state_dict()
        first.close()
        assert server.wait(30) == 0  # its only reader left: a relaxed-only stream ends
    with serve(endpoint, samples=SAMPLES, batch=8, epochs=2, order="relaxed") as server:
        resumed = batchcast.Loader(endpoint, batch_size=8, timeout=30)
        resumed.load_state_dict(state)
        rest = read_batches(resumed)
        assert sorted(before + rest) == list(range(SAMPLES)), "not the shard once"
        assert sorted(read_batches(resumed)) == list(range(SAMPLES))  # epoch 1, whole
        resumed.close()
        assert server.wait(30) == 0


def test_a_bad_relaxed_state_is_refused_naming_what_is_wrong(endpoint, batchcast_bin):
    with serve(endpoint, samples=SAMPLES, batch=8, epochs=2, order="relaxed"):
        keeper = batchcast.Loader(endpoint, batch_size=8, timeout=30)
        first = batchcast.Loader(endpoint, batch_size=8, timeout=30)
        read_batches(iter(first), 2)
        state = first.state_dict()
        first.close()
        loader = batchcast.Loader(endpoint, batch_size=8, timeout=30)
        with pytest.raises(ValueError, match="'had' lists 16 samples of epoch 0, its 'sample' "
                                             "says 17"):
            loader.load_state_dict({**state, "sample": 17})
        with pytest.raises(ValueError, match="'had' is not the text state_dict\\(\\) wrote"):
            loader.load_state_dict({**state, "had": "not base64!"})
        with pytest.raises(KeyError, match="lacks \\['had'\\]"):
            loader.load_state_dict({"epoch": 0, "sample": 16, "order": "relaxed"})
        with pytest.raises(ValueError, match="inside epoch 0 \\(sample 16\\) of a Loader in exact "
                                             "order"):
            loader.load_state_dict({"epoch": 0, "sample": 16})
        exact = batchcast.Loader(endpoint, batch_size=8, timeout=30, order="exact")
        with pytest.raises(ValueError, match="serves this Loader in exact order"):
            exact.load_state_dict(state)
        exact.close()
        # What only the server can tell: samples outside the dataset (or this rank's shard).
        foreign = HadSet(0)
        foreign.add(0, list(range(15)) + [SAMPLES + 7])
        loader.load_state_dict({**state, "had": foreign.encode()})
        with pytest.raises(batchcast.PositionUnavailableError,
                           match=f"sample {SAMPLES + 7} had is outside the dataset of {SAMPLES}"):
            next(iter(loader))
        # A seek inside a relaxed epoch without its samples had is refused too.
        loader.seek(0, 16)
        with pytest.raises(batchcast.PositionUnavailableError, match="and none came"):
            next(iter(loader))
        # The good state still resumes on the same Loader.
        loader.load_state_dict(state)
        rest = read_batches(iter(loader))
        assert sorted(rest + sorted(_had(state))) == list(range(SAMPLES))
        loader.close()
        keeper.close()
