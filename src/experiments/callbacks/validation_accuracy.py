"""Validation accuracy in depth: best-so-far, per class, confusion matrix, learning curves."""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path

import lightning as L
import torch
from matplotlib.figure import Figure  # object API: no global backend or pyplot state
from matplotlib.ticker import MaxNLocator

from experiments.models.metrics import summarize

log = logging.getLogger(__name__)


class ValidationAccuracy(L.Callback):
    """Validation accuracy from the confusion matrix the module keeps on the device
    (``ClassificationModule.val_stats``; no work of its own per step): logs ``val/acc_best``
    each validation epoch (each class's accuracy is its recall, ``val/recall/<name>``, which
    the module logs; run dirs written before also hold it as ``val/acc_class/<name>``), and
    at the end of fit writes ``confusion_matrix.csv``/``.png`` (last validation epoch, rows =
    true class) and ``learning_curves.png`` into ``dirpath``.

    Args:
        dirpath: where the files go; None means the trainer's ``default_root_dir``.
        plots: write the PNG files (the CSV is always written).
    """

    def __init__(self, dirpath: str | None = None, plots: bool = True) -> None:
        self.dirpath = Path(dirpath) if dirpath else None
        self.plots = plots
        self.best: float | None = None
        self.epoch_acc: float | None = None
        self.last_matrix: torch.Tensor | None = None
        self.history: list[dict[str, float]] = []

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = Path(trainer.default_root_dir)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        # the module's own confusion matrix (updated on the device every step); compute()
        # sums it over ranks once and caches it until the module resets it after logging
        stats = getattr(pl_module, "val_stats", None)
        if stats is None or stats.update_count == 0:
            return
        matrix = stats.compute()[0]  # (K, K)
        if trainer.sanity_checking:
            return
        acc = float(summarize(matrix)["acc"])  # what the module logs as val/acc
        self.epoch_acc = acc
        self.last_matrix = matrix.cpu()
        if math.isfinite(acc) and (self.best is None or acc > self.best):
            self.best = acc
        # the matrix is already summed over ranks: the same value everywhere, logged once
        pl_module.log(
            "val/acc_best", self.best if self.best is not None else acc, rank_zero_only=True
        )

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        metrics = trainer.callback_metrics
        row = {"epoch": trainer.current_epoch}
        for key in ("train/loss_epoch", "train/loss", "val/loss"):  # the first train loss wins
            if key in metrics:
                row.setdefault(key.removesuffix("_epoch"), float(metrics[key]))
        if self.epoch_acc is not None:
            row["val/acc"] = self.epoch_acc
        self.history.append(row)

    def state_dict(self) -> dict:
        # in every full checkpoint: a resumed run's curves and best value span all epochs
        return {"best": self.best, "history": self.history}

    def load_state_dict(self, state_dict: dict) -> None:
        self.best = state_dict.get("best")
        self.history = list(state_dict.get("history", []))

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero or self.last_matrix is None:
            return
        k = self.last_matrix.shape[0]
        names = list(getattr(trainer.datamodule, "class_names", []) or [])
        names = names if len(names) == k else [str(i) for i in range(k)]
        self.dirpath.mkdir(parents=True, exist_ok=True)
        with open(self.dirpath / "confusion_matrix.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["true\\predicted", *names])
            for name, row in zip(names, self.last_matrix.tolist(), strict=True):
                writer.writerow([name, *[int(v) for v in row]])
        if self.plots:
            self._plot_confusion(names)
            self._plot_curves()

    def _plot_confusion(self, names: list[str]) -> None:
        matrix = self.last_matrix.numpy()
        k = len(names)
        size = min(3 + 0.45 * k, 24)
        fig = Figure(figsize=(size, size * 0.85))
        ax = fig.add_subplot()
        image = ax.imshow(matrix, cmap="Blues")
        fig.colorbar(image, ax=ax, fraction=0.046)
        ax.set_xticks(range(k), names, rotation=90 if k > 10 else 0)
        ax.set_yticks(range(k), names)
        ax.set(xlabel="predicted", ylabel="true")
        acc = self.epoch_acc if self.epoch_acc is not None else float("nan")
        ax.set_title(f"validation confusion matrix (acc {acc:.3f})")
        if k <= 30:
            threshold = matrix.max() / 2
            for i in range(k):
                for j in range(k):
                    color = "white" if matrix[i, j] > threshold else "black"
                    ax.text(j, i, int(matrix[i, j]), ha="center", va="center", fontsize=7,
                            color=color)  # fmt: skip
        fig.tight_layout()
        fig.savefig(self.dirpath / "confusion_matrix.png", dpi=110)

    def _plot_curves(self) -> None:
        fig = Figure(figsize=(10, 4))
        loss_ax, acc_ax = fig.subplots(1, 2)
        for ax, ylabel, keys in ((loss_ax, "loss", ("train/loss", "val/loss")),
                                 (acc_ax, "accuracy", ("val/acc",))):  # fmt: skip
            for key in keys:
                points = [(r["epoch"] + 1, r[key]) for r in self.history if key in r]
                color = "tab:green" if key == "val/acc" else None
                if points:
                    ax.plot(*zip(*points, strict=True), marker="o", color=color, label=key)
            ax.set(xlabel="epoch", ylabel=ylabel)
            ax.legend()
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        fig.savefig(self.dirpath / "learning_curves.png", dpi=110)
