"""``python -m experiments.calibrate``: fit temperature scaling on a finished run's
validation split and save it with the run; ``predict`` and ``eval`` apply it.

Examples:
    python -m experiments.calibrate run_dir=outputs/train/runs/2025-01-01_12-00-00_000000
"""

from __future__ import annotations

import logging
import sys

from experiments.config.saved import parse_args
from experiments.console import run_main
from experiments.errors import UserError
from experiments.model_card import write_model_card
from experiments.saved_run import SavedRun

log = logging.getLogger(__name__)

USAGE = """\
usage: python -m experiments.calibrate run_dir=<run folder> [ckpt=best|last|<file.pt>]
           [key=value ...]

Fits one temperature T on the run's validation split (the T that minimizes the negative
log-likelihood of softmax(logits / T); predictions do not change, their probabilities do)
and writes <run>/calibration.json: T, and the expected calibration error (15 bins) and
NLL before and after, on the validation and test splits. predict then reports calibrated
probabilities, and eval test/ece_calibrated. Other key=value arguments override keys of
the run's config."""


def calibrate(run_dir, ckpt: str = "best", overrides=()) -> dict:
    """Fit, save and return the temperature and the ECE / NLL before and after it.

    Raises:
        UserError: what ``SavedRun`` raises, or a run without a validation split.
    """
    run = SavedRun(run_dir, ckpt, overrides)
    from experiments.analysis.calibration import (
        expected_calibration_error,
        fit_temperature,
        nll,
        reliability_diagram,
    )
    from experiments.runs.files import write_json

    if not run.has_split("val"):
        raise UserError(
            f"{run.path}: the run has no validation split to calibrate on (data.val_fraction=0); "
            f"temperature scaling must be fitted on data the model was not trained on"
        )
    logits, labels = run.logits("val")
    temperature = fit_temperature(logits, labels)
    report: dict = {"temperature": temperature, "ckpt": str(run.ckpt), "bins": 15}
    curves = {}
    for split in ("val", "test"):
        if split == "test" and not run.has_split("test"):
            continue
        if split == "test":
            logits, labels = run.logits("test")
        before, after = logits.softmax(dim=1), (logits / temperature).softmax(dim=1)
        report[f"{split}/ece_before"] = expected_calibration_error(before, labels)
        report[f"{split}/ece_after"] = expected_calibration_error(after, labels)
        report[f"{split}/nll_before"] = nll(logits, labels)
        report[f"{split}/nll_after"] = nll(logits, labels, temperature)
        curves = {"before": (before, labels), f"T={temperature:.2f}": (after, labels)}
    write_json(run.layout.calibration, report)
    reliability_diagram(run.layout.reliability_png, curves)
    write_model_card(run.path)
    return report


def _main(argv: list[str]) -> None:
    options, overrides = parse_args(argv, {"run_dir": None, "ckpt": "best"}, USAGE)
    report = calibrate(options["run_dir"], options["ckpt"], overrides)
    print(f"temperature={report['temperature']:.4f}")
    for split in ("val", "test"):
        if f"{split}/ece_before" in report:
            print(
                f"{split}: ECE {report[f'{split}/ece_before']:.4f} -> "
                f"{report[f'{split}/ece_after']:.4f}, NLL {report[f'{split}/nll_before']:.4f} "
                f"-> {report[f'{split}/nll_after']:.4f}"
            )
    print(f"wrote {options['run_dir']}/calibration.json")


def main() -> None:
    run_main(_main, sys.argv[1:])


if __name__ == "__main__":
    main()
