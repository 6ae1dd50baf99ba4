"""Experiment tracking: the CSV logger, Weights & Biases, MLflow, and the sweep summary.

``experiments.tracking.wandb_logger`` and ``experiments.tracking.mlflow_logger`` are also the
``_target_`` that run configs name.
"""

from experiments.tracking.mlflow import mlflow_logger
from experiments.tracking.wandb import finish_loggers, previous_wandb_id, wandb_logger

__all__ = ["finish_loggers", "mlflow_logger", "previous_wandb_id", "wandb_logger"]
