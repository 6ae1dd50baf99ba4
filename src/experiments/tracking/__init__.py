"""Experiment tracking: the CSV logger, Weights & Biases, MLflow, and the sweep summary.

``experiments.tracking.wandb_logger`` and ``experiments.tracking.mlflow_logger`` are also the
``_target_`` that run configs name. They load on first use: the sweep summary imports this
package in a sweep's own process, which imports no Lightning and no tracker.
"""

__all__ = ["finish_loggers", "mlflow_logger", "previous_wandb_id", "wandb_logger"]


def __getattr__(name: str):
    if name == "mlflow_logger":
        from experiments.tracking.mlflow import mlflow_logger  # lazy: mlflow takes ~1 s

        return mlflow_logger
    if name in __all__:
        from experiments.tracking import wandb  # lazy: Lightning, for a sweep's own process

        return getattr(wandb, name)
    raise AttributeError(f"module 'experiments.tracking' has no attribute {name!r}")
