"""Semantic segmentation, a class per pixel, as a LightningModule that owns its net (no
``model.net``): the framework builds it from ``conf/model/unet.yaml`` (our small U-Net) or
``conf/model/smp_unet.yaml`` (any segmentation-models-pytorch architecture and encoder) and
hands it the optimizer and scheduler partials. Its only weights are ``net``'s, so the
checkpoints hold the net alone: what eval, predict and export load."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F
from torchmetrics import MetricCollection
from torchmetrics.segmentation import DiceScore, MeanIoU

from experiments.config.hints import Ge
from experiments.errors import UserError, one_line
from experiments.models.backbones import evaluating
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


def build_net(
    arch: str | None,
    encoder: str,
    in_channels: int,
    num_classes: int,
    width: int,
    depth: int,
    smp_options: dict[str, Any],
) -> nn.Module:
    """The net of ``SegmentationModule``'s arguments, from random weights (nothing is
    downloaded: a run's weights come from its own training or checkpoint).

    Raises:
        UserError: the optional package is missing, or it refuses the architecture, the
            encoder or an option (its own message, on one line, naming the key).
    """
    if arch is None:
        return UNet(in_channels, num_classes, width, depth)
    try:
        import segmentation_models_pytorch as smp  # lazy: optional extra, ~1 s with timm
    except ImportError:
        raise UserError(
            f"model.arch={arch} needs segmentation-models-pytorch: "
            "pip install 'experiments[segmentation]' (or model=unet, ours)"
        ) from None
    try:
        return smp.create_model(
            arch, encoder_name=encoder, encoder_weights=None, in_channels=in_channels,
            classes=num_classes, **smp_options,
        )  # fmt: skip
    except (KeyError, ValueError, TypeError, RuntimeError, AssertionError) as e:
        raise UserError(
            f"model.arch={arch} model.encoder={encoder} model.smp_options={smp_options}: "
            f"segmentation-models-pytorch refused it ({one_line(e)}); model=unet is ours"
        ) from None


class SegmentationModule(TaskSteps, L.LightningModule):
    """A segmentation net (``build_net``) trained with per-pixel cross-entropy; logs
    ``<stage>/loss``, and for val and test ``<stage>/miou``, ``/dice`` and ``/pixel_acc``.

    Args:
        optimizer, scheduler, scheduler_interval, monitor: as ``TaskSteps`` says.
        in_channels: image channels (the data's ``input_shape[0]``).
        num_classes: classes per pixel, the background included (the data's class count).
        width: channels of the U-Net's first stage.
        depth: how many times it halves the resolution (H, W divisible by ``2**depth``).
        arch: None for ours (``width``, ``depth``), or a segmentation-models-pytorch
            architecture name (``Unet``, ``FPN``, ``DeepLabV3Plus``, ...; needs the
            ``experiments[segmentation]`` extra).
        encoder: the segmentation-models-pytorch encoder (``resnet18``, ``efficientnet-b0``,
            ``tu-<timm name>``, ...), from random weights; unused by ours.
        smp_options: further keyword arguments of that architecture (``encoder_depth``,
            ``decoder_channels``, ...).
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
        arch: str | None = None,
        encoder: str = "resnet18",
        smp_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.in_channels, self.num_classes, self.depth = in_channels, num_classes, depth
        self.scheduler_interval, self.monitor = scheduler_interval, monitor
        self.net = build_net(
            arch, encoder, in_channels, num_classes, width, depth, dict(smp_options or {})
        )
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
            check_shape(tuple(shape), self.in_channels, self.depth, self.net)

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
        return self(batch[0] if isinstance(batch, list | tuple) else batch).argmax(1)

    def trained_parameters(self):
        return self.net.parameters()


def check_shape(shape: tuple, in_channels: int, depth: int, net: nn.Module) -> None:
    """Refuse images ``(C, H, W)`` the net cannot take, in one line naming the key.

    Raises:
        UserError: C is not ``in_channels``; for our U-Net, H or W not divisible by
            ``2**depth``; for another net, one image in gives an error or a mask of another
            size out (segmentation-models-pytorch nets need sides divisible by 32 at their
            default depth).
    """
    c, h, w = (int(v) for v in shape)
    if c != in_channels:
        raise UserError(
            f"model.in_channels={in_channels}, but the images have {c}: set model.in_channels={c}"
        )
    if isinstance(net, UNet):
        step = 2**depth
        if h % step or w % step:
            raise UserError(
                f"images of {h}x{w}: model.depth={depth} needs H and W divisible by {step}; "
                f"set data.image_size or a smaller model.depth"
            )
        return
    try:
        with evaluating(net):
            out = net(torch.zeros(1, c, h, w, device=next(net.parameters()).device))
    except (RuntimeError, ValueError) as e:
        raise UserError(
            f"images of {h}x{w} do not fit this net ({one_line(e)}): set data.image_size "
            "(sides divisible by 32 for most segmentation-models-pytorch nets)"
        ) from None
    if tuple(out.shape[-2:]) != (h, w):
        raise UserError(
            f"images of {h}x{w} give masks of {out.shape[-2]}x{out.shape[-1]}: set "
            "data.image_size to sides divisible by 32, or model.smp_options.encoder_depth"
        )
