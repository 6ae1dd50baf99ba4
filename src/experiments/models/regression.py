"""Regression of one number per row of tabular features, as a LightningModule that owns
its layers (no ``model.net``): the framework builds it from ``conf/model/regressor.yaml``
and hands it the optimizer and scheduler partials.

The module standardizes features and target itself, with statistics fitted on the train
split (the data module's ``standardization``) and kept as buffers: the saved weights carry
them, so eval and predict undo the standardization with the numbers training used. It
trains in standardized units and logs ``<stage>/mae``, ``/mse`` and ``/r2`` in the
target's original units."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Literal

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection, R2Score

from experiments.config.hints import Ge, Le
from experiments.errors import UserError
from experiments.models.backbones import evaluating
from experiments.models.schedules import TaskSteps

LOSSES = {"mse": F.mse_loss, "l1": F.l1_loss, "huber": F.smooth_l1_loss}


class RegressionModule(TaskSteps, L.LightningModule):
    """An MLP (``hidden_sizes=[]``: a linear model) from ``in_features`` to one value.

    Args:
        optimizer, scheduler, scheduler_interval, monitor: as ``TaskSteps`` says.
        in_features: feature columns per row (the data module's ``num_features``).
        hidden_sizes: widths of the hidden layers; [] is linear regression.
        loss: of the standardized target: mse, l1 (the median: what MAE rewards) or huber.
        dropout: after each hidden layer.
    """

    def __init__(
        self,
        optimizer: Callable | None = None,
        scheduler: Callable | None = None,
        in_features: Annotated[int, Ge(1)] = 1,
        hidden_sizes: Sequence[int] = (),
        loss: Literal["mse", "l1", "huber"] = "mse",
        dropout: Annotated[float, Ge(0), Le(1)] = 0.0,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        monitor: str = "val/mae",
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.in_features, self.loss_name = int(in_features), loss
        self.scheduler_interval, self.monitor = scheduler_interval, monitor
        widths = [self.in_features, *(int(w) for w in hidden_sizes)]
        layers: list[nn.Module] = []
        for a, b in zip(widths[:-1], widths[1:], strict=True):
            layers += [nn.Linear(a, b), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
        # not named `net`: the checkpoints then hold the whole module, buffers included
        self.layers = nn.Sequential(*layers, nn.Linear(widths[-1], 1))
        # fitted when target_std > 0
        self.register_buffer("feature_mean", torch.zeros(self.in_features))
        self.register_buffer("feature_std", torch.ones(self.in_features))
        self.register_buffer("target_mean", torch.zeros(()))
        self.register_buffer("target_std", torch.zeros(()))
        metrics = MetricCollection(
            {"mae": MeanAbsoluteError(), "mse": MeanSquaredError(), "r2": R2Score()}
        )
        # float64 sums: R² is 1 - SSres / (sum y² - (sum y)² / n), which cancels away in
        # float32 when the target's mean is large beside its spread (prices, say)
        metrics.set_dtype(torch.float64)
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")

    @property
    def fitted(self) -> bool:
        return bool(self.target_std > 0)

    def set_standardization(
        self,
        feature_mean: Sequence[float],
        feature_std: Sequence[float],
        target_mean: float,
        target_std: float,
    ) -> None:
        """Use these statistics (the data module's ``standardization``, fitted on train)."""
        if len(feature_mean) != self.in_features or len(feature_std) != self.in_features:
            raise UserError(
                f"model.in_features={self.in_features}, but the data has {len(feature_mean)} "
                f"feature columns: set model.in_features={len(feature_mean)}"
            )
        values = [*feature_mean, *feature_std, target_mean, target_std]
        if not all(torch.isfinite(torch.tensor(values, dtype=torch.float64))):
            raise UserError("the train split's feature or target statistics are not finite")
        with torch.no_grad():
            self.feature_mean.copy_(torch.as_tensor(feature_mean))
            self.feature_std.copy_(torch.as_tensor(feature_std))
            self.target_mean.fill_(float(target_mean))
            self.target_std.fill_(float(target_std))

    def setup(self, stage: str) -> None:
        # weights loaded before (eval, predict, resume's restore comes after) keep the
        # statistics they were trained with; a fresh module takes the data's
        if self.fitted:
            return
        datamodule = getattr(self.trainer, "datamodule", None)
        stats = getattr(datamodule, "standardization", None)
        if not stats:
            raise UserError(
                "model: RegressionModule needs a data module with a `standardization` "
                "(data=diabetes, or experiments.data.tabular.TabularData)"
            )
        self.set_standardization(**stats)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, F) raw -> (B,) standardized
        return self.layers((x - self.feature_mean) / self.feature_std).squeeze(-1)

    def to_original(self, standardized: torch.Tensor) -> torch.Tensor:
        return standardized * self.target_std + self.target_mean

    def predict_rows(self, features) -> torch.Tensor:
        """Predictions in the target's original units, one per row.

        Args:
            features: ``(N, in_features)`` raw feature values (a tensor, array or nested list),
                in the columns and units the data module read.

        Returns:
            ``(N,)`` float32 tensor on the CPU.
        """
        if not self.fitted:
            raise UserError("the regression module has no standardization: train or load it")
        x = torch.as_tensor(features, dtype=torch.float32, device=self.target_std.device)
        if x.ndim != 2 or x.shape[1] != self.in_features:
            raise UserError(
                f"predict: expected rows of {self.in_features} features, got shape {tuple(x.shape)}"
            )
        with evaluating(self):
            return self.to_original(self(x)).float().cpu()

    def _shared_step(self, batch, stage: str) -> torch.Tensor:
        x, y = batch  # (B, F), (B,)
        pred = self(x)
        loss = LOSSES[self.loss_name](pred, (y - self.target_mean) / self.target_std)
        self.log(f"{stage}/loss", loss, on_step=stage == "train", on_epoch=True,
                 prog_bar=stage == "train", batch_size=len(y))  # fmt: skip
        if stage != "train":
            metrics = self.val_metrics if stage == "val" else self.test_metrics
            metrics.update(self.to_original(pred.detach()).double(), y.double())
            self.log_dict(metrics, on_epoch=True, batch_size=len(y))
        return loss

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self.to_original(self(batch[0] if isinstance(batch, list | tuple) else batch))

    def trained_parameters(self):
        return self.layers.parameters()
