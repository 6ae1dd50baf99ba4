"""Plain nn.Modules. Each takes ``in_shape`` (C, H, W) of one sample and ``num_classes`` (the
logits it returns) from the data (handed over by training/pipeline.py), plus its own
hyper-parameters from config (the Args below)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated

import torch
from torch import nn
from torchvision.models import resnet18 as tv_resnet18

from experiments.config.hints import Ge, Gt, Le, Length, Lt


def conv_bn_relu(
    c_in: int, c_out: int, bn_momentum: float = 0.1, kernel: int = 3, stride: int = 1
) -> list[nn.Module]:
    """Conv (same padding, no bias) -> BatchNorm -> ReLU. Keeps H and W at stride 1."""
    return [
        nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(c_out, momentum=bn_momentum),
        nn.ReLU(inplace=True),
    ]


def double_conv(c_in: int, c_out: int) -> nn.Sequential:
    """Two conv3x3-BN-ReLU layers: a residual block's body, a U-Net stage."""
    return nn.Sequential(*conv_bn_relu(c_in, c_out), *conv_bn_relu(c_out, c_out))


class MLP(nn.Sequential):
    """Flatten -> (Linear -> ReLU [-> Dropout]) per hidden size -> Linear. No softmax.

    Args:
        dropout: dropout probability after each hidden layer (0 disables it).
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        num_classes: int,
        hidden_sizes: Sequence[Annotated[int, Ge(1)]] = (128, 64),
        dropout: Annotated[float, Ge(0), Lt(1)] = 0.0,
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
    """VGG-style CNN: blocks of (conv3x3 -> BN -> ReLU) x N -> maxpool, then a spatial head.

    Each block halves the feature map with a 2x2 max-pool only while its shorter side is at
    least ``min_pool_size`` (28 -> 14 -> 7 for MNIST, 8 -> 4 -> 4 for 8x8 digits, 32 -> 16 -> 8
    for CIFAR). The head adaptive-average-pools the map to a small fixed grid
    (``head_pool`` x ``head_pool``) instead of 1x1, so it keeps *where* features are (stroke
    positions matter for digits) while its size stays independent of the input size.

    Args:
        channels: output channels of each block.
        convs_per_block: conv3x3-BN-ReLU layers per block (2 = VGG style).
        min_pool_size: pool after a block only while ``min(H, W) >= min_pool_size``.
        head_pool: side of the grid the head pools to (capped at the map size); 1 gives
            global average pooling.
        hidden: width of a hidden fully connected layer in the head (0: none).
        dropout: dropout probability before each linear layer of the head.
        bn_momentum: BatchNorm's running-statistics momentum. Higher than torch's 0.1 so
            that eval-mode statistics keep up with weights that still move fast (short
            runs at a constant LR): with 0.1, one MNIST epoch scored 0.963 in eval mode
            against 0.985 with the same weights' batch statistics.
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        num_classes: int,
        channels: Sequence[Annotated[int, Ge(1)]] = (32, 64),
        convs_per_block: Annotated[int, Ge(1)] = 2,
        min_pool_size: Annotated[int, Ge(1)] = 8,
        head_pool: Annotated[int, Ge(1)] = 7,
        hidden: Annotated[int, Ge(0)] = 0,
        dropout: Annotated[float, Ge(0), Lt(1)] = 0.25,
        bn_momentum: Annotated[float, Ge(0), Le(1)] = 0.5,
    ) -> None:
        super().__init__()
        c, h, w = in_shape
        layers: list[nn.Module] = []
        for out in channels:
            for i in range(convs_per_block):
                layers += conv_bn_relu(c if i == 0 else out, out, bn_momentum)  # (B, out, h, w)
            if min(h, w) >= min_pool_size:
                layers.append(nn.MaxPool2d(2))  # (B, out, h/2, w/2)
                h, w = h // 2, w // 2
            c = out
        self.features = nn.Sequential(*layers)
        grid = (min(head_pool, h), min(head_pool, w))
        head: list[nn.Module] = [nn.AdaptiveAvgPool2d(grid), nn.Flatten()]  # (B, c * gh * gw)
        width = c * grid[0] * grid[1]
        if hidden > 0:  # (B, hidden)
            head += [nn.Dropout(dropout), nn.Linear(width, hidden), nn.ReLU(inplace=True)]
            width = hidden
        head += [nn.Dropout(dropout), nn.Linear(width, num_classes)]  # (B, num_classes)
        self.head = nn.Sequential(*head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, num_classes)
        return self.head(self.features(x))


class Residual(nn.Module):
    """``x + f(x)`` where ``f`` is two conv3x3-BN-ReLU layers with ``channels`` channels."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = double_conv(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, c, h, w) -> (B, c, h, w)
        return x + self.body(x)


class ResNet9(nn.Module):
    """ResNet-9 of the fast CIFAR-10 recipes (Page's DAWNBench net, the ancestor of airbench).

    Layout for a 3x32x32 input with the default widths (64, 128, 256, 512)::

        prep    conv3x3-BN-ReLU 64                          -> (B,  64, 32, 32)
        layer1  conv3x3-BN-ReLU 128, maxpool2, Residual(128) -> (B, 128, 16, 16)
        layer2  conv3x3-BN-ReLU 256, maxpool2                -> (B, 256,  8,  8)
        layer3  conv3x3-BN-ReLU 512, maxpool2, Residual(512) -> (B, 512,  4,  4)
        head    global max-pool, flatten, Linear(512, K), x logit_scale

    Any input size and channel count works: images whose shorter side exceeds ``large_input``
    px get a stride-2 prep layer and then a 2x2 max-pool (224 -> 56), and the stages only
    pool while the map is at least 2x2, so even 8x8 inputs end in a valid map.

    Args:
        widths: channels of prep, layer1, layer2 and layer3. (32, 64, 128, 256) is a
            4x cheaper variant for CPU runs.
        residual_stages: indices of stages (1..3) followed by a residual block.
        logit_scale: multiplies the logits (0.125 in the reference recipe; it keeps the
            initial softmax soft, which works like a temperature).
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        num_classes: int,
        widths: Annotated[Sequence[Annotated[int, Ge(1)]], Length(4)] = (64, 128, 256, 512),
        residual_stages: Sequence[Annotated[int, Ge(1), Le(3)]] = (1, 3),
        logit_scale: Annotated[float, Gt(0)] = 0.125,
        large_input: Annotated[int, Ge(1)] = 64,
    ) -> None:
        super().__init__()
        c, h, w = in_shape
        stride = 2 if min(h, w) > large_input else 1
        prep = conv_bn_relu(c, widths[0], stride=stride)
        if stride == 2:
            prep.append(nn.MaxPool2d(2))
            h, w = h // 4, w // 4
        stages: list[nn.Module] = [nn.Sequential(*prep)]  # (B, widths[0], h, w)
        for i, (c_in, c_out) in enumerate(zip(widths[:-1], widths[1:], strict=False), start=1):
            stage = conv_bn_relu(c_in, c_out)
            if min(h, w) >= 2:
                stage.append(nn.MaxPool2d(2))  # (B, c_out, h/2, w/2)
                h, w = h // 2, w // 2
            if i in residual_stages:
                stage.append(Residual(c_out))
            stages.append(nn.Sequential(*stage))
        self.features = nn.Sequential(*stages)  # (B, widths[-1], h, w)
        self.pool = nn.AdaptiveMaxPool2d(1)  # (B, widths[-1], 1, 1)
        self.fc = nn.Linear(widths[-1], num_classes, bias=False)
        self.logit_scale = logit_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, num_classes)
        x = self.pool(self.features(x)).flatten(1)  # (B, widths[-1])
        return self.fc(x) * self.logit_scale


def resnet18(in_shape: Sequence[int], num_classes: int, small_input: bool = True) -> nn.Module:
    """torchvision's ResNet-18 (random init, ``weights=None``) adapted to the data.

    Args:
        small_input: for images up to 64 px, a 3x3 stride-1 stem without max-pool (the
            CIFAR variant) instead of 7x7 stride 2 + max-pool, which would shrink a
            32x32 image to 1x1 by the last stage.
    """
    net = tv_resnet18(weights=None, num_classes=num_classes)
    c, h, w = in_shape
    if small_input and max(h, w) <= 64:
        net.conv1 = nn.Conv2d(c, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    elif c != 3:
        net.conv1 = nn.Conv2d(c, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return net


class SpeedNet(nn.Module):
    """A compact CNN for CPU speedruns: downsamples early, so most convolutions run on small maps.

    Layout for a 1x28x28 input with the default widths (16, 32, 64)::

        stem    conv5x5-BN-ReLU 16, maxpool2   -> (B, 16, 14, 14)
        block1  conv3x3-BN-ReLU 32, maxpool2   -> (B, 32,  7,  7)
        block2  conv3x3-BN-ReLU 64, maxpool2   -> (B, 64,  3,  3)
        head    flatten, dropout, Linear(64 * 3 * 3, K)

    Each stage pools only while the map is at least 2x2, so small inputs still work.

    Args:
        widths: output channels of the stem and of each following conv stage.
        stem_kernel: kernel size of the stem convolution (odd).
        bn_momentum: BatchNorm's running-statistics momentum (high for short runs, see
            :class:`CNN`).
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        num_classes: int,
        widths: Sequence[Annotated[int, Ge(1)]] = (16, 32, 64),
        stem_kernel: Annotated[int, Ge(1)] = 5,
        dropout: Annotated[float, Ge(0), Lt(1)] = 0.0,
        bn_momentum: Annotated[float, Ge(0), Le(1)] = 0.3,
    ) -> None:
        super().__init__()
        c, h, w = in_shape
        layers: list[nn.Module] = []
        for i, out in enumerate(widths):  # (B, out, h, w), then pooled
            layers += conv_bn_relu(c, out, bn_momentum, stem_kernel if i == 0 else 3)
            if min(h, w) >= 2:
                layers.append(nn.MaxPool2d(2))  # (B, out, h/2, w/2)
                h, w = h // 2, w // 2
            c = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.Flatten(), nn.Dropout(dropout), nn.Linear(c * h * w, num_classes)
        )  # (B, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, num_classes)
        return self.head(self.features(x))
