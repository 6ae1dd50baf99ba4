"""``python -m experiments.calibrate``: fit temperature scaling on a finished run's
validation split and save it with the run; ``predict`` and ``eval`` apply it. A split that
cannot support the fit keeps T = 1, and says why."""

from __future__ import annotations

import logging

from experiments.analysis.calibration import (
    BINS,
    MIN_PER_CLASS,
    MIN_SAMPLES,
    T_RANGE,
    choose_temperature,
    expected_calibration_error,
    nll,
    reliability_diagram,
)
from experiments.errors import UserError
from experiments.evaluation.saved_run import SavedRun
from experiments.runs.files import write_json
from experiments.runs.layout import CALIBRATION, RunDir, checkpoint_label

log = logging.getLogger(__name__)


def calibrate(run_dir, ckpt: str = "best", overrides=()) -> dict:
    """Fit (or keep T = 1), save and return the temperature, why, and NLL / ECE before
    and after it on each split.

    Raises:
        UserError: what ``SavedRun`` raises, or a run without a validation split.
    """
    run = SavedRun(run_dir, ckpt, overrides)
    run.require_classifier("calibrate")  # its output is a class per image
    if not run.has_split("val"):
        raise UserError(
            f"{run.path}: the run has no validation split to calibrate on (data.val_fraction=0); "
            f"temperature scaling must be fitted on data the model was not trained on"
        )
    logits, labels = run.logits("val")
    choice = choose_temperature(logits, labels)
    t = choice.temperature
    report: dict = {
        "temperature": t,  # the one predict and eval apply (1.0: kept)
        "applied": choice.applied,
        "fitted_temperature": choice.fitted,
        "reason": choice.reason,
        "range": list(T_RANGE),
        "min_samples": MIN_SAMPLES,
        "min_per_class": MIN_PER_CLASS,
        "cross_fit": choice.cross_fit,
        "ckpt": run.ckpt_name,
        "ckpt_epoch": run.ckpt_epoch,
        "bins": BINS,
    }
    for split in ("val", "test") if run.has_split("test") else ("val",):
        if split == "test":
            logits, labels = run.logits("test")
        before, after = logits.softmax(dim=1), (logits / t).softmax(dim=1)
        report[f"{split}/n"] = int(labels.numel())
        report[f"{split}/acc"] = float((logits.argmax(dim=1) == labels).double().mean())
        report[f"{split}/nll_before"] = nll(logits, labels)
        report[f"{split}/nll_after"] = nll(logits, labels, t)
        report[f"{split}/ece_before"] = expected_calibration_error(before, labels)
        report[f"{split}/ece_after"] = expected_calibration_error(after, labels)
        curves = {f"{split}, T=1": (before, labels)}
        if choice.applied:
            curves[f"{split}, T={t:.2f}"] = (after, labels)
    before, after = report.get("test/nll_before"), report.get("test/nll_after")
    report["warnings"] = []
    if choice.applied and before is not None and after > before:
        # never used to choose T (that would fit it to the test split): reported, so a T
        # that does not carry over from validation to test is not a silent one
        report["warnings"].append(
            f"test NLL rose {before:.4f} -> {after:.4f} with T = {t:.4g}: the validation "
            f"split does not represent the test split well here (a larger data.val_fraction "
            f"helps); delete {CALIBRATION} to go back to T = 1"
        )
    write_json(run.layout.calibration, report)
    reliability_diagram(run.layout.reliability_png, curves)
    run.finish()
    return report


def summary_lines(report: dict) -> list[str]:
    """The console's account of a calibration: the decision and why, then NLL and ECE
    before and after on each split, each line naming the checkpoint, split and count."""
    t = report["temperature"]
    verdict = "fitted" if report.get("applied") else "kept"
    lines = [f"temperature={t:.4f} {verdict}: {report['reason']}"]
    label = checkpoint_label(report.get("ckpt"), report.get("ckpt_epoch"))
    for split in ("val", "test"):
        if f"{split}/nll_before" in report:
            lines.append(
                f"{label}, {split} split (n={report[f'{split}/n']}): NLL "
                f"{report[f'{split}/nll_before']:.4f} -> {report[f'{split}/nll_after']:.4f}, "
                f"ECE {report[f'{split}/ece_before']:.4f} -> {report[f'{split}/ece_after']:.4f}"
            )
    return lines + [f"warning: {w}" for w in report.get("warnings", [])]


def command(options: dict, overrides: list[str]) -> None:
    """``python -m experiments.calibrate``'s work, once ``cli`` has parsed its arguments."""
    report = calibrate(options["run_dir"], options["ckpt"], overrides)
    print("\n".join(summary_lines(report)))
    print(f"wrote {RunDir(options['run_dir']).calibration}")
