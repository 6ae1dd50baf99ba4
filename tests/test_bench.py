"""`make bench` runs end to end on a tiny setting and writes its report (timings unchecked)."""

from __future__ import annotations

import re
import sys

import pytest

from tests.conftest import REPO, run_cli


@pytest.mark.slow
def test_quick_bench_writes_every_section(tmp_path):
    res = run_cli("-m", "benchmarks.run", "--quick", "--out", str(tmp_path), cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    report = (tmp_path / "results.md").read_text()
    headings = ("1. Step time", "2. Start-up", "3. Data", "4. torch.compile", "5. Time to accuracy")
    for heading in (*headings, "Targets"):
        assert heading in report, heading
    for row in (
        "CNN b64",
        "MLP b64",
        "train to first step",
        "--help",
        "--cfg job",
        "bad override",
        "cache=tensors",
        "in-memory tensors",
        "batch-level path (TensorStore)",
        "compiled step",
        "digits: val/acc ≥ 0.97",
        "| hand loop |",
        "framework / hand loop, time to target",
    ):
        assert row in report, row
    assert "| machine |" in report and "torch" in report
    assert (tmp_path / "results.png").stat().st_size > 1000
    assert not re.search(r"\bnan\b", report.lower()), "a measurement came back NaN"


def test_bench_rejects_an_unknown_section(tmp_path):
    from benchmarks.run import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--only", "step,nope"])
    assert parse_args(["--quick"]).quick and sys.executable


def _val_acc(path) -> list[float]:
    import csv

    with open(path, newline="") as f:
        return [float(r["val/acc"]) for r in csv.DictReader(f) if r.get("val/acc")]


@pytest.mark.slow
def test_time_to_accuracy_hand_loop_trains_the_same_trajectory(tmp_path, data_dir):
    """The baseline of the time-to-accuracy benchmark is the same recipe by hand: same data,
    split, net, initial weights, optimizer and schedule, so its validation accuracy matches
    the framework's epoch by epoch (only the time it takes may differ)."""
    import json

    from benchmarks import time_to_accuracy as tta

    cfg = tta.compose_recipe("digits", data_dir)
    cfg.trainer.max_epochs = 3
    spec = tta.recipe_spec(cfg)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}:{REPO / 'src'}"}
    hand = run_cli(
        *("-m", "benchmarks.tta_handloop", f"--spec={tmp_path / 'spec.json'}"),
        *(f"--out={tmp_path / 'hand'}", "--device=cpu", "--no-checkpoint"),
        cwd=REPO,
        env_extra=env,
    )
    assert hand.returncode == 0, hand.stderr[-2000:]
    framework = run_cli(
        *("-m", "experiments.train", "experiment=digits", "trainer.max_epochs=3", "logger=csv"),
        *(f"paths.data_dir={data_dir}", f"hydra.run.dir={tmp_path / 'fw'}", "test=false"),
        cwd=REPO,
        env_extra=env,
    )
    assert framework.returncode == 0, framework.stderr[-2000:]
    ours, theirs = (
        _val_acc(tmp_path / "fw" / "csv" / "metrics.csv"),
        _val_acc(tmp_path / "hand" / "metrics.csv"),
    )
    assert len(ours) == len(theirs) == 3
    assert ours == pytest.approx(theirs, abs=1e-6)


def test_time_to_accuracy_names_what_the_hand_loop_cannot_reproduce(data_dir):
    from benchmarks import time_to_accuracy as tta

    cfg = tta.compose_recipe("digits", data_dir)
    cfg.data.mixup_alpha = 0.2
    cfg.trainer.precision = "bf16-mixed"
    with pytest.raises(ValueError, match=r"mixup_alpha.*trainer.precision=bf16-mixed"):
        tta.recipe_spec(cfg)


def test_bench_writes_the_committed_tables_only_when_asked(tmp_path):
    from benchmarks.run import parse_args

    assert parse_args(["--quick"]).out == str(REPO / "outputs" / "bench")
    assert parse_args(["--update-docs"]).out == str(REPO / "benchmarks")
    assert parse_args(["--out", str(tmp_path)]).out == str(tmp_path)
    assert "--update-docs" in (REPO / "Makefile").read_text()  # make bench updates them


def test_plain_cnn_help_answers_without_training(tmp_path):
    res = run_cli("-m", "benchmarks.plain_cnn", "--help", cwd=REPO)
    assert res.returncode == 0 and res.stdout.startswith("usage: python -m benchmarks.plain_cnn")
    assert "Traceback" not in res.stderr


def test_make_data_writes_the_png_folder_the_docs_use():
    import re

    rule = re.search(r"^data: .*\n\t(.+)$", (REPO / "Makefile").read_text(), flags=re.M)
    assert rule and "--image-csv fashion_mnist" in rule.group(1)
    assert "data/fashion_mnist_png" in (REPO / "docs" / "models.md").read_text()
