"""k-fold cross-validation as a run type: ``cv.folds=K`` trains K models in one run dir.

Fold k is an ordinary run in ``<run>/fold_<k>/`` whose validation split is the k-th of K
stratified folds of the non-test samples (``data.folds``/``data.fold``); the test split
is the same for every fold. When all folds are done, ``<run>/metrics.json`` holds the
mean of every metric over the folds (so a sweeper optimizes the fold mean), its sample
std as ``<metric>_std`` and each fold's metrics, and ``<run>/cv.md`` shows them as a table.

``resume=<run>`` re-runs only the folds without a ``metrics.json``: one that had started
continues from its own ``last.ckpt``, one that had not starts fresh.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from experiments.analysis.significance import summarize
from experiments.errors import UserError
from experiments.runs.files import read_json, write_json, write_text
from experiments.runs.layout import RunDir
from experiments.runs.manifest import write_manifest
from experiments.tracking.sweep_summary import markdown_table

log = logging.getLogger(__name__)


def cross_validate(cfg: DictConfig, train_one: Callable[[DictConfig], dict]) -> dict:
    """Train every unfinished fold with ``train_one``; write and return the fold means."""
    folds = int(cfg.cv.folds)
    run_dir = Path(cfg.paths.output_dir)
    started = [f for f in RunDir(run_dir).folds() if f.path.is_dir() and any(f.path.iterdir())]
    if started and not cfg.get("resume"):
        raise UserError(
            f"{run_dir} already holds folds of a cross-validation run; continue it with "
            f"resume={run_dir} or choose another hydra.run.dir"
        )
    per_fold = []
    for k in range(folds):
        fold = RunDir(run_dir).fold(k)
        if fold.finished:
            log.info("cv fold %d/%d finished before: kept (%s)", k + 1, folds, fold.metrics)
        else:
            log.info("cv fold %d/%d in %s", k + 1, folds, fold.path)
            train_one(_fold_config(cfg, k, fold))
        # a fold kept from before is a file handed to us: a corrupt one is one line
        per_fold.append(read_json(fold.metrics, kind=dict))
    return write_summary(run_dir, per_fold, str(cfg.optimized_metric))


def _fold_config(cfg: DictConfig, k: int, fold: RunDir) -> DictConfig:
    """``cfg`` for fold ``k``: its own run dir and validation fold; resumed if it started."""
    fold_cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    with open_dict(fold_cfg):
        fold_cfg.paths.output_dir = str(fold.path)
        fold_cfg.data.folds = int(cfg.cv.folds)
        fold_cfg.data.fold = k
        fold_cfg.resume = str(fold.path) if fold.has_checkpoint() else None
    return fold_cfg


def write_summary(run_dir: Path, per_fold: list[dict], metric: str) -> dict:
    """``metrics.json`` (fold means, ``_std``, every fold) and ``cv.md``; returns the means."""
    keys = [k for k in per_fold[0] if k != "seed" and all(_number(f.get(k)) for f in per_fold)]
    stats = {k: summarize([float(f[k]) for f in per_fold]) for k in keys}
    means = {k: s.mean for k, s in stats.items()}
    summary = {
        **means,
        **{f"{k}_std": s.std for k, s in stats.items()},
        "cv_folds": len(per_fold),
        "seed": per_fold[0].get("seed"),
        "run_dir": str(Path(run_dir).resolve()),
        "folds": per_fold,
    }
    write_json(RunDir(run_dir).metrics, summary)
    shown = [k for k in dict.fromkeys((metric, "val/acc", "val/loss", "test/acc", "test/loss"))
             if k in stats]  # fmt: skip
    rows = [[i, *(float(f[k]) for k in shown)] for i, f in enumerate(per_fold)]
    rows.append(["mean ± std", *(f"{stats[k].mean:.4f} ± {stats[k].std or 0:.4f}" for k in shown)])
    table = markdown_table(["fold", *shown], rows)
    text = "\n".join([f"# {len(per_fold)}-fold cross-validation\n", *table]) + "\n"
    write_text(RunDir(run_dir).cv_report, text)
    write_manifest(run_dir)  # last: the folds keep their own manifests
    if metric in stats:
        s = stats[metric]
        log.info("cv: %s = %.4f ± %.4f over %d folds", metric, s.mean, s.std or 0, s.n)
    return means


def _number(value) -> bool:
    """A metric value that averages: a number a float can hold (a fold kept from before is a
    file we were handed; ``1e400`` written as an integer would overflow the mean)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True
