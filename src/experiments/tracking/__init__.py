"""Experiment tracking: the CSV logger, Weights & Biases, and the sweep summary.

``experiments.tracking.wandb_logger`` is also the ``_target_`` that run configs name.
"""

from experiments.tracking.wandb import finish_loggers, previous_wandb_id, wandb_logger

__all__ = ["finish_loggers", "previous_wandb_id", "wandb_logger"]
