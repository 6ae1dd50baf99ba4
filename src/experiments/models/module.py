"""The LightningModule: one classifier for any net, optimizer and scheduler from config."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import lightning as L
import torch
from torch import nn

from experiments.compat.lightning import attached_trainer, logger_step
from experiments.config.hints import Ge, Gt, Lt
from experiments.errors import UserError
from experiments.models import finetune
from experiments.models.losses import check_class_weights, make_loss
from experiments.models.metrics import (
    ConfusionStats,
    RunningMean,
    TrainTotals,
    log_to_loggers,
    resolve_top_k,
    summarize,
)
from experiments.models.schedules import TaskSteps, with_scheduler
from experiments.models.tta import TTA, tta_views
from experiments.models.weights_fit import load_fitted
from experiments.runs.layout import RunDir


class ClassificationModule(TaskSteps, L.LightningModule):
    """Trains ``net`` on raw logits and logs ``stage/loss``, ``stage/acc``, ``stage/macro_f1``,
    ``stage/balanced_acc`` (+ ``stage/top<k>_acc`` and per-class precision / recall).

    Args:
        net: the network; takes a batch of inputs, returns ``(B, num_classes)`` logits.
        optimizer: partial optimizer, called with the trainable parameters (or with a
            backbone and a head parameter group when fine-tuning).
        scheduler: partial LR scheduler, called with the optimizer; None for a constant LR.
        num_classes: number of classes (for the metrics).
        freeze: parameter-name prefixes (e.g. ``["features.0"]``) frozen for the whole
            run: ``requires_grad=False`` and left out of the optimizer.
        scheduler_interval: ``epoch`` or ``step``: how often the scheduler steps (a
            schedule that takes ``total_steps`` always steps every optimizer step).
        label_smoothing: label smoothing of the loss, in [0, 1).
        ema_decay: keep an exponential moving average of the weights with this decay
            (e.g. 0.999) and validate, test and export it (``RunDir.best_weights``) instead
            of the raw weights; None turns it off. It is
            ``callbacks.weight_averaging.kind=ema`` with this ``decay``: the builder
            (``training.build.callbacks``) adds that callback; kept for older configs.
        tta: ``flip`` or ``flip_translate``: the test also reports ``test/tta/<metric>`` on
            the mean softmax over each image's views (``models.tta.tta_views``).
        channels_last: train in channels-last memory format (faster convolutions with
            mixed precision on recent GPUs).
        monitor: the metric a ``ReduceLROnPlateau`` schedule watches.
        loss: ``cross_entropy``, ``focal``, ``logit_adjusted``, or ``auto`` (the builder picks
            logit_adjusted for a long-tailed training split, else cross_entropy).
        focal_gamma: focal loss' focusing exponent (0 is cross-entropy).
        class_weights: per-class loss weights; ``auto`` (inverse class frequency of the
            training split) is resolved by the builder, which sees the data.
        logit_adjustment_tau: ``loss=logit_adjusted``'s tau (Menon et al., 2021: 1).
        class_prior: each class's share of the training split (given by the builder).
        top_k: also log ``top<k>_acc``; ``auto`` is 5 when there are at least 10 classes.
        per_class_metrics: log precision and recall per class on val and test (up to 100
            classes).
        head: parameter-name prefix of the classifier head (``auto``: found in the net).
        freeze_backbone_epochs: train only the head for this many epochs, then all; the
            frozen backbone's BatchNorms stay in eval mode.
        backbone_lr_scale: the backbone's learning rate is the optimizer's times this.
        init_from: a run dir or weights file to start from (loaded by the builder before
            training: ``initialize_from``); recorded here.
        init_exclude: parameter-name prefixes ``init_from`` must not load.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
        scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
        num_classes: int = 10,
        freeze: Sequence[str | int] = (),  # `model.freeze=[0]` (a Sequential's first layer)
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        label_smoothing: Annotated[float, Ge(0), Lt(1)] = 0.0,
        ema_decay: Annotated[float, Gt(0), Lt(1)] | None = None,
        channels_last: bool = False,
        monitor: str = "val/acc",
        loss: Literal["auto", "cross_entropy", "focal", "logit_adjusted"] = "cross_entropy",
        focal_gamma: Annotated[float, Ge(0)] = 2.0,
        class_weights: Sequence[float] | str | None = None,
        top_k: Annotated[int, Ge(1)] | Literal["auto"] | None = "auto",
        per_class_metrics: bool = True,
        head: str | None = "auto",
        freeze_backbone_epochs: Annotated[int, Ge(0)] = 0,
        backbone_lr_scale: Annotated[float, Ge(0)] = 1.0,
        init_from: str | None = None,
        init_exclude: Sequence[str] = (),
        logit_adjustment_tau: Annotated[float, Ge(0)] = 1.0,
        class_prior: Sequence[float] | None = None,
        tta: Literal["none", "flip", "flip_translate"] = "none",
    ) -> None:
        super().__init__()
        freeze = [str(prefix) for prefix in freeze]  # `model.freeze=[0]` parses as an int
        weights = check_class_weights(class_weights, num_classes)
        self.top_k = resolve_top_k(top_k, num_classes)
        # plain containers only, so checkpoints load with torch.load(weights_only=True)
        self.save_hyperparameters(
            {
                "num_classes": int(num_classes),
                "freeze": freeze,
                "scheduler_interval": str(scheduler_interval),
                "label_smoothing": float(label_smoothing),
                "ema_decay": None if ema_decay is None else float(ema_decay),
                "loss": str(loss),
                "class_weights": weights,
                "freeze_backbone_epochs": int(freeze_backbone_epochs),
                "backbone_lr_scale": float(backbone_lr_scale),
                "init_from": None if init_from is None else str(init_from),
            }
        )
        if channels_last:
            net = net.to(memory_format=torch.channels_last)
        self.net, self.channels_last = net, channels_last
        # built in Python, past the schema's bounds: refused here, not at the callback
        if ema_decay is not None and not 0.0 < float(ema_decay) < 1.0:
            raise UserError(
                f"model.ema_decay={ema_decay} must be in (0, 1), e.g. 0.999; null turns it off"
            )
        if tta not in TTA:
            raise UserError(f"model.tta={tta!r} is not valid; use one of {', '.join(TTA)}")
        self.tta = str(tta)
        # the weights validated, tested and exported (RunDir.best/last_weights)
        self.export_prefix = "net."
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.scheduler_interval, self.monitor = scheduler_interval, monitor
        smoothing, tau = float(label_smoothing), logit_adjustment_tau
        self.loss_fn = make_loss(str(loss), smoothing, weights, focal_gamma, class_prior, tau)
        # one metric per stage: their states must not mix (nn.Module owns "train", so no ModuleDict)
        self.train_totals = TrainTotals()
        self.val_stats = ConfusionStats(num_classes, self.top_k)
        self.test_stats = ConfusionStats(num_classes, self.top_k)
        self.test_tta_stats = ConfusionStats(num_classes, self.top_k)
        self.val_loss, self.test_loss = RunningMean(), RunningMean()
        self.per_class_metrics = bool(per_class_metrics) and int(num_classes) <= 100
        self._registered: set[str] = set()  # stages whose epoch loss is handed to self.log
        finetune.freeze_for_good(net, freeze)
        self.freeze_backbone_epochs = int(freeze_backbone_epochs)
        self.backbone_lr_scale = float(backbone_lr_scale)
        fine_tuning = self.freeze_backbone_epochs > 0 or self.backbone_lr_scale != 1.0
        self.head = finetune.resolve_head(net, head) if fine_tuning or init_from else None
        self.init_from, self.init_exclude = init_from, [str(p) for p in init_exclude]
        # True in the head-only epochs of a fine-tune: a checkpoint of such an epoch never
        # wins a tie against one of the whole net (StateDictCheckpoint)
        self.warming_up = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """A full checkpoint of a run trained when this module kept its own EMA holds it in
        ``state_dict`` as ``ema.<net key>``: moved to the state of ``callbacks.WeightAveraging``
        (state key ``WeightAveraging``, its names ``net.<key>``), which ``model.ema_decay`` now
        builds, so such a run still resumes, its average continued from the same step."""
        state = checkpoint.get("state_dict") or {}
        legacy = {k: state.pop(k) for k in [k for k in state if k.startswith("ema.")]}
        if not legacy:
            return
        checkpoint.setdefault("callbacks", {}).setdefault(
            "WeightAveraging",
            {
                "kind": "ema",
                "last_step": int(checkpoint.get("global_step", 0)),
                "average": {"net." + k.removeprefix("ema."): v for k, v in legacy.items()},
                "window": [],
            },
        )

    def initialize_from(self, source: str | Path) -> None:
        """Load a finished run's best weights (``best.safetensors``, an older run's
        ``best.pt``) or any weights file into the net by name: a head of another class
        count stays new; one line reports what loaded."""
        path = Path(str(source)).expanduser()
        if path.is_dir():
            path = RunDir(path).best_weights
            if not path.is_file():
                raise UserError(
                    f"model.init_from={source}: that run has no checkpoints/{path.name} "
                    "(it never finished a validation epoch)"
                )
        label = f"model.init_from={source}"
        load_fitted(
            self.net, path, [self.head or ""], label, strict=False, exclude=self.init_exclude
        )

    def _shared_step(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> torch.Tensor:
        x, y = batch  # x: (B, C, H, W); y: (B,) class indices or (B, K) one-hot/soft targets
        if self.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        logits = self.net(x)  # (B, K)
        loss = self.loss_fn(logits, y)
        labels = y.argmax(dim=1) if y.ndim == 2 else y
        # Per step only device-side updates: a self.log call costs ~1 ms of Python on
        # Lightning's side, and .item() would wait for the device.
        epoch = {"on_step": False, "on_epoch": True}
        if stage == "train":  # no Lightning result state per step: logged once, at the end
            self.train_totals.add(logits.detach(), labels, loss, x.shape[0])
            trainer, steps = attached_trainer(self), self.global_step + 1
            if trainer is None:
                return loss
            max_steps = trainer.max_steps or 0  # None or -1: no limit
            if trainer.is_last_batch or 0 < max_steps <= steps:  # the epoch's (run's) last step
                values = self.train_totals.take(trainer.strategy)
                self.log("train/loss", values["train/loss"], prog_bar=True, **epoch)
                self.log("train/acc", values["train/acc"], **epoch)
            # the steps on which Lightning hands logged values to the loggers (and saves them)
            if steps % max(int(trainer.log_every_n_steps), 1) == 0 or trainer.should_stop:
                log_to_loggers(trainer, {"train/loss_step": loss.detach()}, logger_step(trainer))
            return loss
        getattr(self, f"{stage}_stats").update(logits.detach(), labels)
        if stage == "test" and self.tta != "none":
            self.test_tta_stats.update(self._tta_logits(x), labels)
        getattr(self, f"{stage}_loss").update(loss, x.shape[0])
        if stage not in self._registered:
            # once per epoch: Lightning computes and resets these Metric objects at epoch end
            self._registered.add(stage)
            self.log(f"{stage}/loss", getattr(self, f"{stage}_loss"), prog_bar=True, **epoch)
        # only the loss: Lightning walks every other returned tensor on every step
        return loss

    def _tta_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The log of the mean softmax over ``x``'s views (``tta_views``): ``(B, K)``."""
        views = tta_views(self.tta)(x)
        if self.channels_last and x.ndim == 4:
            views = [v.contiguous(memory_format=torch.channels_last) for v in views]
        return torch.stack([self.net(v).float().softmax(1) for v in views]).mean(0).log()

    def _take(self, stats: ConfusionStats) -> dict[str, torch.Tensor] | None:
        """Once per epoch: the confusion matrix (summed over ranks) -> every metric; None
        when nothing was counted. The counts start again at zero."""
        if stats.update_count == 0:
            return None
        values = summarize(*stats.compute(), top_k=self.top_k)
        stats.reset()
        return values

    def _log_epoch_stats(self, stage: str) -> None:
        values = self._take(getattr(self, f"{stage}_stats"))
        if values is None:
            return
        trainer = attached_trainer(self)
        datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
        names = list(getattr(datamodule, "class_names", None) or [])
        # the values are already summed over ranks; the mean of equal values is that value,
        # and Lightning warns about every epoch-level value logged without sync under DDP
        sync = trainer is not None and trainer.world_size > 1
        per_class = {}  # straight to the loggers: self.log costs ~0.3 ms per key
        for key, value in values.items():
            kind, _, i = key.partition("/")
            if not i:
                self.log(f"{stage}/{key}", value, prog_bar=key == "acc", sync_dist=sync)
            elif self.per_class_metrics:
                per_class[f"{stage}/{kind}/{names[int(i)] if len(names) > int(i) else i}"] = value
        log_to_loggers(trainer, per_class)

    def on_train_epoch_start(self) -> None:
        if self.freeze_backbone_epochs > 0:
            frozen = self.current_epoch < self.freeze_backbone_epochs
            self.warming_up = frozen
            if attached_trainer(self) is None or self.trainer.world_size <= 1:
                # the parameters frozen for good (model.freeze) stay frozen
                for param in finetune.split_parameters(self.net, self.head, self.hparams.freeze)[0]:
                    param.requires_grad_(not frozen)
            if frozen:  # the backbone's BatchNorms in eval mode: no drift of their statistics
                finetune.batchnorms_eval(self.net, self.head)
            else:
                self.net.train()  # the backbone's BatchNorms learn again

    def train(self, mode: bool = True):
        super().train(mode)
        if mode and self.warming_up:  # Lightning re-enters train mode after validation
            finetune.batchnorms_eval(self.net, self.head)
        return self

    def on_before_optimizer_step(self, optimizer) -> None:
        # under DDP the backbone is frozen by dropping its gradients before the step (DDP
        # must see every parameter as trainable from the start): an optimizer skips a
        # parameter without a gradient, exactly as if it were frozen
        if self.warming_up and self.trainer.world_size > 1:
            for param in finetune.split_parameters(self.net, self.head)[0]:
                param.grad = None

    def on_validation_epoch_start(self) -> None:
        self._registered.discard("val")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch_stats("val")

    def on_test_epoch_start(self) -> None:
        self._registered.discard("test")

    def on_test_epoch_end(self) -> None:
        self._log_epoch_stats("test")
        values = self._take(self.test_tta_stats)
        if values is not None:  # the names eval's tta= reports
            for key in ("acc", "balanced_acc", "macro_f1"):
                self.log(f"test/tta/{key}", values[key])

    def trained_parameters(self) -> list[nn.Parameter]:
        frozen_for_good = self.hparams.freeze
        return [p for n, p in self.net.named_parameters() if not finetune.under(n, frozen_for_good)]

    def configure_optimizers(self):
        if not self.freeze_backbone_epochs and self.backbone_lr_scale == 1:
            return super().configure_optimizers()
        backbone, head = finetune.split_parameters(self.net, self.head, self.hparams.freeze)
        optimizer = self.optimizer_factory([{"params": backbone}, {"params": head}])
        optimizer.param_groups[0]["lr"] *= self.backbone_lr_scale
        return with_scheduler(
            self, optimizer, self.scheduler_factory, self.scheduler_interval, self.monitor
        )
