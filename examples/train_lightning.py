"""Lightning with batchcast: a LightningDataModule returning batchcast.DataLoader.

    python examples/train_lightning.py --lr 0.01 &
    python examples/train_lightning.py --lr 0.05; wait

Both runs read one training stream ("lightning-example-train") and one validation stream
("lightning-example-val": another pipeline needs another key). Lightning's sanity check
iterates the validation loader for two batches and breaks: the next validation pass starts a
whole epoch, nothing is drained. Needs `lightning` (pip install lightning).
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl
import torch
import torchvision
from torch import nn

import batchcast


def fake(samples: int, seed: int) -> torchvision.datasets.FakeData:
    return torchvision.datasets.FakeData(samples, (3, 32, 32), 10, random_offset=seed,
                                         transform=torchvision.transforms.ToTensor())


class Data(pl.LightningDataModule):
    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self) -> batchcast.DataLoader:
        return batchcast.DataLoader(fake(1024, 0), batch_size=self.batch_size, shuffle=True,
                                    num_workers=2, share="lightning-example-train")

    def val_dataloader(self) -> batchcast.DataLoader:
        return batchcast.DataLoader(fake(256, 10_000), batch_size=self.batch_size,
                                    num_workers=1, share="lightning-example-val")


class Classifier(pl.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    def training_step(self, batch, index):
        images, labels = batch
        loss = nn.functional.cross_entropy(self.net(images), labels)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, index):
        images, labels = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(images), labels))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="auto", devices=1,
                         enable_progress_bar=False)
    trainer.fit(Classifier(args.lr), datamodule=Data(args.batch_size))


if __name__ == "__main__":
    main()
