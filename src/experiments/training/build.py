"""Objects from config, in the order ``train()`` needs them. Hydra's ``instantiate`` does
the building; this module only knows what each object must be handed."""

from __future__ import annotations

import inspect
import logging
import os
from collections import Counter
from pathlib import Path

import lightning as L
import torch
from hydra.utils import get_object, instantiate
from lightning.fabric.plugins.environments import (
    LightningEnvironment,
    LSFEnvironment,
    TorchElasticEnvironment,
)
from lightning.pytorch.callbacks import LearningRateMonitor
from omegaconf import DictConfig, OmegaConf

from experiments.callbacks.weight_averaging import WeightAveraging
from experiments.compat.lightning import signal_safe_workers
from experiments.errors import UserError
from experiments.models.losses import class_prior, inverse_frequency
from experiments.runs.checkpoint_io import AtomicCheckpointIO
from experiments.secrets import redacted_config
from experiments.tracking import previous_wandb_id, wandb_logger

log = logging.getLogger(__name__)


def datamodule_and_model(cfg: DictConfig):
    """The data (set up: the model learns its shape and class count from it) and the model.

    A model config without a ``net`` is a LightningModule of your own (docs/own_task.md): it
    builds its own layers, and is handed only the ``optimizer``/``scheduler`` partials its
    constructor takes (without them its own ``configure_optimizers`` decides)."""
    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    if "net" not in cfg.model:
        # plain lists and dicts, not ListConfig/DictConfig: what a module saves with
        # save_hyperparameters goes into its full checkpoint, which resume loads as plain
        # data only (a ListConfig there made a regression run's last.ckpt unloadable)
        module = instantiate(cfg.model, **optimizer_partials(cfg), _convert_="all")
        return datamodule, module
    net = instantiate(
        cfg.model.net, in_shape=datamodule.input_shape, num_classes=datamodule.num_classes
    )
    if getattr(net, "pretrained_norm", None) is not None:
        datamodule.use_weights_stats(*net.pretrained_norm)
    extra = model_extras(cfg.model, datamodule)
    model = instantiate(cfg.model, net=net, num_classes=datamodule.num_classes, **extra,
                        **optimizer_partials(cfg))  # fmt: skip
    if model.init_from:
        model.initialize_from(model.init_from)
    return datamodule, model


def optimizer_partials(cfg: DictConfig) -> dict:
    """``optimizer`` and ``scheduler`` (partials, or None) for the arguments of that name the
    module takes; nothing for a module of your own that configures its own."""
    takes = inspect.signature(get_object(str(cfg.model._target_))).parameters
    return {
        key: instantiate(cfg[key]) if cfg.get(key) else None
        for key in ("optimizer", "scheduler")
        if key in takes
    }


def model_extras(model_cfg, datamodule) -> dict:
    """What the model takes from the training split: ``class_weights=auto`` (inverse class
    frequency) and, for ``loss=logit_adjusted``, the class prior."""
    extra = {}
    if model_cfg.get("class_weights") == "auto":
        hint = "; give model.class_weights=[w0, w1, ...] instead"
        targets = datamodule.train_targets("model.class_weights=auto", hint)
        extra["class_weights"] = inverse_frequency(targets, datamodule.num_classes)
        log.info("model.class_weights=auto (inverse class frequency of the train split): %s",
                 extra["class_weights"])  # fmt: skip
    loss = model_cfg.get("loss")
    if loss == "auto":
        loss = extra["loss"] = _auto_loss(model_cfg, datamodule)
    if loss == "logit_adjusted":
        targets = datamodule.train_targets("model.loss=logit_adjusted")
        extra["class_prior"] = class_prior(targets, datamodule.num_classes)
    return extra


def _auto_loss(model_cfg, datamodule) -> str:
    """``model.loss=auto``: logit-adjusted cross-entropy when the training split is long-
    tailed (its largest class at least IMBALANCED times its smallest), else cross-entropy.
    Measured on 10:1 long-tailed Fashion-MNIST (docs/models.md): the logit-adjusted loss
    beat plain cross-entropy, class weights and the balanced sampler on every seed; on
    balanced data it is cross-entropy itself (a uniform prior shifts every logit alike)."""
    targets = datamodule.train_targets()
    if targets is None or model_cfg.get("class_weights") is not None:
        reason = "class weights are given" if targets is not None else "no training labels"
        log.info("model.loss=auto: cross_entropy (%s)", reason)
        return "cross_entropy"
    counts = Counter(targets)
    smallest = min(counts.get(c, 0) for c in range(datamodule.num_classes))
    ratio = max(counts.values()) / max(1, smallest)
    if ratio >= IMBALANCED:
        log.info("model.loss=auto: logit_adjusted (the train split's classes are %.1f:1). %s",
                 ratio, AUTO_LOSS_TRADE)  # fmt: skip
        return "logit_adjusted"
    return "cross_entropy"


IMBALANCED = 1.5  # largest / smallest class of the training split
# said on the console when auto picks it, and in metrics.json (loss_note) and the model card
AUTO_LOSS_TRADE = (
    "It aims at balanced accuracy (every class counts alike), which on test data as skewed "
    "as the train split can cost plain accuracy: give model.loss=cross_entropy when "
    "accuracy is what counts"
)


def callbacks(cfg: DictConfig, with_logger: bool) -> list:
    """Every configured callback, except those switched off (``enabled: false``, a key every
    callback config may have and none is handed; a weight averaging of kind ``none``).

    A callback switched off is not built at all: Lightning calls every hook of every
    callback on every step. The LR monitor needs a logger, so it is left out without one.
    """
    built = [
        instantiate(  # without the switch: it is ours, not the callback's
            {k: v for k, v in OmegaConf.to_container(c, resolve=True).items() if k != "enabled"}
        )
        for c in (cfg.get("callbacks") or {}).values()
        if c and c.get("enabled", True) is not False
    ]
    built = [c for c in built if not (isinstance(c, WeightAveraging) and c.kind == "none")]
    built += _ema_of_the_model(cfg, built)
    if not with_logger and any(isinstance(c, LearningRateMonitor) for c in built):
        log.info("no logger configured: leaving out the LR monitor, which needs one")
        built = [c for c in built if not isinstance(c, LearningRateMonitor)]
    return built


def _ema_of_the_model(cfg: DictConfig, built: list) -> list:
    """``model.ema_decay`` (the classifier's older key) is ``callbacks.weight_averaging``
    with ``kind=ema`` and that decay: one mechanism for every task's averaging."""
    decay = (cfg.get("model") or {}).get("ema_decay")
    if decay is None:
        return []
    averaging = [c for c in built if isinstance(c, WeightAveraging)]
    if averaging:
        raise UserError(
            f"model.ema_decay={decay} and callbacks.weight_averaging.kind={averaging[0].kind} "
            f"both average the weights: keep one (model.ema_decay=null, or "
            f"callbacks.weight_averaging.kind=none)"
        )
    return [WeightAveraging(kind="ema", decay=float(decay))]


def loggers(cfg: DictConfig, run_dir: Path, resuming: bool) -> list:
    """Every configured logger; a resumed run continues its W&B run."""
    wandb_id = previous_wandb_id(run_dir) if resuming else None

    def continued(node) -> dict:
        # our W&B factory, by identity (not a name that merely contains "wandb")
        target = node.get("_target_")
        return {"run_id": wandb_id} if target and get_object(str(target)) is wandb_logger else {}

    # built from the redacted config: a run name or tag that interpolated a secret (e.g. a
    # job name made of the overrides) must not reach a tracker; keys come from the environment
    return [
        instantiate(redacted_config(c), **continued(c))
        for c in (cfg.get("logger") or {}).values()
        if c
    ]


def trainer(cfg: DictConfig, callbacks: list, loggers: list, train_batches: int | None = None):
    """Lightning's Trainer with atomic, weights-only-loadable full checkpoints."""
    require_gpu(
        str(cfg.trainer.get("accelerator", "auto")),
        " (torch.cuda.is_available() is False); use trainer=cpu or trainer.accelerator=auto",
    )
    built = instantiate(
        cfg.trainer,
        callbacks=callbacks,
        logger=loggers or False,
        plugins=[AtomicCheckpointIO(), *cluster_plugins()],
        **_log_interval(cfg, train_batches),
    )
    signal_safe_workers(built)  # ddp_fork/ddp_spawn: a signal saves and stops, not hangs
    return built


def require_gpu(accelerator: object, way_out: str) -> None:
    """Asking for a GPU on a machine without one is one line (Lightning's is a traceback),
    ``way_out`` its end."""
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise UserError(f"trainer.accelerator={accelerator}: no CUDA GPU is visible here{way_out}")


def cluster_plugins() -> list:
    """No cluster environment to detect when no scheduler started this process: Lightning
    would look for SLURM and, finding ``srun`` installed but unused, warn on every run of
    every machine that has SLURM. Under SLURM, torchrun, LSF or MPI: Lightning detects (as
    it never detects Kubeflow: give ``trainer.plugins`` for that)."""
    if os.environ.get("SLURM_JOB_ID") or os.environ.get("OMPI_COMM_WORLD_SIZE"):
        return []
    if TorchElasticEnvironment.detect() or LSFEnvironment.detect():
        return []
    return [LightningEnvironment()]


def _log_interval(cfg: DictConfig, train_batches: int | None) -> dict:
    """``log_every_n_steps`` no larger than an epoch (Lightning warns when it is, and would
    log no step of a short epoch)."""
    every = cfg.trainer.get("log_every_n_steps")
    for key in ("limit_train_batches", "overfit_batches"):
        limit = cfg.trainer.get(key)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit and train_batches:
            train_batches = min(train_batches, limit)
    if every is None or not train_batches or every <= train_batches:
        return {}
    return {"log_every_n_steps": max(1, int(train_batches))}


def single_device_tester(cfg: DictConfig, trainer, loggers: list):
    """The trainer to test with: under DDP the test split would be sharded and padded with
    repeated samples, so one device scores every test image exactly once."""
    if trainer.world_size <= 1:
        return trainer
    precision = cfg.trainer.get("precision", "32-true")
    return one_device_trainer(accelerator=trainer.accelerator, logger=loggers or False,
                              precision=precision)  # fmt: skip


def one_device_trainer(**options) -> L.Trainer:
    """A Trainer to test with: one device, no callbacks, checkpoints or progress bar."""
    return L.Trainer(devices=1, num_nodes=1, callbacks=[], plugins=cluster_plugins(),
                     enable_checkpointing=False, enable_progress_bar=False, **options)  # fmt: skip
