"""The model card never mixes checkpoints (#33): every number names its checkpoint (the best
or last weights, with the epoch), split and sample count; each command rewrites it whole."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from experiments.runs.layout import RunDir
from tests.helpers import run_inproc, train_cli, write_image_folder


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    """The issue's shape, small: 180 images of 3 classes, an 18-image validation split."""
    root = tmp_path_factory.mktemp("card")
    csv_file, images = write_image_folder(root / "data", n=180, classes=("a", "b", "c"))
    return train_cli(
        root / "run", root, "data=image_csv", f"data.csv_file={csv_file}",
        f"data.image_dir={images}", "logger=none", "trainer.max_epochs=3",
    )  # fmt: skip


def _cli(command, run, *args):
    res = run_inproc("-m", f"experiments.{command}", f"run_dir={run}", *args, cwd=run.parent)
    assert res.returncode == 0, res.stderr[-2000:]
    return res


def _sections(card: str) -> dict[str, str]:
    parts = re.split(r"^## ", card, flags=re.M)[1:]
    return {p.split("\n", 1)[0]: p.split("\n", 1)[1] for p in parts}


def test_eval_ckpt_last_is_labelled_last_beside_the_best_checkpoints_numbers(image_run, tmp_path):
    run = shutil.copytree(image_run, tmp_path / "run")
    best_name, last_name = RunDir(run).best_weights.name, RunDir(run).last_weights.name
    best = json.loads((run / "checkpoints" / "best.json").read_text())
    last = json.loads((run / "checkpoints" / "last.json").read_text())
    trained = json.loads((run / "metrics.json").read_text())
    _cli("eval", run, "ckpt=last")
    _cli("export", run, "format=torchscript")
    sections = _sections((run / "model_card.md").read_text())
    best_title = f"Test results: {best_name} (selected epoch {best['epoch']})"
    last_title = f"Test results: {last_name} (last epoch {last['epoch']})"
    assert best_title in sections and last_title in sections, list(sections)
    # the best weights' numbers are training's test of them, the last ones' are eval's
    assert f"| test/acc | {trained['test/acc']:.4f} |" in sections[best_title]
    assert "from the test at the end of training" in sections[best_title]
    evaluated = json.loads((run / "eval_metrics.json").read_text())
    assert evaluated["ckpt_name"] == last_name  # the newest evaluation stays on top
    assert f"| test/acc | {evaluated['test/acc']:.4f} |" in sections[last_title]
    assert "from experiments.eval" in sections[last_title]
    # export names the checkpoint it exported, so no section is left unlabelled
    assert f"from {best_name} (selected epoch {best['epoch']})" in sections["Export"]
    # an evaluation of the best weights afterwards replaces training's numbers there, last's stay
    _cli("eval", run)
    sections = _sections((run / "model_card.md").read_text())
    assert "from experiments.eval" in sections[best_title] and last_title in sections
    kept = json.loads((run / "eval_metrics.json").read_text())["evaluations"]
    assert sorted(kept) == sorted([best_name, last_name])


def test_every_number_in_the_card_names_its_split_and_sample_count(image_run, tmp_path):
    run = shutil.copytree(image_run, tmp_path / "run")
    best_name, last_name = RunDir(run).best_weights.name, RunDir(run).last_weights.name
    counts = json.loads((run / "data_counts.json").read_text())
    n_val, n_test = sum(counts["val"].values()), sum(counts["test"].values())
    _cli("eval", run, "ckpt=last")
    _cli("calibrate", run)
    _cli("export", run, "format=torchscript")
    sections = _sections((run / "model_card.md").read_text())
    checkpoints = sections["Checkpoints"]
    assert checkpoints.count(f"on the validation split (n={n_val})") == 2
    assert f"- selected: {best_name} (selected epoch " in checkpoints
    assert f"- last epoch: {last_name} (last epoch " in checkpoints
    assert "the last epoch's value, not the selected one" in checkpoints
    best = json.loads((run / "checkpoints" / "best.json").read_text())
    assert f"- why this epoch: {best['reason'][:20]}" in checkpoints
    assert "- warning: the validation split has 18 samples for 3 classes" in checkpoints
    results = [body for title, body in sections.items() if title.startswith("Test results: ")]
    assert len(results) == 2
    for body in results:
        assert f"Test split, n={n_test};" in body and f"(n={n_test})" in body
    calibration = sections["Calibration"]
    assert f"| val (n={n_val}) |" in calibration and f"| test (n={n_test}) |" in calibration
    assert f"- for {best_name} (selected epoch " in calibration
    assert f"on the first batch of the test split (n={n_test})" in sections["Export"]
