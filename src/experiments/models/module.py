"""The LightningModule: one classifier for any net, optimizer and scheduler from config."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import lightning as L
import torch
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from experiments.errors import UserError


class ClassificationModule(L.LightningModule):
    """Trains ``net`` with cross-entropy on raw logits and logs ``stage/loss``, ``stage/acc``.

    Args:
        net: the network; takes a batch of inputs, returns ``(B, num_classes)`` logits.
        optimizer: partial optimizer, called with the trainable parameters.
        scheduler: partial LR scheduler, called with the optimizer; None for a constant LR.
        num_classes: number of classes (for the accuracy metrics).
        freeze: parameter-name prefixes (e.g. ``["features.0"]``) to freeze: they get
            ``requires_grad=False`` and are left out of the optimizer.
        scheduler_interval: ``epoch`` or ``step``: how often the scheduler steps.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
        scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
        num_classes: int = 10,
        freeze: Sequence[str] = (),
        scheduler_interval: str = "epoch",
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
            }
        )
        self.net = net
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.scheduler_interval = scheduler_interval
        self.loss_fn = nn.CrossEntropyLoss()
        # one metric per stage: their states must not mix (nn.Module owns "train", so no ModuleDict)
        # average="micro": the share of correct predictions (torchmetrics defaults to macro)
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        _freeze(net, freeze)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _shared_step(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> dict:
        x, y = batch  # x: (B, C, H, W); y: (B,) class indices or (B, K) one-hot/soft targets
        logits = self.net(x)  # (B, K)
        loss = self.loss_fn(logits, y)
        labels = y.argmax(dim=1) if y.ndim == 2 else y
        metric = getattr(self, f"{stage}_acc")
        metric.update(logits.detach(), labels)
        on_step = stage == "train"
        self.log(
            f"{stage}/loss",
            loss.detach(),
            on_step=on_step,
            on_epoch=True,
            prog_bar=True,
            batch_size=x.shape[0],
        )
        self.log(f"{stage}/acc", metric, on_step=False, on_epoch=True, prog_bar=stage != "train")
        # callbacks (validation accuracy, confusion matrix) read logits/labels from here
        return {"loss": loss, "logits": logits.detach(), "labels": labels}

    def training_step(self, batch, batch_idx):
        return self._shared_step(batch, "train")

    def validation_step(self, batch, batch_idx):
        return self._shared_step(batch, "val")

    def test_step(self, batch, batch_idx):
        return self._shared_step(batch, "test")

    def configure_optimizers(self):
        params = [p for p in self.net.parameters() if p.requires_grad]
        optimizer = self.optimizer_factory(params)
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": self.scheduler_interval},
        }


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
