"""Small picklable transforms (DataLoader workers pickle them; lambdas would fail)."""

from __future__ import annotations

import torch


class OneHot:
    """Class index -> one-hot float vector of length ``num_classes``.

    The scatter form of ``Lambda(lambda y: zeros(n).scatter_(0, tensor(y), 1))``,
    as a class so that it pickles into DataLoader workers.
    """

    def __init__(self, num_classes: int) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.num_classes = num_classes

    def __call__(self, target: int) -> torch.Tensor:
        out = torch.zeros(self.num_classes, dtype=torch.float32)
        return out.scatter_(0, torch.tensor([int(target)]), 1.0)

    def __repr__(self) -> str:
        return f"OneHot(num_classes={self.num_classes})"


# transforms that map the same input to the same output every time (torchvision classes
# by name, in both transforms and transforms.v2); anything else counts as random
DETERMINISTIC = frozenset(
    {
        "CenterCrop",
        "ConvertImageDtype",
        "Grayscale",
        "Identity",
        "Normalize",
        "PILToTensor",
        "Resize",
        "ToDtype",
        "ToImage",
        "ToPILImage",
        "ToPureTensor",
        "ToTensor",
    }
)


def is_deterministic(transform) -> bool:
    """Whether ``transform`` (None, one transform or a Compose of them) has no randomness.

    Only known transforms count: torchvision's resizing, cropping-to-centre, dtype and
    normalization transforms, and :class:`OneHot`. Anything unknown (a random
    augmentation, a user's callable) is taken to be random, so its output is never cached.
    """
    if transform is None or isinstance(transform, OneHot):
        return True
    cls = type(transform)
    if cls.__name__ == "Compose" and cls.__module__.startswith("torchvision.transforms"):
        return all(is_deterministic(t) for t in transform.transforms)
    return cls.__module__.startswith("torchvision.transforms") and cls.__name__ in DETERMINISTIC
