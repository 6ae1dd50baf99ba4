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
