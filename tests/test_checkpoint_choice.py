"""Which epoch the best weights keeps when the validation split cannot tell epochs apart (ties)."""

from __future__ import annotations

import json

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from experiments.callbacks import StateDictCheckpoint


class Scripted(L.LightningModule):
    """Logs the given val/acc and val/loss at each epoch; ``warm`` epochs are head-only."""

    def __init__(self, accs, losses, warm: int = 0):
        super().__init__()
        self.net = nn.Linear(2, 2)
        self.accs, self.losses, self.warm = accs, losses, warm

    @property
    def warming_up(self) -> bool:
        return self.current_epoch < self.warm

    def training_step(self, batch, i):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, i):
        self.log("val/acc", self.accs[self.current_epoch])
        self.log("val/loss", self.losses[self.current_epoch])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Data(L.LightningDataModule):
    def __init__(self, n_val: int = 200, num_classes: int = 2):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        x, y = torch.randn(64, 2, generator=gen), torch.arange(64) % 2
        self.train_set = TensorDataset(x, y)
        self.val_set = TensorDataset(torch.randn(n_val, 2), torch.arange(n_val) % 2)
        self.num_classes = num_classes

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=32)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=100)


def _fit(tmp_path, accs, losses, warm=0, n_val=200):
    ckpt = StateDictCheckpoint(dirpath=str(tmp_path / "ckpt"))
    trainer = L.Trainer(
        max_epochs=len(accs), callbacks=[ckpt], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(Scripted(accs, losses, warm), datamodule=Data(n_val))
    return ckpt, json.loads((tmp_path / "ckpt" / "best.json").read_text())


def test_a_tie_on_the_metric_goes_to_the_lower_val_loss(tmp_path):
    ckpt, best = _fit(tmp_path, [0.5, 1.0, 1.0, 1.0], [0.9, 0.4, 0.2, 0.3])
    assert best["epoch"] == 3 and "lower val/loss" in best["reason"]


def test_a_full_tie_goes_to_the_later_epoch(tmp_path):
    ckpt, best = _fit(tmp_path, [1.0, 1.0, 1.0], [0.2, 0.2, 0.2])
    assert best["epoch"] == 3 and "later epoch" in best["reason"]


def test_an_improvement_wins_whatever_the_loss(tmp_path):
    ckpt, best = _fit(tmp_path, [0.5, 0.6, 0.55], [0.1, 0.9, 0.05])
    assert best["epoch"] == 2 and best["reason"].startswith("val/acc improved")


def test_head_only_epochs_never_win_a_tie(tmp_path):
    # epoch 1 trained the head only and has the lower loss; epoch 2 (whole net) ties on val/acc
    ckpt, best = _fit(tmp_path, [1.0, 1.0, 1.0], [0.1, 0.5, 0.6], warm=1)
    assert best["epoch"] == 2 and "head only" in best["reason"]


def test_a_saturated_or_tiny_validation_split_is_warned_about_and_recorded(tmp_path, caplog):
    ckpt, best = _fit(tmp_path, [1.0, 1.0], [0.2, 0.1], n_val=18)
    text = " ".join(best["warnings"])
    assert "18 samples for 2 classes" in text and "reached its bound 1" in text
    assert "data.val_fraction" in text and "cv.folds" in text
    assert len(best["warnings"]) == 2  # each said once, not every epoch


def test_a_large_unsaturated_split_gives_no_warning(tmp_path):
    ckpt, best = _fit(tmp_path, [0.5, 0.7], [0.9, 0.5], n_val=200)
    assert best["warnings"] == [] and best["epoch"] == 2
