"""A small U-Net: an encoder that halves the resolution ``depth`` times, a decoder that
doubles it back, and skip connections joining each decoder stage to the encoder stage of
the same size, so the per-pixel logits see both the context and the fine detail."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import nn
from torch.nn import functional as F

from experiments.config.hints import Ge
from experiments.models.nets import double_conv


class UNet(nn.Module):
    """Per-pixel logits ``(B, num_classes, H, W)`` of images ``(B, in_channels, H, W)``.

    H and W must be divisible by ``2**depth`` (the decoder's upsampling then lands on the
    encoder's sizes exactly).

    Args:
        num_classes: classes per pixel, the background included.
        width: channels of the first stage; each deeper stage doubles them.
        depth: how many times the encoder halves the resolution.
    """

    def __init__(
        self,
        in_channels: Annotated[int, Ge(1)] = 1,
        num_classes: Annotated[int, Ge(2)] = 2,
        width: Annotated[int, Ge(1)] = 16,
        depth: Annotated[int, Ge(1)] = 2,
    ) -> None:
        super().__init__()
        self.depth = int(depth)
        widths = [int(width) * 2**i for i in range(self.depth + 1)]
        self.down = nn.ModuleList(
            [double_conv(in_channels, widths[0])]
            + [double_conv(widths[i], widths[i + 1]) for i in range(self.depth)]
        )
        self.up = nn.ModuleList(
            [nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2) for i in range(self.depth)]
        )
        self.merge = nn.ModuleList(
            [double_conv(2 * widths[i], widths[i]) for i in range(self.depth)]
        )
        self.head = nn.Conv2d(widths[0], num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)  # (B, width * 2**i, H / 2**i, W / 2**i)
        x = skips.pop()
        for i in reversed(range(self.depth)):
            x = self.merge[i](torch.cat([self.up[i](x), skips.pop()], dim=1))
        return self.head(x)
