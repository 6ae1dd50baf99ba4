"""Test-time augmentation: the views of a batch whose mean softmax is the prediction
(``model.tta`` in training's test, ``tta=`` of eval and predict)."""

from __future__ import annotations

import torch

TTA = ("none", "flip", "flip_translate")


def tta_views(mode: str):
    """The views test-time augmentation averages over: ``flip``, the batch and its mirror
    image (left-right); ``flip_translate``, those and the image shifted one pixel each way
    (zeros in, as the shift augmentation pads). None for ``none``."""
    if mode == "none":
        return None

    def views(x: torch.Tensor) -> list[torch.Tensor]:  # x: (B, C, H, W)
        out = [x, x.flip(-1)]
        if mode == "flip_translate":
            for dy, dx in ((0, 1), (0, -1), (1, 0), (-1, 0)):
                shifted = torch.roll(x, shifts=(dy, dx), dims=(-2, -1))
                if dy:
                    shifted[..., 0 if dy > 0 else -1, :] = 0
                if dx:
                    shifted[..., :, 0 if dx > 0 else -1] = 0
                out.append(shifted)
        return out

    return views
