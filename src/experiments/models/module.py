"""The LightningModule: one classifier for any net, optimizer and scheduler from config."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import lightning as L
import torch
from torch import nn
from torchmetrics import Metric

from experiments.errors import UserError


class Accuracy(Metric):
    """Share of argmax predictions equal to the label (micro accuracy), kept on the device.

    The same number as torchmetrics' ``MulticlassAccuracy(average="micro")`` for
    single-label classification, at ~20 µs per update instead of ~150 µs: two summed
    counters, no argument validation (no host sync). Summed across ranks under DDP.
    """

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("correct", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:  # (B, K), (B,)
        self.correct += (logits.argmax(dim=1) == labels).sum()
        self.total += labels.numel()

    def compute(self) -> torch.Tensor:
        return self.correct.float() / self.total.clamp_min(1)


class RunningMean(Metric):
    """Weighted mean of per-batch values (the epoch loss), kept on the device."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, value: torch.Tensor, weight: int) -> None:
        self.total += value.detach() * weight
        self.weight += weight

    def compute(self) -> torch.Tensor:
        return (self.total / self.weight.clamp_min(1)).float()


class ClassificationModule(L.LightningModule):
    """Trains ``net`` with cross-entropy on raw logits and logs ``stage/loss``, ``stage/acc``.

    Args:
        net: the network; takes a batch of inputs, returns ``(B, num_classes)`` logits.
        optimizer: partial optimizer, called with the trainable parameters.
        scheduler: partial LR scheduler, called with the optimizer; None for a constant LR.
        num_classes: number of classes (for the accuracy metrics).
        freeze: parameter-name prefixes (e.g. ``["features.0"]``) to freeze: they get
            ``requires_grad=False`` and are left out of the optimizer.
        scheduler_interval: ``epoch`` or ``step``: how often the scheduler steps (a
            schedule that takes ``total_steps`` always steps every optimizer step).
        label_smoothing: cross-entropy label smoothing, in [0, 1).
        ema_decay: keep an exponential moving average of the weights with this decay
            (e.g. 0.999) and validate, test and export it (``best.pt``) instead of the
            raw weights; None turns it off. It is part of the module's state, so full
            checkpoints carry it and a resume continues it exactly.
        channels_last: train in channels-last memory format (faster convolutions with
            mixed precision on recent GPUs).
        monitor: the metric a ``ReduceLROnPlateau`` schedule watches.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
        scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
        num_classes: int = 10,
        freeze: Sequence[str] = (),
        scheduler_interval: str = "epoch",
        label_smoothing: float = 0.0,
        ema_decay: float | None = None,
        channels_last: bool = False,
        monitor: str = "val/acc",
    ) -> None:
        super().__init__()
        freeze = [str(prefix) for prefix in freeze]  # `model.freeze=[0]` parses as an int
        if scheduler_interval not in ("epoch", "step"):
            raise UserError(
                f"model.scheduler_interval={scheduler_interval!r} is not valid; use epoch or step"
            )
        # plain containers only, so checkpoints load with torch.load(weights_only=True)
        self.save_hyperparameters(
            {
                "num_classes": int(num_classes),
                "freeze": freeze,
                "scheduler_interval": str(scheduler_interval),
                "label_smoothing": float(label_smoothing),
                "ema_decay": None if ema_decay is None else float(ema_decay),
            }
        )
        if not 0.0 <= float(label_smoothing) < 1.0:
            raise UserError(f"model.label_smoothing={label_smoothing} must be in [0, 1)")
        if channels_last:
            net = net.to(memory_format=torch.channels_last)
        self.net = net
        self.channels_last = channels_last
        self.monitor = monitor
        self.ema_decay = None if ema_decay is None else float(ema_decay)
        self.ema = _ema_copy(net, ema_decay)
        # the weights that are validated, tested and exported (best.pt / last.pt)
        self.export_prefix = "ema." if self.ema is not None else "net."
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.scheduler_interval = scheduler_interval
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=float(label_smoothing))
        # one metric per stage: their states must not mix (nn.Module owns "train", so no ModuleDict)
        self.train_acc, self.val_acc, self.test_acc = Accuracy(), Accuracy(), Accuracy()
        self.train_loss, self.val_loss, self.test_loss = RunningMean(), RunningMean(), RunningMean()
        self._registered: set[str] = set()  # stages whose epoch metrics are handed to self.log
        _freeze(net, freeze)

    @property
    def eval_net(self) -> nn.Module:
        """The net that is validated, tested and exported: the EMA of the weights when on."""
        return self.ema if self.ema is not None else self.net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.eval_net(x)

    def _shared_step(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> dict:
        x, y = batch  # x: (B, C, H, W); y: (B,) class indices or (B, K) one-hot/soft targets
        if self.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        logits = (self.net if stage == "train" else self.eval_net)(x)  # (B, K)
        loss = self.loss_fn(logits, y)
        labels = y.argmax(dim=1) if y.ndim == 2 else y
        # Per step only device-side updates: a self.log call costs ~1 ms of Python on
        # Lightning's side, and .item() would wait for the device.
        getattr(self, f"{stage}_acc").update(logits.detach(), labels)
        getattr(self, f"{stage}_loss").update(loss, x.shape[0])
        if stage not in self._registered:
            # once per epoch: Lightning computes and resets these Metric objects at epoch end
            self._registered.add(stage)
            for name, prog_bar in (("loss", True), ("acc", stage != "train")):
                metric = getattr(self, f"{stage}_{name}")
                self.log(f"{stage}/{name}", metric, on_step=False, on_epoch=True, prog_bar=prog_bar)
        if stage == "train" and self._log_this_step():
            self.log("train/loss_step", loss.detach(), on_step=True, on_epoch=False, prog_bar=True)
        # callbacks (validation accuracy, confusion matrix) read logits/labels from here
        return {"loss": loss, "logits": logits.detach(), "labels": labels}

    def _log_this_step(self) -> bool:
        # the steps on which Lightning hands logged values to the loggers; others are dropped
        trainer = self._trainer
        if trainer is None:
            return False
        every = max(int(trainer.log_every_n_steps), 1)
        return (self.global_step + 1) % every == 0 or trainer.should_stop

    def on_train_epoch_start(self) -> None:
        self._registered.discard("train")

    def on_validation_epoch_start(self) -> None:
        self._registered.discard("val")

    def on_test_epoch_start(self) -> None:
        self._registered.discard("test")

    def training_step(self, batch, batch_idx):
        return self._shared_step(batch, "train")

    def validation_step(self, batch, batch_idx):
        return self._shared_step(batch, "val")

    def test_step(self, batch, batch_idx):
        return self._shared_step(batch, "test")

    def optimizer_step(self, *args, **kwargs) -> None:
        super().optimizer_step(*args, **kwargs)
        if self.ema is not None:
            self._update_ema()

    @torch.no_grad()
    def _update_ema(self) -> None:
        # the decay warms up as (1 + t) / (10 + t): a short run's average is not dominated by
        # its random start (with a fixed 0.998, 8% of a 1266-step average was the initial
        # weights); t is the optimizer step, which a resumed run restores exactly
        step = self.global_step
        decay = min(self.ema_decay, (1 + step) / (10 + step))
        averaged = [*self.ema.parameters(), *self.ema.buffers()]
        current = [*self.net.parameters(), *self.net.buffers()]
        for avg, cur in zip(averaged, current, strict=True):
            if avg.dtype.is_floating_point:
                avg.lerp_(cur.detach(), 1.0 - decay)
            else:  # BatchNorm's num_batches_tracked
                avg.copy_(cur)

    def configure_optimizers(self):
        params = [p for p in self.net.parameters() if p.requires_grad]
        optimizer = self.optimizer_factory(params)
        if self.scheduler_factory is None:
            return optimizer
        interval = self.scheduler_interval
        if "total_steps" in _arguments(self.scheduler_factory):
            # schedules over the whole run are stepped per optimizer step
            total = int(self.trainer.estimated_stepping_batches)
            scheduler = self.scheduler_factory(
                optimizer, total_steps=total, total_epochs=int(self.trainer.max_epochs)
            )
            interval = "step"
        else:
            scheduler = self.scheduler_factory(optimizer)
        config = {"scheduler": scheduler, "interval": interval, "monitor": self.monitor}
        return {"optimizer": optimizer, "lr_scheduler": config}


def _ema_copy(net: nn.Module, decay: float | None) -> nn.Module | None:
    if decay is None:
        return None
    if not 0.0 < float(decay) < 1.0:
        raise UserError(f"model.ema_decay={decay} must be in (0, 1), e.g. 0.999; null turns it off")
    import copy

    ema = copy.deepcopy(net)
    ema.requires_grad_(False)  # updated from the net's weights, never by the optimizer
    return ema


def _arguments(factory: Callable) -> set[str]:
    import inspect

    try:
        return set(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return set()


def _freeze(net: nn.Module, prefixes: list[str]) -> None:
    names = [name for name, _ in net.named_parameters()]
    for prefix in prefixes:
        hits = [n for n in names if n == prefix or n.startswith(prefix + ".")]
        if not hits:
            top = sorted({n.split(".")[0] for n in names})
            raise UserError(
                f"model.freeze: {prefix!r} matches no parameter; top-level names are {top}"
            )
    for name, param in net.named_parameters():
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            param.requires_grad_(False)
    if prefixes and not any(p.requires_grad for p in net.parameters()):
        raise UserError(f"model.freeze={prefixes} freezes every parameter; nothing would train")
