"""Weights-only checkpoints: the network's state_dict as safetensors (tensors only, nothing
that could run code when loaded)."""

from __future__ import annotations

import logging
import math
from itertools import chain
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import OmegaConf

from experiments.errors import UserError
from experiments.runs.files import write_json
from experiments.runs.layout import (
    OLD_WEIGHTS_SUFFIX,
    WEIGHTS_SUFFIX,
    RunDir,
    sidecar_of,
    weights_file,
)
from experiments.runs.weights import save_state_dict

log = logging.getLogger(__name__)

# the choice of the best epoch so far, as a full checkpoint carries it into a resumed run
_STATE = ("best_score", "best_epoch", "best_tie_value", "best_warming_up", "reason")


class StateDictCheckpoint(L.Callback):
    """Save the weights the module validates and exports (its ``export_prefix``: the net, or
    an EMA of it) to ``last.safetensors`` every epoch and ``best.safetensors`` on improvement.

    Each file is written atomically, without torch.compile's ``_orig_mod.``, with a JSON
    sidecar (``best.json``, ``last.json``: epoch, step, the monitored value, the net's config).
    A NaN or infinite monitored value never replaces the best weights; a run resumed from
    before safetensors has its ``best.pt``/``last.pt`` removed at the first new save.

    A tie on ``monitor`` (common on a small validation split: val/acc 1.0 from epoch 1) is
    broken by ``tie_break`` (lower is better), then by the later epoch; an epoch of a
    fine-tune's head-only phase (the module's ``warming_up``) never wins a tie against one
    that trained the whole net. ``best.json`` says why its epoch was chosen, and a one-line
    warning (kept in ``warnings``, recorded in ``best.json``) says when the validation split
    is too small to rank epochs or saturates at the metric's bound.

    Args:
        dirpath: folder of the files; None means ``<trainer.default_root_dir>/checkpoints``.
        monitor: metric deciding "best" (logged by the module or a callback).
        mode: ``max`` or ``min``.
        save_last: also write ``last.safetensors`` at the end of every training epoch.
        net_config: the net's config, recorded in the sidecars (so the file can be rebuilt).
        tie_break: the metric (lower is better) that breaks a tie on ``monitor``.
        min_val_per_class: fewer validation samples per class than this is warned about.
    """

    def __init__(
        self,
        dirpath: str | None = None,
        monitor: str = "val/acc",
        mode: str = "max",
        save_last: bool = True,
        net_config: Any = None,
        tie_break: str | None = "val/loss",
        min_val_per_class: int = 20,
    ) -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        self.dirpath = Path(dirpath) if dirpath else None
        self.monitor, self.mode, self.save_last = monitor, mode, save_last
        self.net_config = (
            OmegaConf.to_container(net_config, resolve=True)
            if OmegaConf.is_config(net_config)
            else net_config
        )
        self.tie_break, self.min_val_per_class = tie_break, min_val_per_class
        self.load_state_dict({})  # no best epoch yet, no warning said

    @property
    def best_path(self) -> Path | None:
        """The best weights (an older run resumed: its ``best.pt`` until replaced)."""
        return weights_file(self.dirpath, "best") if self.dirpath else None

    @property
    def last_path(self) -> Path | None:
        return weights_file(self.dirpath, "last") if self.dirpath else None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = RunDir(trainer.default_root_dir).checkpoints

    def _choice(self, value: float, tie: float | None, warming_up: bool) -> str | None:
        """Why this epoch replaces the best one, or None when the best one stays."""
        if not math.isfinite(value):
            return None
        name = self.monitor
        if self.best_score is None:
            return f"first {name} = {value:.6g}"
        if value != self.best_score:
            better = value > self.best_score if self.mode == "max" else value < self.best_score
            return f"{name} improved: {self.best_score:.6g} -> {value:.6g}" if better else None
        at = f"tie on {name} = {value:.6g} with epoch {self.best_epoch + 1}"
        if warming_up != self.best_warming_up:
            return None if warming_up else f"{at}, which trained the head only"
        old = self.best_tie_value
        if tie is not None and old is not None and math.isfinite(tie) and tie != old:
            return f"{at}; lower {self.tie_break}: {tie:.6g} < {old:.6g}" if tie < old else None
        return f"{at}; the later epoch is kept"

    def _save(self, trainer, pl_module, name: str, value: float | None) -> None:
        # every rank takes part (FSDP gathers the full weights collectively); rank 0 writes
        full = trainer.strategy.lightning_module_state_dict()
        prefix = export_prefix(pl_module)
        weights = {k[len(prefix) :]: v for k, v in full.items() if k.startswith(prefix)}
        if not trainer.is_global_zero:
            return
        path = save_state_dict(weights, self.dirpath / f"{name}{WEIGHTS_SUFFIX}")
        # an older run resumed: its .pt is superseded, and readers would otherwise have two
        (self.dirpath / f"{name}{OLD_WEIGHTS_SUFFIX}").unlink(missing_ok=True)
        write_json(
            sidecar_of(path),
            {
                "file": path.name,
                # 1-based, as the console counts epochs ("epoch 3/20")
                "epoch": trainer.current_epoch + 1,
                "epoch_base": 1,
                "global_step": trainer.global_step,
                "monitor": self.monitor,
                "value": value,
                "net": self.net_config,
                **_data_facts(trainer.datamodule),
                # every validation scalar of this epoch: what "val/*" means at the chosen epoch
                "metrics": _val_scalars(trainer.callback_metrics),
                **({"reason": self.reason, "warnings": self.warnings} if name == "best" else {}),
            },
        )

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.fast_dev_run:
            return
        current = trainer.callback_metrics.get(self.monitor)
        if current is None:
            self._missing(trainer)
            return
        value = float(current)
        if not math.isfinite(value):
            log.warning("%s is %s at epoch %d: the best weights kept as they were",
                        self.monitor, value, trainer.current_epoch)  # fmt: skip
            return
        self._check_ranking(trainer, value)
        tie = trainer.callback_metrics.get(self.tie_break) if self.tie_break else None
        tie = None if tie is None else float(tie)
        warming_up = bool(getattr(pl_module, "warming_up", False))
        reason = self._choice(value, tie, warming_up)
        if reason is not None:
            self.best_score, self.best_epoch = value, trainer.current_epoch
            self.best_tie_value, self.best_warming_up, self.reason = tie, warming_up, reason
            self._save(trainer, pl_module, "best", value)

    def _missing(self, trainer) -> None:
        """No ``monitor`` after a whole validation: every epoch would be judged on nothing
        (no best weights, a sweeper given None), so the run stops at the first one, naming
        what the module logged instead."""
        if trainer.limit_val_batches == 0 or not trainer.num_val_batches:
            return  # no validation ran: nothing could have been logged
        logged = sorted(str(k) for k in trainer.callback_metrics if str(k).startswith("val/"))
        logged = logged or sorted(str(k) for k in trainer.callback_metrics)
        raise UserError(
            f"optimized_metric={self.monitor} was not logged by the first validation; the "
            f"module logged {', '.join(logged) or 'nothing'}: set optimized_metric=<one of "
            f"them> (and optimized_mode=min|max), or log {self.monitor} in validation_step"
        )

    def _check_ranking(self, trainer, value: float) -> None:
        """Warn once when the validation split cannot rank epochs: too few samples per
        class, or the monitored value at its bound (accuracy-like 1.0, or 0 when minimized)."""
        advice = "use a larger data.val_fraction or k-fold (cv.folds=5)"
        datamodule = trainer.datamodule
        n_val = len(getattr(datamodule, "val_set", None) or ())
        n_classes = int(getattr(datamodule, "num_classes", 0) or 0)
        if n_val and n_classes and n_val / n_classes < self.min_val_per_class:
            self._warn(
                "too small",
                f"the validation split has {n_val} samples for {n_classes} classes "
                f"(< {self.min_val_per_class} per class): too few to rank epochs; {advice}",
            )
        bounded = any(w in self.monitor.split("/")[-1] for w in ("acc", "f1", "recall", "prec"))
        bound = 1.0 if self.mode == "max" else 0.0
        if (bounded or self.mode == "min") and value == bound:
            self._warn(
                "saturated",
                f"{self.monitor} reached its bound {bound:g} at epoch {trainer.current_epoch + 1}: "
                f"the validation split cannot tell later epochs apart (ties go to lower "
                f"{self.tie_break}, then the later epoch); {advice}",
            )

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            self.warnings.append(message)
            log.warning(message)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not self.save_last or trainer.fast_dev_run:
            return
        current = trainer.callback_metrics.get(self.monitor)
        self._save(trainer, pl_module, "last", None if current is None else float(current))

    def state_dict(self) -> dict[str, Any]:
        state = {key: getattr(self, key) for key in _STATE}
        return {**state, "warnings": list(self.warnings), "warned": sorted(self._warned)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key in _STATE:
            setattr(self, key, state_dict.get(key))
        self.best_warming_up = bool(self.best_warming_up)
        self.warnings = list(state_dict.get("warnings") or [])
        self._warned = set(state_dict.get("warned") or [])  # kinds said (each once per run)


def export_prefix(pl_module) -> str:
    """The state_dict prefix of the weights a module validates and exports: its own
    ``export_prefix`` (an EMA of the net, say); else ``net.`` when every weight of it is in
    its ``net``; else ``""``, the whole module (a LightningModule of your own with layers
    beside a ``net`` keeps them all)."""
    if hasattr(pl_module, "export_prefix"):
        return str(pl_module.export_prefix)
    names = chain(pl_module.named_parameters(), pl_module.named_buffers())
    in_net = isinstance(getattr(pl_module, "net", None), torch.nn.Module)
    return "net." if in_net and all(n.startswith("net.") for n, _ in names) else ""


def exported(pl_module) -> torch.nn.Module:
    """The submodule whose weights the checkpoints hold (``export_prefix``): what to load
    ``best.safetensors`` into."""
    prefix = export_prefix(pl_module).rstrip(".")
    return pl_module.get_submodule(prefix) if prefix else pl_module


def _data_facts(datamodule) -> dict:
    """What the data module knows, for the sidecar: an image classifier's ``in_shape`` and
    ``class_names``; a table's ``feature_names`` (the columns predict reads) and ``target``
    (``column``, ``mean``, ``std``) when it standardizes a numeric target
    (``TabularData.standardization``, fitted on the train split: what the model card says
    its predictions are in). A task of your own may have none of them."""
    facts = {}
    for key, attr in (("in_shape", "input_shape"), ("class_names", "class_names"),
                      ("feature_names", "feature_names")):  # fmt: skip
        value = getattr(datamodule, attr, None)
        if value:
            facts[key] = list(value)
    stats = getattr(datamodule, "standardization", None)
    if isinstance(stats, dict) and "target_mean" in stats:
        column = getattr(datamodule, "target_column", None)
        facts["target"] = {
            "column": None if column is None else str(column),
            "mean": float(stats["target_mean"]),
            "std": float(stats["target_std"]),
        }
    return facts


def _val_scalars(metrics) -> dict[str, float]:
    """The ``val/*`` scalars Lightning holds now (finite numbers only: JSON has no NaN)."""
    scalars = {str(key): value for key, value in metrics.items() if str(key).startswith("val/")}
    numbers = {k: float(v) for k, v in scalars.items() if getattr(v, "numel", lambda: 1)() == 1}
    return {key: number for key, number in numbers.items() if math.isfinite(number)}
