"""Runs grouped by config, with statistics per group, sorted best first."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.analysis.runs import Run, find_runs, identity, is_number, read_run, skipped_line
from experiments.analysis.stats import Stats, summarize
from experiments.analysis.verdict import Verdict, verdict
from experiments.errors import UserError
from experiments.tracking.sweep_summary import best_first

STANDARD_METRICS = ("test/acc", "val/acc", "test/macro_f1", "test/balanced_acc", "wall_time_s")


@dataclass
class Group:
    name: str
    config: dict[str, Any]
    runs: list[Run]
    stats: dict[str, Stats] = field(default_factory=dict)

    @property
    def seeds(self) -> list[Any]:
        return [r.seed for r in self.runs]


@dataclass
class Comparison:
    """What ``compare`` found: groups best first, the keys that tell them apart, and skips."""

    metric: str
    mode: str
    metrics: list[str]  # the metric first, then the standard ones every run has
    groups: list[Group]
    keys: list[str]  # dotted config keys whose values differ between groups
    skipped: list[tuple[Path, str]]
    ignore: tuple[str, ...] = ()  # the keys of ignore=, left out of the grouping

    @property
    def best(self) -> Group:
        return self.groups[0]

    def seed_verdict(self) -> Verdict | None:
        """Whether the best group beats the runner-up at 95% given the seeds run."""
        if len(self.groups) < 2:
            return None
        a, b = self.groups[0], self.groups[1]
        return verdict(a.name, b.name, a.stats[self.metric], b.stats[self.metric],
                       self.metric, self.mode)  # fmt: skip


def compare(
    paths: Sequence[str], metric: str = "test/acc", mode: str = "max", ignore: Iterable[str] = ()
) -> Comparison:
    """Find the runs under ``paths``, group them by config and summarize each group.

    Raises:
        UserError: a bad ``mode``, a path that does not exist, or no run to compare
            (the message names the paths and the skipped runs with their reasons).
    """
    if mode not in ("max", "min"):
        raise UserError(f"mode={mode}: must be max or min")
    if not metric:
        raise UserError("metric= is empty: give a key of metrics.json, e.g. metric=val/acc")
    if not paths:
        raise UserError("give at least one run folder, sweep folder or glob pattern (see --help)")
    ignore = tuple(ignore)
    runs: list[Run] = []
    skipped: list[tuple[Path, str]] = []
    cache: dict[bytes, dict[str, Any]] = {}
    for path in find_runs(paths):
        result = read_run(path, metric, ignore, cache)
        if isinstance(result, Run):
            runs.append(result)
        else:
            skipped.append((path, result))
    if not runs:
        where = ", ".join(paths)
        if skipped:
            raise UserError(f"no run to compare under {where}: {skipped_line(skipped)}")
        raise UserError(
            f"no runs found under {where} (a run folder holds metrics.json and .hydra/config.yaml)"
        )

    by_config: dict[frozenset, Group] = {}
    for run in runs:
        key = frozenset((k, identity(v)) for k, v in run.config.items())
        group = by_config.get(key)
        if group is None:
            by_config[key] = group = Group("", run.config, [])
        group.runs.append(run)
    groups = list(by_config.values())

    metrics = [metric] + [
        m
        for m in STANDARD_METRICS
        if m != metric and all(is_number(r.metrics.get(m)) for r in runs)
    ]
    for group in groups:
        group.stats = {m: summarize([float(r.metrics[m]) for r in group.runs]) for m in metrics}
    groups.sort(key=lambda g: best_first(metric, mode)({metric: g.stats[metric].mean}))
    for i, group in enumerate(groups, 1):
        group.name = f"g{i}"
    keys = _differing_keys(groups)
    return Comparison(metric, mode, metrics, groups, keys, skipped, ignore)


def _differing_keys(groups: list[Group]) -> list[str]:
    absent = ("absent",)  # unlike any identity()
    keys = dict.fromkeys(k for g in groups for k in g.config)  # in config order
    return [
        k
        for k in keys
        if len({identity(g.config[k]) if k in g.config else absent for g in groups}) > 1
    ]
