"""Checks of the composed config that run before anything heavy is imported or built,
so a mistake costs a second and one line, not a traceback after a slow start."""

from __future__ import annotations

import numbers

from omegaconf import DictConfig, OmegaConf

from experiments.errors import UserError

# key -> (kind, lower bound or None); checked only where the key is present and not null
NUMBERS = {
    "seed": ("int", 0),
    "optimizer.lr": ("float", 0.0),
    "optimizer.weight_decay": ("float", 0.0),
    "optimizer.momentum": ("float", 0.0),
    "data.batch_size": ("int", 1),
    "data.num_workers": ("int", 0),
    "data.val_fraction": ("float", 0.0),
    "data.test_fraction": ("float", 0.0),
    "trainer.max_epochs": ("int", -1),
    "trainer.log_every_n_steps": ("int", 1),
    "trainer.accumulate_grad_batches": ("int", 1),
    "scheduler.warmup_epochs": ("float", 0.0),
    "model.ema_decay": ("float", 0.0),
    "model.label_smoothing": ("float", 0.0),
    "data.mixup_alpha": ("float", 0.0),
    "data.cutmix_alpha": ("float", 0.0),
    "cv.folds": ("int", 2),  # 1 fold would validate on nothing it did not train on
}
BOOLS = (
    "data.download",
    "data.pin_memory",
    "data.persistent_workers",
    "data.cache",
    "test",
    "trainer.deterministic",
    "print_config",
    "sweep.retry_failed",
    "sweep.force",
)
CHOICES = {
    "trainer.accelerator": ("auto", "cpu", "gpu", "cuda", "mps", "tpu"),
    "optimized_mode": ("max", "min"),
    "logger.wandb.mode": ("auto", "online", "offline", "disabled"),
    "data.split": ("stratified", "random"),
}


def validate(cfg: DictConfig) -> None:
    """Raise UserError naming the first bad key of ``cfg`` and what would be valid."""
    missing = sorted(k for k in _missing_keys(cfg, "") if not k.startswith("hydra"))
    if missing:
        raise UserError(
            f"missing value for {', '.join(missing)}: set it on the command line, "
            f"e.g. {missing[0]}=<value>"
        )
    for key, (kind, low) in NUMBERS.items():
        value = _select(cfg, key)
        if value is None:
            continue
        ok = isinstance(value, numbers.Integral if kind == "int" else numbers.Real)
        if not ok or isinstance(value, bool) or value < low:
            raise UserError(f"{key}={value!r} is not valid: expected {kind} >= {low}")
    for key in BOOLS:
        value = _select(cfg, key)
        if value is not None and not isinstance(value, bool):
            raise UserError(f"{key}={value!r} is not valid: expected true or false")
    for key, choices in CHOICES.items():
        value = _select(cfg, key)
        if value is not None and value not in choices:
            raise UserError(f"{key}={value!r} is not valid: expected one of {', '.join(choices)}")
    _check_schedule_and_averaging(cfg)
    if cfg.get("optimized_metric") is not None and "/" not in str(cfg.optimized_metric):
        raise UserError(
            f"optimized_metric={cfg.optimized_metric!r} is not valid: expected stage/name, "
            "e.g. val/acc"
        )


def _check_schedule_and_averaging(cfg: DictConfig) -> None:
    decay = _select(cfg, "model.ema_decay")
    if decay is not None and (isinstance(decay, bool) or not 0 < float(decay) < 1):
        raise UserError(
            f"model.ema_decay={decay!r} is not valid: expected a number in (0, 1) "
            "(e.g. 0.999) or null"
        )
    smoothing = _select(cfg, "model.label_smoothing")
    if smoothing is not None and not 0 <= float(smoothing) < 1:
        raise UserError(
            f"model.label_smoothing={smoothing!r} is not valid: expected a number in [0, 1)"
        )
    epochs = _select(cfg, "trainer.max_epochs")
    if epochs == -1 and _select(cfg, "trainer.max_steps") in (None, -1):
        if _select(cfg, "trainer.max_time") is None:
            raise UserError(
                "trainer.max_epochs=-1 trains forever: also set trainer.max_steps=<N> or "
                "trainer.max_time=DD:HH:MM:SS, or give trainer.max_epochs=<N>"
            )
    warmup = _select(cfg, "scheduler.warmup_epochs")
    if warmup is not None and epochs is not None and epochs > 0 and not 0 <= warmup < epochs:
        raise UserError(
            f"scheduler.warmup_epochs={warmup} is not valid: the warmup must be shorter than the "
            f"run (trainer.max_epochs={epochs})"
        )


def _missing_keys(node, prefix: str):
    """``???`` values, found without resolving interpolations (``${hydra:...}`` may not be set)."""
    from omegaconf import ListConfig

    items = node.items_ex(resolve=False) if isinstance(node, DictConfig) else enumerate(node)
    for key, _ in items:
        child = node._get_node(key)
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(child, DictConfig | ListConfig):
            if not child._is_missing() and not child._is_none():
                yield from _missing_keys(child, path)
        elif child._is_missing():
            yield path


def _select(cfg: DictConfig, key: str):
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=False)
    except Exception as err:  # an interpolation that cannot resolve
        raise UserError(f"{key}: {err}") from None
