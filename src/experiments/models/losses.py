"""Classification losses: cross-entropy (torch's own) and focal loss, each with optional
class weights and label smoothing, for class indices or soft (MixUp/CutMix) targets."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from experiments.errors import UserError


class FocalLoss(nn.Module):
    """Focal loss (Lin et al. 2017): cross-entropy with each sample's term scaled by
    ``(1 - p_target) ** gamma``, so easy, confidently right samples weigh little.

    With class weights the mean is taken over the weights of the samples' classes, as
    torch's weighted cross-entropy does; ``gamma=0`` gives exactly that cross-entropy.
    """

    def __init__(
        self,
        gamma: float = 2.0,
        weight: torch.Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        self.gamma, self.label_smoothing = float(gamma), float(label_smoothing)
        self.register_buffer("weight", weight, persistent=False)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        log_p = F.log_softmax(logits.float(), dim=1)  # (B, K)
        k = logits.shape[1]
        soft = F.one_hot(target, k).to(log_p.dtype) if target.ndim == 1 else target.float()
        if self.label_smoothing:
            soft = soft * (1 - self.label_smoothing) + self.label_smoothing / k
        per_class = -soft * log_p * (1 - log_p.exp()).pow(self.gamma)  # (B, K)
        if self.weight is None:
            return per_class.sum(dim=1).mean()
        w = self.weight.to(log_p.dtype)
        # the denominator torch's cross-entropy uses: each sample's (target) class weight
        return (per_class * w).sum() / (soft * w).sum().clamp_min(1e-12)


class LogitAdjustedLoss(nn.Module):
    """Logit-adjusted cross-entropy (Menon et al., 2021, "Long-tail learning via logit
    adjustment"): cross-entropy of ``logits + tau * log(prior)``. Training against the
    prior's offsets leaves the raw logits estimating the balanced (class-uniform) posterior,
    so the net is used as it is: nothing to apply at inference."""

    def __init__(self, prior: Sequence[float], tau: float, label_smoothing: float = 0.0):
        super().__init__()
        offsets = float(tau) * torch.tensor(prior, dtype=torch.float32).clamp_min(1e-12).log()
        self.register_buffer("offsets", offsets)
        self.ce = nn.CrossEntropyLoss(label_smoothing=float(label_smoothing))

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.ce(logits + self.offsets.to(logits.dtype), target)


def make_loss(
    name: str,
    label_smoothing: float,
    class_weights: Sequence[float] | None,
    focal_gamma: float,
    class_prior: Sequence[float] | None = None,
    tau: float = 1.0,
) -> nn.Module:
    weight = None if class_weights is None else torch.tensor(class_weights, dtype=torch.float32)
    if name == "focal":
        return FocalLoss(focal_gamma, weight, label_smoothing)
    if name == "logit_adjusted":
        if class_prior is None:
            raise UserError("model.loss=logit_adjusted needs the class prior of the train split")
        if weight is not None:
            raise UserError(
                "model.loss=logit_adjusted already balances: set model.class_weights=null"
            )
        return LogitAdjustedLoss(class_prior, tau, label_smoothing)
    return nn.CrossEntropyLoss(weight=weight, label_smoothing=float(label_smoothing))


def class_prior(targets: Sequence[int], num_classes: int) -> list[float]:
    """Each class's share of the training samples."""
    counts = torch.bincount(torch.as_tensor(list(targets), dtype=torch.long), minlength=num_classes)
    return (counts.double() / counts.sum().clamp_min(1)).tolist()


def inverse_frequency(targets: Sequence[int], num_classes: int) -> list[float]:
    """``n / (K * n_c)`` per class c (1.0 for every class when balanced); a class with no
    training sample gets weight 0 (it cannot be learned from this split anyway)."""
    counts = torch.bincount(torch.as_tensor(list(targets), dtype=torch.long), minlength=num_classes)
    n = float(counts.sum())
    return [round(n / (num_classes * float(c)), 6) if c > 0 else 0.0 for c in counts[:num_classes]]


def check_class_weights(weights, num_classes: int) -> list[float] | None:
    if weights is None or weights == "auto":  # auto is resolved by the builder, if training
        return None
    if isinstance(weights, str) or len(weights) != int(num_classes):
        raise UserError(
            f"model.class_weights={weights!r}: give auto, null or {num_classes} numbers"
        )
    values = [float(w) for w in weights]
    if min(values) < 0:
        raise UserError(f"model.class_weights={values}: weights must be >= 0")
    return values
