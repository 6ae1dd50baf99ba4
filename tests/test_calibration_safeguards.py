"""Temperature scaling that cannot silently hurt (#33): a validation split that cannot
support a fit keeps T = 1 and says why; T stays in its range; predict says what it applies."""

from __future__ import annotations

import json

import pytest
import torch

from experiments.analysis.calibration import T_RANGE, choose_temperature, fit_temperature, nll
from tests.helpers import run_inproc, train_cli, write_image_folder


def _image_run(root, n, classes, *overrides):
    csv_file, images = write_image_folder(root / "data", n=n, classes=classes)
    return train_cli(
        root / "run", root, "data=image_csv", f"data.csv_file={csv_file}",
        f"data.image_dir={images}", "logger=none", *overrides,
    )  # fmt: skip


@pytest.fixture(scope="module")
def saturated_run(tmp_path_factory):
    """Two well-separated classes, 120 validation images: val/acc is 1.0 from epoch 1."""
    root = tmp_path_factory.mktemp("saturated")
    return _image_run(root, 400, ("cat", "dog"), "trainer.max_epochs=2", "data.val_fraction=0.3")


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """60 images of 3 classes, 18 for validation, some of them wrong after 2 epochs."""
    root = tmp_path_factory.mktemp("small")
    return _image_run(
        root, 60, ("a", "b", "c"), "trainer.max_epochs=2", "data.val_fraction=0.3",
        "data.test_fraction=0.3",
    )  # fmt: skip


def _calibrate(run):
    res = run_inproc("-m", "experiments.calibrate", f"run_dir={run}", cwd=run.parent)
    assert res.returncode == 0, res.stderr[-2000:]
    return res, json.loads((run / "calibration.json").read_text())


def test_a_saturated_validation_split_keeps_t_1_and_says_why(saturated_run):
    res, report = _calibrate(saturated_run)
    assert report["val/acc"] == 1.0  # the premise: every validation sample is right
    assert report["temperature"] == 1.0 and report["applied"] is False
    assert "saturated" in report["reason"] and "all 120 samples right" in report["reason"]
    kept = [ln for ln in res.stdout.splitlines() if ln.startswith("temperature=")]
    assert kept == [f"temperature=1.0000 kept: {report['reason']}"]
    assert report["val/nll_after"] == report["val/nll_before"]
    assert report["test/nll_after"] == report["test/nll_before"]
    card = (saturated_run / "model_card.md").read_text()
    assert "- T = 1 kept (not temperature-scaled): validation split saturated" in card
    assert "| val (n=120) |" in card


def test_a_small_validation_split_keeps_t_1_and_says_why(small_run):
    res, report = _calibrate(small_run)
    assert report["val/n"] == 18 and report["val/acc"] < 1.0  # small, not saturated
    assert report["temperature"] == 1.0 and report["fitted_temperature"] is None
    assert "too small to fit T: 18 samples, 6 in its smallest class" in report["reason"]
    assert "use a larger data.val_fraction" in res.stdout


def test_predict_says_in_one_line_that_calibration_kept_t_1(saturated_run, tmp_path):
    _calibrate(saturated_run)
    images = saturated_run.parent / "data" / "images"
    res = run_inproc("-m", "experiments.predict", f"run_dir={saturated_run}", f"input={images}",
                  f"output={tmp_path / 'p.csv'}", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if "calibration.json" in ln]
    assert len(lines) == 1 and "keeps T = 1 (validation split saturated" in lines[0], res.stderr


def test_a_temperature_outside_the_range_is_refused_in_one_line(saturated_run, tmp_path):
    """A calibration.json written before the bound (T = 0.0007 turned every probability into
    1.000) is not applied quietly: predict and eval name the file and the way out."""
    import shutil

    run = shutil.copytree(saturated_run, tmp_path / "run")
    old = {"temperature": 0.0007, "ckpt": "best.safetensors"}
    (run / "calibration.json").write_text(json.dumps(old))
    images = saturated_run.parent / "data" / "images"
    for args in (["experiments.predict", f"input={images}", f"output={tmp_path / 'p.csv'}"],
                 ["experiments.eval"]):  # fmt: skip
        # trust_modified: the edit is ours (the manifest would refuse the run first)
        res = run_inproc("-m", args[0], f"run_dir={run}", *args[1:], "trust_modified=true",
                      cwd=tmp_path)  # fmt: skip
        lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith("[")]
        assert res.returncode == 2, res.stderr[-2000:]
        assert len(lines) == 1 and "temperature 0.0007 is not a number in [0.05, 20]" in lines[0], (
            lines
        )
        assert "experiments-calibrate" in lines[0]


def test_the_fit_stays_in_range_where_the_nll_has_no_minimum():
    """All right: NLL falls towards 0 as T -> 0, and an unbounded fit follows it there."""
    labels = torch.arange(200) % 4
    logits = torch.nn.functional.one_hot(labels, 4).double() * 3  # every sample right
    assert fit_temperature(logits, labels) == pytest.approx(T_RANGE[0])
    assert choose_temperature(logits, labels).temperature == 1.0


def test_a_cross_fit_that_raises_held_out_nll_keeps_t_1():
    """One half of the split is all right with big margins, the other holds confident
    mistakes: T fitted on the first half sharpens those mistakes."""
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(400) % 2
    logits = torch.nn.functional.one_hot(labels, 2).double() * 6
    logits += 0.3 * torch.randn(400, 2, generator=gen, dtype=torch.float64)
    order = torch.argsort(labels, stable=True)
    wrong = order[1::2][:12]  # in the second half of the stratified split
    logits[wrong] = logits[wrong].flip(1)
    choice = choose_temperature(logits, labels)
    assert choice.temperature == 1.0 and choice.fitted is not None
    assert "cross-fitted check on validation shows NLL rising" in choice.reason
    rising = [c for c in choice.cross_fit if c["nll_after"] > c["nll_before"]]
    assert rising and nll(logits, labels) == pytest.approx(nll(logits, labels, 1.0))


def test_a_well_posed_split_fits_t_in_range_and_lowers_nll():
    gen = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 3, (600,), generator=gen)
    logits = torch.randn(600, 3, generator=gen, dtype=torch.float64)
    logits[torch.arange(600), labels] += 1.5
    logits *= 4  # overconfident: the NLL-minimizing T is well above 1
    choice = choose_temperature(logits, labels)
    assert choice.applied and T_RANGE[0] < choice.temperature < T_RANGE[1]
    assert choice.temperature > 1.5
    assert nll(logits, labels, choice.temperature) < nll(logits, labels)
    assert all(c["nll_after"] < c["nll_before"] for c in choice.cross_fit)
