"""Report ``optimized_metric`` to this job's Optuna trial every epoch; stop when pruned."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from experiments.compat.optuna import trial_by_number
from experiments.runs.sweep import TRIAL_ENV
from experiments.tracking.optuna_study import open_study

log = logging.getLogger(__name__)


class TrialReporter(L.Callback):
    """Reports ``monitor`` to the Optuna trial after every validation and stops training
    when the study's pruner prunes the trial (``pruned_at_epoch`` says when).

    Only global rank 0 talks to the study; its decision is broadcast, so every DDP rank
    stops at the same epoch.
    """

    def __init__(self, settings: Mapping[str, Any], sweep_dir: Path, name: str, number: int,
                 monitor: str) -> None:  # fmt: skip
        self.settings, self.sweep_dir = dict(settings), Path(sweep_dir)
        self.name, self.number, self.monitor = name, number, monitor
        self.pruned_at_epoch: int | None = None
        self._trial = None

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        prune = False
        value = trainer.callback_metrics.get(self.monitor)
        if trainer.is_global_zero and value is not None:
            if self._trial is None:
                study = open_study(self.settings, self.sweep_dir, self.name, create=False)
                self._trial = trial_by_number(study, self.number)
            epoch = trainer.current_epoch
            self._trial.report(float(value), step=epoch)
            prune = self._trial.should_prune()
            if prune:
                self._trial.set_user_attr("pruned_at_epoch", epoch)
                pruner = self.settings.get("pruner")
                log.info("pruned by the %s pruner at epoch %d (%s=%.4f)", pruner, epoch + 1,
                         self.monitor, float(value))  # fmt: skip
        if trainer.world_size > 1:
            prune = trainer.strategy.broadcast(prune, src=0)
        if prune:
            self.pruned_at_epoch = trainer.current_epoch
            trainer.should_stop = True


def trial_reporter(cfg) -> list[TrialReporter]:
    """``[TrialReporter]`` when this job is a trial of our Optuna sweeper that prunes."""
    number = os.environ.get(TRIAL_ENV)
    if number is None or not HydraConfig.initialized():
        return []
    hydra_cfg = HydraConfig.get()
    settings = OmegaConf.to_container(hydra_cfg.sweeper, resolve=True)
    if str(settings.get("pruner") or "none") == "none":
        return []
    sweep_dir = Path(hydra_cfg.sweep.dir)
    name = settings.get("study_name") or sweep_dir.name
    return [TrialReporter(settings, sweep_dir, name, int(number), str(cfg.optimized_metric))]
