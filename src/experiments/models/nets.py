"""Plain nn.Modules. Each takes ``in_shape`` (C, H, W) and ``num_classes`` from the data
(handed over by train.py) plus its own hyper-parameters from config, and returns logits."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


class MLP(nn.Sequential):
    """Flatten -> (Linear -> ReLU [-> Dropout]) per hidden size -> Linear. No softmax.

    Args:
        in_shape: shape of one sample, e.g. ``(1, 8, 8)``.
        num_classes: number of output logits.
        hidden_sizes: width of each hidden layer.
        dropout: dropout probability after each hidden layer (0 disables it).
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        num_classes: int,
        hidden_sizes: Sequence[int] = (128, 64),
        dropout: float = 0.0,
    ) -> None:
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(in_shape)
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        super().__init__(*layers)


class CNN(nn.Module):
    """Conv blocks (conv3x3 -> BN -> ReLU -> maxpool) -> global average pool -> Linear.

    Global pooling makes the head independent of the image size. Pooling stops once
    the feature map is 2x2, so 8x8 digits and 224x224 photos both work.

    Args:
        in_shape: shape of one sample, ``(C, H, W)``.
        num_classes: number of output logits.
        channels: output channels of each conv block.
        dropout: dropout probability before the classifier.
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        num_classes: int,
        channels: Sequence[int] = (32, 64),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        c, h, w = in_shape
        blocks: list[nn.Module] = []
        for out in channels:
            blocks += [nn.Conv2d(c, out, 3, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU()]
            if min(h, w) >= 4:
                blocks.append(nn.MaxPool2d(2))
                h, w = h // 2, w // 2
            c = out
        self.features = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(c, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, num_classes)
        return self.head(self.features(x))


def resnet18(in_shape: Sequence[int], num_classes: int, small_input: bool = True) -> nn.Module:
    """torchvision's ResNet-18 (random init, ``weights=None``) adapted to the data.

    Args:
        in_shape: shape of one sample, ``(C, H, W)``; the stem takes ``C`` channels.
        num_classes: number of output logits.
        small_input: for images up to 64 px, a 3x3 stride-1 stem without max-pool (the
            CIFAR variant) instead of 7x7 stride 2 + max-pool, which would shrink a
            32x32 image to 1x1 by the last stage.
    """
    from torchvision.models import resnet18 as tv_resnet18

    net = tv_resnet18(weights=None, num_classes=num_classes)
    c, h, w = in_shape
    if small_input and max(h, w) <= 64:
        net.conv1 = nn.Conv2d(c, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    elif c != 3:
        net.conv1 = nn.Conv2d(c, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return net
