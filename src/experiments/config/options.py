"""The top-level keys of ``conf/train.yaml`` that no constructor takes, as dataclasses:
their type hints are the schema ``experiments.config.schema`` checks them against."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from experiments.config.hints import Ge, Gt, Le, Lt


@dataclass(frozen=True)
class RunOptions:
    """Keys at the top of the config (others, such as ``paths``, are not checked here)."""

    task_name: str | int = "train"
    # numpy's range (2**32 - 1): Lightning's seed_everything fails on one outside it
    seed: Annotated[int, Ge(0), Le(4294967295)] | None = 42
    optimized_metric: str | None = "val/acc"
    optimized_mode: Literal["max", "min"] = "max"
    tags: list[str] = field(default_factory=list)
    resume: str | None = None
    test: bool = True
    profile: bool = False
    print_config: bool = False
    compile: bool = False


@dataclass(frozen=True)
class SweepOptions:
    """``sweep.*``: what ``-m`` does with a sweep dir that ran this sweep before."""

    retry_failed: bool = True
    force: bool = False
    max_jobs: Annotated[int, Ge(1)] | None = None
    target: str | None = None  # e.g. "val/acc>=0.99" (runs.sweep.parse_target)
    time_budget: str | float | None = None  # seconds or HH:MM:SS (runs.sweep.parse_budget)


@dataclass(frozen=True)
class Remedies:
    """``remedies.*``: how a run heals itself (``experiments.remedies``)."""

    oom: bool = True
    min_batch_size: Annotated[int, Ge(1)] = 8
    diverged_retries: Annotated[int, Ge(0)] = 0
    lr_scale: Annotated[float, Gt(0), Lt(1)] = 0.1


@dataclass(frozen=True)
class CrossValidation:
    """``cv.*``: k-fold cross-validation (one fold would validate on nothing unseen)."""

    folds: Annotated[int, Ge(2)] | None = None
