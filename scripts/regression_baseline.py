"""Our regression recipe against scikit-learn on the same splits, as a markdown table.

For each seed s the split is ``data.split_seed=s`` (TabularData's own split, so every model
sees the same rows): RidgeCV and HistGradientBoostingRegressor are fitted on its train rows,
and ``python -m experiments.train experiment=diabetes seed=s data.split_seed=s`` trains ours
(it picks its epoch on val/mae). All three are scored by MAE on the test rows.

Example (about a minute on a CPU; docs/tasks.md shows its output):

    python scripts/regression_baseline.py --seeds 0 1 2
    python scripts/regression_baseline.py model.hidden_sizes=[] model.dropout=0  # a variant
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.linear_model import RidgeCV
from sklearn.metrics import mean_absolute_error

from experiments.data.tabular import TabularData, diabetes
from experiments.runs.files import read_json_object
from experiments.runs.layout import RunDir

# the regularization strengths RidgeCV chooses from (leave-one-out on the train rows)
ALPHAS = np.logspace(-3, 3, 13)
WITHIN = 0.05  # the bar: ours within 5% of the better baseline's mean test MAE


def baselines(seed: int) -> dict[str, float]:
    """Test MAE of both scikit-learn baselines fitted on the train rows of split ``seed``."""
    dm = TabularData(split_seed=seed)
    dm.setup()
    x, y, _ = diabetes()
    train, test = dm.splits["train"], dm.splits["test"]
    ridge = RidgeCV(alphas=ALPHAS).fit(x[train], y[train])
    boosted = HistGradientBoostingRegressor(random_state=seed).fit(x[train], y[train])
    return {
        "ridge": mean_absolute_error(y[test], ridge.predict(x[test])),
        "hgb": mean_absolute_error(y[test], boosted.predict(x[test])),
        "sizes": f"{len(train)}/{len(dm.splits['val'])}/{len(test)}",
    }


def ours(seed: int, out: Path, overrides: list[str]) -> dict[str, float]:
    """``val/mae`` (the chosen epoch's), ``test/mae`` and ``test/r2`` of our CLI's run."""
    run = out / f"seed_{seed}"
    cmd = [sys.executable, "-m", "experiments.train", "experiment=diabetes", f"seed={seed}",
           f"data.split_seed={seed}", f"hydra.run.dir={run}", *overrides]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    metrics = read_json_object(RunDir(run).metrics)
    return {k: float(metrics[m]) for k, m in
            (("val", "val/mae_best"), ("test", "test/mae"), ("r2", "test/r2"))}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=None, help="run folders (default: a temp)")
    parser.add_argument("overrides", nargs="*", help="config overrides for our runs")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="regression_baseline_"))
    rows = []
    for seed in args.seeds:
        row = {"seed": seed, **baselines(seed), **ours(seed, out, args.overrides)}
        rows.append(row)
        print(f"seed {seed}: {row}", file=sys.stderr)
    mean = {k: float(np.mean([r[k] for r in rows])) for k in ("ridge", "hgb", "test", "val", "r2")}
    better = "ridge" if mean["ridge"] <= mean["hgb"] else "hgb"
    ratio = mean["test"] / mean[better]
    print(
        "| seed | train/val/test rows | RidgeCV | HistGradientBoosting | ours | ours val/mae "
        "| ours test R² |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['seed']} | {r['sizes']} | {r['ridge']:.2f} | {r['hgb']:.2f} | "
              f"{r['test']:.2f} | {r['val']:.2f} | {r['r2']:.3f} |")  # fmt: skip
    print(
        f"| mean | | {mean['ridge']:.2f} | {mean['hgb']:.2f} | {mean['test']:.2f} | "
        f"{mean['val']:.2f} | {mean['r2']:.3f} |"
    )
    name = {"ridge": "RidgeCV", "hgb": "HistGradientBoosting"}[better]
    verdict = "within" if ratio <= 1 + WITHIN else "NOT within"
    print(f"\nTest MAE (lower is better). Ours / {name} (the better baseline) = {ratio:.3f}: "
          f"{verdict} {WITHIN:.0%}. Overrides: {' '.join(args.overrides) or 'none'}")  # fmt: skip


if __name__ == "__main__":
    main()
