"""Runs grouped by config, with statistics per group, sorted best first, and the verdict."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.analysis.readings import (
    Configs,
    Run,
    Value,
    find_runs,
    identity,
    read_run,
    select,
    skipped_line,
)
from experiments.analysis.significance import Stats, metric_bounds, summarize
from experiments.analysis.verdict import Verdict, decide
from experiments.errors import UserError
from experiments.runs.layout import HYDRA, METRICS, SAVED_CONFIG

STANDARD_METRICS = (
    "test/acc", "test/balanced_acc", "test/macro_f1", "val/acc", "wall_time_s",
    "time_to_target/from_launch_s",  # target='val/acc>=0.99' (callbacks.TimeToTarget)
)  # fmt: skip
# a metric whose name holds one of these is better lower (when no mode= and no run says)
LOWER_IS_BETTER = ("loss", "error", "mae", "mse", "rmse", "nll", "ece", "time", "perplexity")


@dataclass
class Group:
    name: str
    config: dict[str, Any]
    runs: list[Run]
    stats: dict[str, Stats] = field(default_factory=dict)
    values: dict[str, list[Value]] = field(default_factory=dict)  # per metric, per run

    @property
    def seeds(self) -> list[Any]:
        return [r.seed for r in self.runs]


@dataclass
class Comparison:
    """What ``compare`` found: groups best first, the keys that tell them apart, the
    verdict on whether the first is best, and the skipped runs."""

    metric: str
    mode: str
    metrics: list[str]  # the metric first, then the standard ones every run has
    groups: list[Group]
    keys: list[str]  # dotted config keys whose values differ between groups
    skipped: list[tuple[Path, str]]
    ignore: tuple[str, ...] = ()  # the keys of ignore=, left out of the grouping
    chosen_by: str = ""  # where metric and mode came from, for the report
    verdict: Verdict | None = None  # None with one group: nothing to compare

    @property
    def best(self) -> Group | None:
        """The group that beats every other at 95%; None for a tie or one group."""
        return self.groups[0] if self.verdict and self.verdict.winner is not None else None

    @property
    def tied(self) -> list[str]:
        """The groups the verdict cannot tell apart from the first (with it); [] when there
        is a winner or one group."""
        return list(self.verdict.tied) if self.verdict is not None else []


def compare(
    paths: Sequence[str],
    metric: str | None = None,
    mode: str | None = None,
    ignore: Iterable[str] = (),
) -> Comparison:
    """Find the runs under ``paths``, group them by config and summarize each group.

    Args:
        paths: run folders, folders above runs, glob patterns.
        metric: the metric to rank by; None: the runs' own ``optimized_metric`` (their
            saved config's), at each run's selected epoch.
        mode: ``max`` or ``min``; None: the runs' ``optimized_mode`` for their optimized
            metric, else from the metric's name (accuracy-like: max, a loss: min).
        ignore: more dotted config keys to leave out of the grouping.

    Raises:
        UserError: a bad ``mode``, a path that does not exist, runs that optimize different
            metrics (with no ``metric=``), or no run to compare (the message names the paths
            and the skipped runs with their reasons).
    """
    if mode not in (None, "max", "min"):
        raise UserError(f"mode={mode}: must be max or min")
    if metric is not None and not metric:
        raise UserError(f"metric= is empty: give a key of {METRICS}, e.g. metric=val/acc")
    if not paths:
        raise UserError("give at least one run folder, sweep folder or glob pattern (see --help)")
    ignore = tuple(ignore)
    configs = Configs(ignore)
    read = {path: read_run(path, None, ignore, configs) for path in find_runs(paths)}
    runs = [run for run in read.values() if isinstance(run, Run)]
    skipped = [(path, why) for path, why in read.items() if isinstance(why, str)]
    where = ", ".join(paths)
    if not runs:
        if skipped:
            raise UserError(f"no run to compare under {where}: {skipped_line(skipped)}")
        raise UserError(
            f"no runs found under {where} (a run folder holds {METRICS} and {HYDRA}/{SAVED_CONFIG})"
        )
    metric, mode, chosen_by = _metric_and_mode(runs, metric, mode)
    chosen = [(run, select(run, metric)) for run in runs]
    skipped += [(run.path, why) for run, why in chosen if isinstance(why, str)]
    kept = [run for run, value in chosen if not isinstance(value, str)]
    if not kept:
        raise UserError(f"no run to compare under {where}: {skipped_line(skipped)}")

    by_config: dict[frozenset, Group] = {}
    for run in kept:
        key = frozenset((k, identity(v)) for k, v in run.config.items())
        by_config.setdefault(key, Group("", run.config, [])).runs.append(run)
    metrics = [metric]
    twin = "test/" + metric.split("/", 1)[-1]  # the metric's own test value (val/mae: test/mae)
    for m in (twin, *STANDARD_METRICS):
        if m not in metrics and all(not isinstance(select(r, m), str) for r in kept):
            metrics.append(m)
    groups = ranked(list(by_config.values()), metrics, mode)
    for i, group in enumerate(groups, 1):
        group.name = f"g{i}"
    keys = differing_keys([g.config for g in groups])
    verdict = verdict_on(groups, metric, mode)
    return Comparison(metric, mode, metrics, groups, keys, skipped, ignore, chosen_by, verdict)


def ranked(groups: list[Group], metrics: list[str], mode: str) -> list[Group]:
    """``groups`` given their values and statistics of ``metrics``, sorted by the mean of
    the first, best first (stable: equal means keep their order)."""
    for group in groups:
        for m in metrics:
            group.values[m] = [select(r, m) for r in group.runs]  # type: ignore[misc]
            group.stats[m] = summarize([v.value for v in group.values[m]], metric_bounds(m))
    sign = 1 if mode == "max" else -1
    return sorted(groups, key=lambda g: -sign * g.stats[metrics[0]].mean)


def verdict_on(groups: list[Group], metric: str, mode: str) -> Verdict | None:
    """The verdict on ``groups`` given best first; None for one group: nothing to compare."""
    if len(groups) < 2:
        return None
    values = [[v.value for v in g.values[metric]] for g in groups]
    replicates = [[r.replicate for r in g.runs] for g in groups]
    return decide([g.name for g in groups], values, replicates, mode, metric)


def _metric_and_mode(runs: list[Run], metric: str | None, mode: str | None) -> tuple[str, str, str]:
    """The metric and mode to rank by, and a few words on where they came from."""
    chosen_by = "metric= given"
    if metric is None:
        named = Counter(run.optimized[0] for run in runs if run.optimized[0])
        if not named:
            raise UserError(
                "the runs' saved configs name no optimized_metric: give metric=<a key of "
                f"{METRICS}>, e.g. metric=val/acc"
            )
        if len(named) > 1 or sum(named.values()) < len(runs):
            counts = ", ".join(f"{m}: {n} runs" for m, n in named.items())
            missing = len(runs) - sum(named.values())
            counts += f", none: {missing} runs" if missing else ""
            raise UserError(
                f"the runs optimize different metrics ({counts}): give metric= (and mode=) "
                f"to rank them on one, or compare them separately"
            )
        (metric,) = named
        chosen_by = "the runs' optimized_metric"
    if mode is None:
        mode, why = direction(metric, [r.optimized for r in runs])
        if mode is None:
            raise UserError(
                f"mode= is needed for metric={metric}: mode=max (higher is better) or mode=min"
            )
        return metric, mode, f"{chosen_by}, {why}"
    return metric, mode, chosen_by + ", mode= given"


def direction(metric: str, optimized: Iterable[Sequence]) -> tuple[str | None, str]:
    """``max`` or ``min`` for ``metric``, and why: the ``optimized_mode`` of the runs whose
    ``optimized_metric`` it is, when they agree; else a fraction is higher-better and a name
    holding one of ``LOWER_IS_BETTER`` lower-better; None when nothing says.

    Args:
        optimized: ``(optimized_metric, optimized_mode)`` of each run.
    """
    modes = {mode for m, mode in optimized if m == metric}
    if len(modes) == 1 and modes <= {"max", "min"}:
        return next(iter(modes)), "their optimized_mode"
    if metric_bounds(metric) is not None and not metric.endswith("ece"):
        return "max", "mode max (a fraction: higher is better)"
    if any(word in metric.lower() for word in LOWER_IS_BETTER):
        return "min", "mode min (by its name: lower is better)"
    return None, ""


def differing_keys(configs: list[dict[str, Any]]) -> list[str]:
    """The keys whose values (``identity``) are not the same in all ``configs``, in order."""
    absent = ("absent",)  # unlike any identity()
    keys = dict.fromkeys(k for c in configs for k in c)
    return [k for k in keys if len({identity(c[k]) if k in c else absent for c in configs}) > 1]
