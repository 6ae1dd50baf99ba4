"""``python -m experiments.eval``: test a finished run's checkpoint again, on its own data split."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import lightning  # noqa: F401  (before route_lightning_logs: the import adds a handler)
import torch

from experiments.analysis.calibration import expected_calibration_error, reliability_diagram
from experiments.console import resume_gc, route_lightning_logs
from experiments.errors import UserError
from experiments.evaluation.saved_run import SavedRun
from experiments.models.losses import class_prior
from experiments.models.metrics import run_test, summarize
from experiments.models.tta import tta_views
from experiments.runs.files import read_json_object, write_json
from experiments.runs.layout import RunDir, checkpoint_label
from experiments.training.model_card import evaluations

log = logging.getLogger(__name__)

MAX_KEPT = 20  # checkpoints whose evaluation eval_metrics.json keeps (best, last, a few files)


def evaluate(
    run_dir: str | Path,
    ckpt: str = "best",
    overrides: Sequence[str] = (),
    posthoc_tau: float | None = None,
    tta: str = "none",
) -> dict:
    """Test ``ckpt`` of the run in ``run_dir`` and write ``<run_dir>/eval_metrics.json``.

    Args:
        run_dir, ckpt, overrides: a folder made by ``python -m experiments.train``, its
            checkpoint and ``key=value`` changes to its config, as ``SavedRun`` takes them.
        posthoc_tau: also report ``test/posthoc/<metric>`` on logits minus
            ``posthoc_tau * log(class prior of the train split)`` (post-hoc logit
            adjustment, Menon et al., 2021).
        tta: ``flip`` or ``flip_translate``: also report ``test/tta/<metric>`` on the mean
            softmax over the views (``models.tta.tta_views``).

    Returns:
        The test metrics (``test/acc``, ``test/loss``, ...) as floats.

    Raises:
        UserError: missing run folder or checkpoint, unknown override key, a refused
            ``_target_``, a checkpoint that is not plain weights or does not fit the net.
    """
    run = SavedRun(run_dir, ckpt, overrides)
    if posthoc_tau is not None:
        run.require_classifier("posthoc_tau")
    if tta != "none":
        run.require_classifier("tta")
    route_lightning_logs()
    start = time.perf_counter()
    model, trainer = run.module(), run.trainer()
    resume_gc()
    metrics = run_test(trainer, model, run.datamodule)
    if run.classifier:
        n_test = _calibration(run, metrics, posthoc_tau)
        if tta != "none":
            logits, labels = run.logits("test", tta_views(tta))
            metrics.update(
                _scores("test/tta", logits.argmax(1), labels, run.datamodule.num_classes)
            )
    else:  # a module of your own: its test_step's metrics are the evaluation
        n_test = len(getattr(run.datamodule, "test_set", None) or ())
    name = run.ckpt_name
    summary = {
        **metrics,
        "ckpt": str(run.ckpt.resolve()),
        "ckpt_name": name,
        "ckpt_epoch": run.ckpt_epoch,
        "samples": {"test": n_test},
        "run_dir": str(run.path.resolve()),
        "overrides": list(overrides),
        "wall_time_s": round(time.perf_counter() - start, 3),
    }
    log.info("tested %s on the test split (n=%d)", checkpoint_label(name, run.ckpt_epoch), n_test)
    # the newest evaluation at the top (as before), and every checkpoint's latest one kept
    # under "evaluations", so the card shows the best and last weights apart, each labelled
    earlier = list(evaluations(run.layout).items())[-MAX_KEPT:]
    summary["evaluations"] = {**dict(earlier), name: dict(summary)}
    write_json(run.layout.eval_metrics, summary)
    _compare_with_training(run.layout, run.ckpt, metrics)
    run.finish()
    return metrics


def _calibration(run: SavedRun, metrics: dict, posthoc_tau: float | None) -> int:
    """A classifier's probabilities judged: ``test/ece`` (and after calibration), the
    reliability diagram, post-hoc adjusted metrics; returns the test split's size."""
    logits, labels = run.logits("test")
    probs = {"as trained": logits.softmax(dim=1)}
    metrics["test/ece"] = expected_calibration_error(probs["as trained"], labels)
    temperature = run.temperature
    if temperature is not None:
        calibrated = probs[f"T={temperature:.2f}"] = (logits / temperature).softmax(dim=1)
        metrics["test/ece_calibrated"] = expected_calibration_error(calibrated, labels)
    reliability_diagram(run.layout.reliability_png, {k: (p, labels) for k, p in probs.items()})
    if posthoc_tau is not None:
        k = run.datamodule.num_classes
        prior = torch.tensor(class_prior(run.datamodule.train_targets("posthoc_tau"), k))
        adjusted = logits - posthoc_tau * prior.clamp_min(1e-12).log().float()
        metrics.update(_scores("test/posthoc", adjusted.argmax(dim=1), labels, k))
    return int(labels.numel())


def _scores(prefix: str, predicted, labels, k: int) -> dict[str, float]:
    """Accuracy, balanced accuracy and macro F1 of ``predicted`` as ``<prefix>/<metric>``."""
    pairs = labels.long() * k + predicted.long()
    values = summarize(torch.bincount(pairs, minlength=k * k).view(k, k))
    return {f"{prefix}/{m}": float(values[m]) for m in ("acc", "balanced_acc", "macro_f1")}


def _compare_with_training(layout: RunDir, ckpt_path: Path, metrics: dict[str, float]) -> None:
    # training tested the best weights: the same file on the same split must give the same
    # numbers (a classifier's test/acc; another task's every test/* training recorded)
    if ckpt_path.resolve() != layout.best_weights.resolve():
        return
    try:
        trained = read_json_object(layout.metrics)
    except UserError as err:  # the comparison is a note: the evaluation itself stands
        log.warning("not compared with the run's metrics: %s", err)
        return
    keys = ["test/acc"] if "test/acc" in metrics else sorted(k for k in metrics if k in trained)
    for key in keys:
        value = trained.get(key)
        if key not in metrics or not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if value == metrics[key]:
            log.info("%s matches %s (%.4f)", key, layout.metrics, value)
        else:
            log.warning("%s %.4f differs from %s (%.4f): changed data, overrides or precision?",
                        key, metrics[key], layout.metrics, value)  # fmt: skip


def command(options: dict, overrides: list[str]) -> None:
    """``python -m experiments.eval``'s work, once ``cli`` has parsed its arguments."""
    metrics = evaluate(**options, overrides=overrides)  # its options are evaluate's arguments
    for key in sorted(metrics):
        print(f"{key}={metrics[key]:.4f}")
    print(f"wrote {RunDir(options['run_dir']).eval_metrics}")
