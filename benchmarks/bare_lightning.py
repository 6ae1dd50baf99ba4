"""Bare Lightning: the same net, data and optimizer in a minimal LightningModule, a
Trainer with no logger, no callbacks, no checkpointing, no progress bar, no summary.

As a script it is the start-up reference: ``python -m benchmarks.bare_lightning
--first-step-file F`` writes ``time.time()`` at its first training step and exits.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning as L
import torch
from torch import nn


class BareModule(L.LightningModule):
    def __init__(self, net: nn.Module, lr: float = 0.1, momentum: float = 0.9) -> None:
        super().__init__()
        self.net = net
        self.lr, self.momentum = lr, momentum
        self.loss_fn = nn.CrossEntropyLoss()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.loss_fn(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return self.loss_fn(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=self.lr, momentum=self.momentum)


def bare_trainer(
    epochs: int, callbacks: list, out_dir: Path, accelerator: str = "cpu", precision="32-true"
) -> L.Trainer:
    return L.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,
        max_epochs=epochs,
        logger=False,
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(out_dir),
    )


def main() -> None:
    # the start-up reference: what a user would write by hand for the default run
    # (digits PNGs decoded into memory, the default MLP, SGD, Lightning's defaults)
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True, help="folder with labels.csv and images/")
    parser.add_argument("--first-step-file", required=True)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()

    import csv

    import numpy as np
    from PIL import Image
    from torch.utils.data import DataLoader, TensorDataset, random_split

    from benchmarks.probe import StepTimer

    root = Path(args.data_dir)
    with open(root / "labels.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    images = np.stack([np.asarray(Image.open(root / "images" / r["filename"])) for r in rows])
    x = (torch.from_numpy(images).float().div(255).unsqueeze(1) - 0.3) / 0.35  # (N, 1, 8, 8)
    y = torch.tensor([int(r["label"]) for r in rows])
    train, val, _ = random_split(TensorDataset(x, y), [0.7, 0.15, 0.15])
    net = nn.Sequential(
        nn.Flatten(),
        nn.Linear(64, 128),
        nn.ReLU(),
        nn.Linear(128, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )
    timer = StepTimer(first_step_file=args.first_step_file, exit_after_first=True)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, callbacks=[timer], default_root_dir=args.out_dir
    )
    trainer.fit(
        BareModule(net),
        DataLoader(train, batch_size=64, shuffle=True),
        DataLoader(val, batch_size=64),
    )


if __name__ == "__main__":
    main()
