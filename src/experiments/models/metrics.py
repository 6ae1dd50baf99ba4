"""Classification metrics kept on the device: per step only a bincount into a confusion
matrix (and a top-k counter), no host sync; everything else is derived from the matrix
once per epoch."""

from __future__ import annotations

from typing import Any

import torch
from torchmetrics import Metric

from experiments.errors import UserError


class ConfusionStats(Metric):
    """A ``(K, K)`` confusion matrix (rows = true class) and a top-k hit counter.

    ``compute()`` returns the matrix and the top-k hits, summed across ranks under DDP;
    ``summarize`` turns them into accuracy, macro-F1, balanced accuracy and per-class
    precision / recall. About 20 µs per update on a CPU: no argument validation.

    Args:
        top_k: also count how often the label is among the ``top_k`` highest logits
            (None: not counted).
    """

    full_state_update = False

    def __init__(self, num_classes: int, top_k: int | None = None) -> None:
        super().__init__()
        k = self.num_classes = int(num_classes)
        self.top_k = top_k
        self.add_state("matrix", torch.zeros((k, k), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("topk_hits", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:  # (B, K), (B,)
        k = self.num_classes
        pairs = labels.long() * k + logits.argmax(dim=1)  # (B,) row-major cell index
        # in place: `self.x += ...` would go through nn.Module.__setattr__ (~4 µs a call)
        self.matrix.add_(torch.bincount(pairs, minlength=k * k).view(k, k))
        if self.top_k is not None:
            top = logits.topk(self.top_k, dim=1).indices  # (B, top_k)
            self.topk_hits.add_((top == labels.view(-1, 1)).any(dim=1).sum())

    def compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.matrix, self.topk_hits


def summarize(
    matrix: torch.Tensor, topk_hits: torch.Tensor | None = None, top_k: int | None = None
) -> dict[str, torch.Tensor]:
    """Scalar metrics of a confusion matrix (rows = true class, columns = predicted).

    ``acc`` (micro), ``balanced_acc`` (mean recall over the classes that occur),
    ``macro_f1`` (mean F1 over the classes that occur or are predicted, as
    scikit-learn's ``f1_score(average="macro")`` over the labels present), ``top<k>_acc``,
    and per class ``precision/<i>`` and ``recall/<i>`` (0 where undefined, as sklearn's
    ``zero_division=0``).

    When some classes have no sample in the matrix (a split that lacks them), the macro
    values cover only the classes present, so a perfect score on two of ten classes reads
    1.0; ``missing_classes`` (the number of classes with no sample) is then added, and
    lands in metrics.json as ``<split>/missing_classes`` so that such a score is marked.
    """
    m = matrix.double()
    total = m.sum().clamp_min(1)
    true = m.sum(dim=1)  # (K,) samples per true class
    predicted = m.sum(dim=0)  # (K,) predictions per class
    hits = m.diag()
    recall = hits / true.clamp_min(1)
    precision = hits / predicted.clamp_min(1)
    f1 = 2 * hits / (true + predicted).clamp_min(1)
    present = true > 0
    seen = present | (predicted > 0)
    out = {
        "acc": hits.sum() / total,
        "balanced_acc": recall[present].mean() if present.any() else m.new_zeros(()),
        "macro_f1": f1[seen].mean() if seen.any() else m.new_zeros(()),
    }
    if top_k is not None and topk_hits is not None:
        out[f"top{top_k}_acc"] = topk_hits.double() / total
    missing = (~present).sum()
    if m.sum() > 0 and missing > 0:  # one host sync per epoch, on the summed matrix
        out["missing_classes"] = missing.double()
    for i in range(m.shape[0]):
        out[f"precision/{i}"] = precision[i]
        out[f"recall/{i}"] = recall[i]
    return {name: value.float() for name, value in out.items()}


class TrainTotals(torch.nn.Module):
    """The training epoch's accuracy and loss as on-device sums, added to in place each step
    (no torchmetrics wrapper, no Lightning result state per step); ``take`` sums them over
    ranks, returns ``train/acc`` and ``train/loss`` and starts them again at zero."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("correct", torch.zeros((), dtype=torch.long), persistent=False)
        self.register_buffer("loss_sum", torch.zeros((), dtype=torch.float64), persistent=False)
        self.seen = [0]  # a list: an int attribute would go through nn.Module.__setattr__

    def add(self, logits: torch.Tensor, labels: torch.Tensor, loss: torch.Tensor, n: int) -> None:
        self.correct.add_((logits.argmax(dim=1) == labels).sum())  # (B, K), (B,)
        self.loss_sum.add_(loss.detach() * n)
        self.seen[0] += n

    def take(self, strategy) -> dict[str, torch.Tensor]:
        seen = torch.tensor(float(self.seen[0]), dtype=torch.float64, device=self.correct.device)
        sums = torch.stack((self.correct.double(), self.loss_sum, seen))
        if strategy is not None:  # a no-op on one device
            sums = strategy.reduce(sums, reduce_op="sum")
        self.correct.zero_()
        self.loss_sum.zero_()
        self.seen[0] = 0
        n = sums[2].clamp_min(1)
        return {"train/acc": (sums[0] / n).float(), "train/loss": (sums[1] / n).float()}


class RunningMean(Metric):
    """Weighted mean of per-batch values (the epoch loss), kept on the device."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, value: torch.Tensor, weight: int) -> None:
        self.total.add_(value.detach() * weight)  # in place, as above
        self.weight.add_(weight)

    def compute(self) -> torch.Tensor:
        return (self.total / self.weight.clamp_min(1)).float()


def resolve_top_k(top_k, num_classes: int) -> int | None:
    if top_k == "auto":
        return 5 if int(num_classes) >= 10 else None
    if top_k is None:
        return None
    if not 1 <= int(top_k) <= int(num_classes):
        raise UserError(
            f"model.top_k={top_k} must be between 1 and the {num_classes} classes (or null, auto)"
        )
    return int(top_k)


def log_to_loggers(trainer, values: dict[str, Any], step: int | None = None) -> None:
    """Hand values straight to every logger and to ``trainer.callback_metrics`` (the progress
    bar, ``metrics.json``): per-step values (``train/loss_step``, at ``step``, the one
    Lightning's own step logging uses) and epoch-level values that nothing monitors (per-class
    metrics, at the current step), which must already be the same on every rank. Only rank 0
    writes, one row with the ``epoch`` key.

    ``self.log`` costs ~1.5 ms per call on a CPU, mostly Lightning re-homing its result
    object (a walk of its ``__dict__``): ~150 µs a step at ``log_every_n_steps=10`` on a
    small net, and ~0.3 ms per key even once per epoch (30 per-class keys were ~10 % of a
    short epoch's time). This reads each value once (the host sync Lightning's logging does
    too)."""
    if trainer is None or not values or trainer.sanity_checking:
        return
    floats = {key: float(value) for key, value in values.items()}
    trainer.callback_metrics.update({k: torch.tensor(v) for k, v in floats.items()})
    if trainer.is_global_zero:
        row = {**floats, "epoch": trainer.current_epoch}
        for logger in trainer.loggers:
            logger.log_metrics(row, step=trainer.global_step if step is None else step)


def run_test(trainer, model, datamodule) -> dict[str, float]:
    """``trainer.test`` and every ``test/`` value it produced as floats: what ``test()``
    returns plus the per-class values that went to the loggers directly."""
    metrics: dict[str, float] = {}
    for result in trainer.test(model, datamodule=datamodule, verbose=False):
        metrics.update({k: float(v) for k, v in result.items()})
    for key, value in trainer.callback_metrics.items():
        if key.startswith("test/") and key not in metrics and value.numel() == 1:
            metrics[key] = float(value)
    return metrics
