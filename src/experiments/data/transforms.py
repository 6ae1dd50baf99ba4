"""Small picklable transforms (DataLoader workers pickle them; lambdas would fail)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchvision.transforms import v2


class OneHot:
    """Class index -> one-hot float vector of length ``num_classes``."""

    def __init__(self, num_classes: int) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.num_classes = num_classes

    def __call__(self, target: int) -> torch.Tensor:
        out = torch.zeros(self.num_classes, dtype=torch.float32)
        return out.scatter_(0, torch.tensor([int(target)]), 1.0)

    def __repr__(self) -> str:
        return f"OneHot(num_classes={self.num_classes})"


DETERMINISTIC = frozenset(
    "CenterCrop ConvertImageDtype Grayscale Identity Normalize PILToTensor Resize ToDtype "
    "ToImage ToPILImage ToPureTensor ToTensor".split()
)


def is_deterministic(transform) -> bool:
    """Whether ``transform`` (None, one transform or a Compose of them) has no randomness.

    Only known transforms count: torchvision's resizing, cropping-to-centre, dtype and
    normalization transforms (``DETERMINISTIC``, by class name, in both ``transforms`` and
    ``transforms.v2``), and :class:`OneHot`. Anything unknown (a random
    augmentation, a user's callable) is taken to be random, so its output is never cached.
    """
    if transform is None or isinstance(transform, OneHot):
        return True
    cls = type(transform)
    if cls.__name__ == "Compose" and cls.__module__.startswith("torchvision.transforms"):
        return all(is_deterministic(t) for t in transform.transforms)
    return cls.__module__.startswith("torchvision.transforms") and cls.__name__ in DETERMINISTIC


def batch_mixer(mixup_alpha: float, cutmix_alpha: float, num_classes: int) -> Callable:
    """MixUp and/or CutMix of a whole batch (torchvision's), one of them per batch."""
    mixers = []
    if mixup_alpha > 0:
        mixers.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
    if cutmix_alpha > 0:
        mixers.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
    return mixers[0] if len(mixers) == 1 else v2.RandomChoice(mixers)


class RandomShift:
    """Pad by ``padding`` pixels on every side, then crop back to the input's own size at a
    random place: the CIFAR-style "crop with padding", for any image size (PIL or tensor).

    Args:
        padding: pixels added on each side (the largest shift).
        padding_mode: ``constant`` (zeros), ``reflect``, ``edge`` or ``symmetric``.
    """

    def __init__(self, padding: int = 4, padding_mode: str = "constant") -> None:
        self.padding, self.padding_mode = padding, padding_mode

    def __call__(self, image):
        height, width = v2.functional.get_size(image)
        crop = v2.RandomCrop((height, width), padding=self.padding, padding_mode=self.padding_mode)
        return crop(image)

    def __repr__(self) -> str:
        return f"RandomShift(padding={self.padding}, padding_mode={self.padding_mode!r})"
