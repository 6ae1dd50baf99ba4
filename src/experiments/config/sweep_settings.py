"""The settings of our Optuna sweeper (``hydra.sweeper``), checked before any trial runs:
by the command-line check for a clear one-line error, and by the sweeper itself."""

from __future__ import annotations

from experiments.errors import UserError

DIRECTIONS = {"max": "maximize", "maximize": "maximize", "min": "minimize", "minimize": "minimize"}
PRUNERS = ("none", "median", "hyperband", "asha")
SAMPLERS = ("tpe", "random")


def check_settings(settings: dict) -> None:
    """Raise UserError naming the ``hydra.sweeper`` key that cannot work."""
    direction = settings.get("direction", "maximize")
    if direction not in DIRECTIONS:
        raise UserError(f"hydra.sweeper.direction={direction!r}: use maximize or minimize")
    objectives = settings.get("objectives") or {}
    if not isinstance(objectives, dict):
        raise UserError(
            f"hydra.sweeper.objectives={objectives!r}: give {{metric: maximize|minimize, ...}}, "
            "e.g. {val/acc:maximize,params:minimize}"
        )
    for metric, way in objectives.items():
        if way not in DIRECTIONS:
            raise UserError(f"hydra.sweeper.objectives.{metric}={way!r}: use maximize or minimize")
    if settings.get("n_trials", 1) < 1 or settings.get("n_jobs", 1) < 1:
        raise UserError("hydra.sweeper.n_trials and n_jobs must be >= 1")
    pruner = settings.get("pruner") or "none"
    if pruner not in PRUNERS:
        raise UserError(f"hydra.sweeper.pruner={pruner!r}: use one of {', '.join(PRUNERS)}")
    if pruner != "none" and len(objectives) > 1:
        raise UserError(
            f"hydra.sweeper.pruner={pruner}: Optuna prunes single-objective studies only; "
            "use pruner=none with several objectives"
        )
    sampler = settings.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        raise UserError(f"hydra.sweeper.sampler={sampler!r}: use one of {', '.join(SAMPLERS)}")
