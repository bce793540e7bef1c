"""Real training loops on batchcast batches: HF-style dict batches through
DataLoader(share=), NumPy and JAX (DLPack) through Loader, and a Lightning LightningDataModule
returning batchcast.DataLoader. JAX and Lightning run where they are installed (the GPU
machine); elsewhere those tests skip, saying so.

Run: .venv/bin/python -m pytest tests/python/test_dataloader_frameworks.py
"""

from __future__ import annotations

import os
import uuid

import numpy
import pytest
import torch
from torch.utils.data import Dataset

import batchcast
from batchcast.dataloader import share_paths
from conftest import watch_endpoint


class Tokens(Dataset):
    """HF-style samples: input_ids starting at i, an attention mask, a label."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int):
        return {
            "input_ids": torch.arange(8) + i,
            "attention_mask": torch.ones(8, dtype=torch.int64),
            "labels": torch.tensor(i % 2),
        }


@pytest.fixture
def key():
    """A fresh share key (and its "-val" twin): endpoints watched, files removed after."""
    key = f"test-{uuid.uuid4().hex[:8]}"
    all_paths = [share_paths(k) for k in (key, key + "-val")]
    for paths in all_paths:
        watch_endpoint(paths["endpoint"])
    yield key
    for paths in all_paths:
        for name in ("lock", "state", "log"):
            if os.path.exists(paths[name]):
                os.unlink(paths[name])


def test_dict_batches_train_an_hf_style_model(key):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 4), torch.nn.Flatten(),
                                torch.nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = batchcast.DataLoader(Tokens(), batch_size=8, shuffle=True, share=key)
    for _ in range(2):
        firsts = []
        for batch in loader:
            assert sorted(batch) == ["attention_mask", "input_ids", "labels"]
            logits = model(batch["input_ids"] * batch["attention_mask"])
            loss = torch.nn.functional.cross_entropy(logits, batch["labels"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            assert torch.equal(batch["labels"], batch["input_ids"][:, 0] % 2)
            firsts += batch["input_ids"][:, 0].tolist()
        assert sorted(firsts) == list(range(32))
    loader.close()


def serve(endpoint: str):
    return batchcast.serve(synthetic=64, sample_bytes=16, endpoint=endpoint, batch_size=16,
                           epochs=2, workers=1)


def test_numpy_training_loop(endpoint, batchcast_bin):
    w = numpy.zeros(16)
    with serve(endpoint):
        loader = batchcast.Loader(endpoint, batch_size=16, framework="numpy")
        for _ in range(2):
            seen = 0
            for x, y in loader:
                features = x.astype(numpy.float64) / 255.0
                error = features @ w - (y % 2)
                w -= 0.1 * features.T @ error / len(y)
                seen += len(y)
            assert seen == 64
        loader.close()
    assert numpy.isfinite(w).all() and w.any()


def test_jax_training_loop_through_dlpack(endpoint, batchcast_bin):
    jax = pytest.importorskip("jax", reason="JAX is not installed here (runs on the GPU machine)")
    import jax.numpy as jnp

    def loss(w, x, y):
        return jnp.mean((x @ w - y) ** 2)

    step = jax.jit(lambda w, x, y: w - 0.1 * jax.grad(loss)(w, x, y))
    w = jnp.zeros(16)
    with serve(endpoint):
        loader = batchcast.Loader(endpoint, batch_size=16, framework="dlpack")
        for _ in range(2):
            seen = 0
            for x, y in loader:
                x, y = jax.dlpack.from_dlpack(x), jax.dlpack.from_dlpack(y)
                w = step(w, x.astype(jnp.float32) / 255.0, (y % 2).astype(jnp.float32))
                seen += int(y.shape[0])
            assert seen == 64
        loader.close()
    assert bool(jnp.isfinite(w).all())


def test_lightning_datamodule_returning_batchcast_dataloader(key, tmp_path):
    pl = pytest.importorskip("lightning.pytorch",
                             reason="Lightning is not installed here (runs on the GPU machine)")
    from test_dataloader import Numbers

    seen = []

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def training_step(self, batch, index):
            x, y = batch
            seen.extend(y.tolist())
            return torch.nn.functional.mse_loss(self.linear(x).squeeze(1), y.float())

        def validation_step(self, batch, index):
            x, y = batch
            return torch.nn.functional.mse_loss(self.linear(x).squeeze(1), y.float())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-4)

    loaders = []

    class Data(pl.LightningDataModule):
        def train_dataloader(self):
            loaders.append(batchcast.DataLoader(Numbers(), batch_size=4, shuffle=True, share=key))
            return loaders[-1]

        def val_dataloader(self):  # another pipeline: another key
            loaders.append(batchcast.DataLoader(Numbers(8, transform="val"), batch_size=4,
                                                share=key + "-val"))
            return loaders[-1]

    trainer = pl.Trainer(max_epochs=2, accelerator="auto", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         num_sanity_val_steps=2, default_root_dir=str(tmp_path))
    trainer.fit(Module(), datamodule=Data())
    for loader in loaders:
        loader.close()
    assert sorted(seen) == sorted(list(range(40)) * 2)  # two whole epochs, sanity check aside
