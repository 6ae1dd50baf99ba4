"""Learning-rate schedules defined over the whole run. Each takes ``total_steps`` (and
``total_epochs``), which the LightningModule fills in from the trainer, and is stepped
after every optimizer step."""

from __future__ import annotations

import inspect
import logging
import math
from typing import Annotated

import torch
from torch.optim.lr_scheduler import LambdaLR, OneCycleLR

from experiments.config.hints import Ge, Le
from experiments.errors import UserError

log = logging.getLogger(__name__)


def warmup_cosine(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    total_epochs: int,
    warmup_epochs: Annotated[float, Ge(0)] = 1.0,
    min_lr_ratio: Annotated[float, Ge(0), Le(1)] = 0.0,
) -> LambdaLR:
    """Linear warmup from 0 to the optimizer's lr over ``warmup_epochs``, then a cosine
    decay to ``min_lr_ratio`` x lr at the last step."""
    warmup = round(total_steps * _warmup_share(warmup_epochs, total_epochs))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)


def one_cycle(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    total_epochs: int,
    warmup_epochs: float = 0.3,
    div_factor: float = 25.0,
    final_div_factor: float = 1e4,
) -> OneCycleLR:
    """torch's one-cycle schedule peaking at the optimizer's lr after ``warmup_epochs``."""
    pct = max(_warmup_share(warmup_epochs, total_epochs), 1e-3)
    # torch's warm-up ends at step pct * total_steps - 1 and divides by that length: a
    # warm-up of exactly one step (6 steps, 1/6 of them) was a ZeroDivisionError. Two steps
    # at least, and one left for the descent (a few-step run: debug=fast, limits)
    pct = min(max(pct, 2 / total_steps), 1 - 1 / total_steps) if total_steps > 2 else 0.75
    max_lr = [group["lr"] for group in optimizer.param_groups]
    return OneCycleLR(optimizer, max_lr, total_steps, pct_start=pct, div_factor=div_factor,
                      final_div_factor=final_div_factor)  # fmt: skip


def _warmup_share(warmup_epochs: float, total_epochs: int) -> float:
    """The warmup's share of the run. The config check refuses a warmup as long as the run
    before training; a run cut shorter by the trainer (fast_dev_run, limits) gets half."""
    share = warmup_epochs / max(total_epochs, 1)
    if not 0 <= share < 1:
        log.warning("warmup of %s epochs in a %d-epoch run: warming up over half of it",
                    warmup_epochs, total_epochs)  # fmt: skip
        share = 0.5
    return share


def with_scheduler(module, optimizer, scheduler_factory, interval: str, monitor: str | None):
    """What ``configure_optimizers`` returns for ``optimizer`` and an optional scheduler
    partial: a schedule over the whole run (it takes ``total_steps``) is told the run's
    length and stepped per optimizer step; another one every ``interval``."""
    if scheduler_factory is None:
        return optimizer
    try:
        whole_run = "total_steps" in inspect.signature(scheduler_factory).parameters
    except (TypeError, ValueError):
        whole_run = False
    if whole_run:
        scheduler = scheduler_factory(
            optimizer,
            total_steps=int(module.trainer.estimated_stepping_batches),
            total_epochs=int(module.trainer.max_epochs),
        )
        interval = "step"
    else:
        scheduler = scheduler_factory(optimizer)
    config = {"scheduler": scheduler, "interval": interval, "monitor": monitor}
    return {"optimizer": optimizer, "lr_scheduler": config}


class TaskSteps:
    """The steps every task module shares, mixed in before ``L.LightningModule``:
    train/val/test each call ``_shared_step(batch, stage)``, and ``configure_optimizers``
    builds the optimizer over ``trained_parameters()`` with ``with_scheduler`` (the
    classifier builds its own for fine-tuning's parameter groups). The module keeps its
    arguments ``optimizer`` (a partial taking the parameters, ``optimizer=adamw``; None only
    for a module that is evaluated, never trained) and ``scheduler`` (a partial, or None) as
    ``optimizer_factory`` and ``scheduler_factory``, and ``scheduler_interval`` (epoch or
    step) and ``monitor`` (what ``scheduler=plateau`` watches) under their own names."""

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, "train")

    def validation_step(self, batch, batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def configure_optimizers(self):
        if self.optimizer_factory is None:
            raise UserError(f"model: {type(self).__name__} was built without an optimizer to train")
        optimizer = self.optimizer_factory(self.trained_parameters())
        return with_scheduler(
            self, optimizer, self.scheduler_factory, self.scheduler_interval, self.monitor
        )
