"""A callback for tests/test_one_meaning.py, importable in the CLI's subprocess."""

from __future__ import annotations

import torch
from lightning.pytorch import Callback


class CollapseAtEpoch(Callback):
    """Zero the net's weights before epoch ``epoch``'s validation (1-based): a run that
    collapses late, so its last epoch scores chance while ``best.pt`` keeps a good epoch
    (every logit equal: each sample is predicted as the first class).

    Args:
        epoch: the epoch whose validation sees the zeroed weights.
    """

    def __init__(self, epoch: int = 1) -> None:
        self.epoch = epoch

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.current_epoch + 1 != self.epoch:
            return
        with torch.no_grad():
            for param in pl_module.parameters():
                param.zero_()
