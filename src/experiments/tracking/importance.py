"""Why the winner won: parameter importance of a sweep.

Importance is Optuna's (``optuna.importance`` with the evaluator the sweeper names, fANOVA,
recorded beside the values) for an Optuna search, written by the sweeper into
``optimization_results.yaml``; for a grid it is each swept key's spread: the largest minus
the smallest mean of the metric over the jobs that share one of its values. Seeds are
replicates, never hyperparameters: no importance, no axis. The summary's section and its
plots are ``tracking.sweep_plots``; this module imports no plotting library (the run index
reads ``is_replicate``).
"""

from __future__ import annotations

import math
from typing import Any

# what optuna.importance's evaluators compute, for the summary's label
EVALUATORS = {
    "FanovaImportanceEvaluator": (
        "fANOVA (optuna.importance.FanovaImportanceEvaluator): the share of the metric's "
        "variance each parameter explains"
    ),
    "PedAnovaImportanceEvaluator": (
        "PED-ANOVA (optuna.importance.PedAnovaImportanceEvaluator): how differently each "
        "parameter is distributed in the best trials than in all of them"
    ),
    "MeanDecreaseImpurityImportanceEvaluator": (
        "mean decrease impurity (optuna.importance.MeanDecreaseImpurityImportanceEvaluator)"
    ),
}


def is_replicate(key: str) -> bool:
    """``seed`` (any section's, e.g. ``data.split_seed``) replicates a run: not a setting (a
    contour between seed 0 and seed 1 means nothing)."""
    name = key.lstrip("+~").rsplit(".", 1)[-1]
    return name == "seed" or name.endswith("_seed")


def swept(rows: list[dict[str, Any]], metric: str) -> tuple[list[dict], list[str]]:
    """The finished rows as ``{key: value, ..., metric: number}`` and the keys that vary."""
    done = []
    for row in rows:
        value = row.get(metric)
        if not isinstance(value, int | float) or not math.isfinite(value):
            continue
        setting = dict(item.partition("=")[::2] for item in str(row["overrides"]).split())
        done.append({**setting, metric: float(value)})
    keys = sorted({k for r in done for k in r if k != metric and not is_replicate(k)})
    varying = [k for k in keys if len({r.get(k) for r in done}) > 1]
    return done, varying


def spread(done: list[dict], keys: list[str], metric: str) -> dict[str, float]:
    out = {}
    for key in keys:
        by_value: dict[Any, list[float]] = {}
        for row in done:
            by_value.setdefault(row.get(key), []).append(row[metric])
        means = [sum(v) / len(v) for v in by_value.values()]
        out[key] = max(means) - min(means)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def evaluator_label(name: str | None) -> str:
    """What the importance values of an Optuna search are, from the evaluator's class name
    the sweeper recorded (``optimization_results.yaml``: ``importance_evaluator``)."""
    if not name:
        # written before the evaluator was recorded: Optuna's default then depended on its
        # version (fANOVA before 5, PED-ANOVA from 5), so it is not guessed
        return "Optuna's parameter importance (the evaluator was not recorded)"
    return f"Optuna's importance by {EVALUATORS.get(name, name)}"
