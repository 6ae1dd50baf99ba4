"""Weights-only checkpoints: the network's state_dict, safe to load with weights_only=True."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import lightning as L
from omegaconf import OmegaConf

from experiments.runs.files import write_json
from experiments.runs.weights import save_state_dict

log = logging.getLogger(__name__)


class StateDictCheckpoint(L.Callback):
    """Save ``net.state_dict()`` to ``last.pt`` every epoch and ``best.pt`` on improvement.

    Only weights are saved (no optimizer, no pickled code), atomically, with keys free of
    torch.compile's ``_orig_mod.``; each file gets a JSON sidecar (``best.json``,
    ``last.json``) with epoch, step, the monitored value and the net's config. A NaN or
    infinite monitored value never replaces ``best.pt``.

    Args:
        dirpath: folder of the files; None means ``<trainer.default_root_dir>/checkpoints``.
        monitor: metric deciding "best" (logged by the module or a callback).
        mode: ``max`` or ``min``.
        save_last: also write ``last.pt`` at the end of every training epoch.
        net_config: the net's config, recorded in the sidecars (so the file can be rebuilt).
    """

    def __init__(
        self,
        dirpath: str | None = None,
        monitor: str = "val/acc",
        mode: str = "max",
        save_last: bool = True,
        net_config: Any = None,
    ) -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        self.dirpath = Path(dirpath) if dirpath else None
        self.monitor = monitor
        self.mode = mode
        self.save_last = save_last
        self.net_config = (
            OmegaConf.to_container(net_config, resolve=True)
            if OmegaConf.is_config(net_config)
            else net_config
        )
        self.best_score: float | None = None
        self.best_epoch: int | None = None

    @property
    def best_path(self) -> Path | None:
        return self.dirpath / "best.pt" if self.dirpath else None

    @property
    def last_path(self) -> Path | None:
        return self.dirpath / "last.pt" if self.dirpath else None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = Path(trainer.default_root_dir) / "checkpoints"

    def _improved(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best_score is None:
            return True
        return value > self.best_score if self.mode == "max" else value < self.best_score

    def _save(self, trainer, pl_module, name: str, value: float | None) -> None:
        # every rank takes part (FSDP gathers the full weights collectively); rank 0 writes
        full = trainer.strategy.lightning_module_state_dict()
        # the module names the weights it validates and exports (an EMA of them, say)
        prefix = getattr(pl_module, "export_prefix", "net." if hasattr(pl_module, "net") else "")
        weights = {k[len(prefix) :]: v for k, v in full.items() if k.startswith(prefix)}
        if not trainer.is_global_zero:
            return
        path = save_state_dict(weights, self.dirpath / f"{name}.pt")
        datamodule = trainer.datamodule
        write_json(
            path.with_suffix(".json"),
            {
                "file": path.name,
                # 1-based, as the console counts epochs ("epoch 3/20")
                "epoch": trainer.current_epoch + 1,
                "epoch_base": 1,
                "global_step": trainer.global_step,
                "monitor": self.monitor,
                "value": value,
                "net": self.net_config,
                "in_shape": list(getattr(datamodule, "input_shape", []) or []),
                "class_names": list(getattr(datamodule, "class_names", []) or []),
            },
        )

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.fast_dev_run:
            return
        current = trainer.callback_metrics.get(self.monitor)
        if current is None:
            return
        value = float(current)
        if not math.isfinite(value):
            log.warning(
                "%s is %s at epoch %d: best.pt kept as it was",
                self.monitor,
                value,
                trainer.current_epoch,
            )
            return
        if self._improved(value):
            self.best_score, self.best_epoch = value, trainer.current_epoch
            self._save(trainer, pl_module, "best", value)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not self.save_last or trainer.fast_dev_run:
            return
        current = trainer.callback_metrics.get(self.monitor)
        self._save(trainer, pl_module, "last", None if current is None else float(current))

    def state_dict(self) -> dict[str, Any]:
        return {"best_score": self.best_score, "best_epoch": self.best_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best_score = state_dict.get("best_score")
        self.best_epoch = state_dict.get("best_epoch")
