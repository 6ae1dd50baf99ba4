"""Semantic segmentation, a class per pixel, as a LightningModule that owns its net (no
``model.net``): the framework builds it from ``conf/model/unet.yaml`` and hands it the
optimizer and scheduler partials. Its only weights are ``net``'s, so the checkpoints hold
the U-Net alone: what eval, predict and export load."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

import lightning as L
import torch
from torch.nn import functional as F
from torchmetrics import MetricCollection
from torchmetrics.segmentation import DiceScore, MeanIoU

from experiments.config.hints import Ge
from experiments.errors import UserError
from experiments.models.schedules import TaskSteps
from experiments.models.unet import UNet


def segmentation_metrics(num_classes: int) -> MetricCollection:
    """``miou`` and ``dice`` of class-index masks ``(B, H, W)``, background included.

    ``miou``: the IoU of each (image, class) pair where the class is in the mask or the
    prediction, averaged over those pairs; ``dice``: per image the mean Dice over the
    classes present, averaged over images (torchmetrics' MeanIoU and DiceScore)."""
    return MetricCollection(
        {
            "miou": MeanIoU(num_classes=num_classes, input_format="index"),
            "dice": DiceScore(num_classes=num_classes, input_format="index", average="macro"),
        }
    )


class SegmentationModule(TaskSteps, L.LightningModule):
    """A ``UNet`` trained with per-pixel cross-entropy; logs ``<stage>/loss``, and for val
    and test ``<stage>/miou``, ``/dice`` and ``/pixel_acc``.

    Args:
        optimizer: a partial taking the parameters (``optimizer=adamw``); None only for a
            module that is evaluated, never trained.
        scheduler: a partial taking the optimizer (and ``total_steps``/``total_epochs`` for
            whole-run schedules), or None.
        in_channels: image channels (the data's ``input_shape[0]``).
        num_classes: classes per pixel, the background included (the data's class count).
        width: channels of the U-Net's first stage.
        depth: how many times it halves the resolution (H, W divisible by ``2**depth``).
        scheduler_interval: epoch or step, for schedules that are not whole-run ones.
        monitor: what ``scheduler=plateau`` watches.
    """

    def __init__(
        self,
        optimizer: Callable | None = None,
        scheduler: Callable | None = None,
        in_channels: Annotated[int, Ge(1)] = 1,
        num_classes: Annotated[int, Ge(2)] = 4,
        width: Annotated[int, Ge(1)] = 16,
        depth: Annotated[int, Ge(1)] = 2,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        monitor: str = "val/miou",
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.in_channels, self.num_classes, self.depth = in_channels, num_classes, depth
        self.scheduler_interval, self.monitor = scheduler_interval, monitor
        self.net = UNet(in_channels, num_classes, width, depth)
        metrics = segmentation_metrics(num_classes)
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        classes = getattr(datamodule, "num_classes", None)
        if classes is not None and classes != self.num_classes:
            raise UserError(
                f"model.num_classes={self.num_classes}, but the data has {classes} classes: "
                f"set model.num_classes={classes}"
            )
        shape = getattr(datamodule, "input_shape", None)
        if shape:
            check_shape(tuple(shape), self.in_channels, self.depth)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, K, H, W)
        return self.net(x)

    def _shared_step(self, batch, stage: str) -> torch.Tensor:
        x, y = batch  # (B, C, H, W), (B, H, W)
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.log(f"{stage}/loss", loss, on_step=stage == "train", on_epoch=True,
                 prog_bar=stage == "train", batch_size=len(y))  # fmt: skip
        if stage != "train":
            pred = logits.argmax(1)  # (B, H, W)
            metrics = self.val_metrics if stage == "val" else self.test_metrics
            metrics.update(pred, y)
            self.log_dict(metrics, on_epoch=True, batch_size=len(y), prog_bar=stage == "val")
            self.log(f"{stage}/pixel_acc", (pred == y).float().mean(), batch_size=len(y))
        return loss

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, list | tuple) else batch
        return self(x).argmax(1)

    def trained_parameters(self):
        return self.net.parameters()


def check_shape(shape: tuple, in_channels: int, depth: int) -> None:
    """Refuse images ``(C, H, W)`` the U-Net cannot take, in one line naming the key.

    Raises:
        UserError: C is not ``in_channels``, or H or W not divisible by ``2**depth``.
    """
    c, h, w = (int(v) for v in shape)
    if c != in_channels:
        raise UserError(
            f"model.in_channels={in_channels}, but the images have {c}: set model.in_channels={c}"
        )
    step = 2**depth
    if h % step or w % step:
        raise UserError(
            f"images of {h}x{w}: model.depth={depth} needs H and W divisible by {step}; "
            f"set data.image_size or a smaller model.depth"
        )
