"""`make bench` runs end to end on a tiny setting and writes its report (timings unchecked);
its baselines train what the framework trains."""

from __future__ import annotations

import csv
import re
import shlex

import pytest

from tests.helpers import REPO, run_cli


@pytest.mark.slow
def test_quick_bench_writes_every_section(tmp_path):
    res = run_cli("-m", "benchmarks.run", "--quick", "--out", str(tmp_path), cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    report = (tmp_path / "results.md").read_text()
    headings = ("1. Step time", "2. Start-up", "3. Data", "4. Time to accuracy", "Targets")
    rows = ("CNN b64", "MLP b64", "CNN b64, compile=true", "train to first step", "--help")
    rows += ("--cfg job", "bad override", "unknown option", "cache=tensors", "in-memory tensors")
    rows += ("batch-level path (TensorStore)", "digits: val/acc ≥ 0.97", "| hand loop |")
    for text in (
        *headings,
        *rows,
        "framework / hand loop, time to target",
        "| python, torch, lightning |",
    ):
        assert text in report, text
    assert not re.search(r"\bnan\b|n/a", report.lower()), "a measurement is missing"


def test_bench_rejects_an_unknown_section():
    from benchmarks.run import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--only", "step,nope"])
    args = parse_args(["--only", "step", "compile=true"])
    assert args.only == ["step"] and args.overrides == ["compile=true"]


def test_bench_writes_the_committed_tables_only_when_asked(tmp_path):
    from benchmarks.run import parse_args

    assert parse_args(["--quick"]).out == str(REPO / "outputs" / "bench")
    assert parse_args(["--update-docs"]).out == str(REPO / "benchmarks")
    assert parse_args(["--out", str(tmp_path)]).out == str(tmp_path)
    assert "benchmarks.run --update-docs" in (REPO / "Makefile").read_text()


def test_gpu_script_calls_the_harness_with_arguments_it_takes():
    """benchmarks/gpu.sh runs only on a GPU machine; what it asks of the harness is checked
    here, so a change to the harness cannot leave it calling what is gone."""
    from benchmarks.run import parse_args, step_cases

    script = (REPO / "benchmarks" / "gpu.sh").read_text()
    calls = re.findall(r"-m benchmarks\.run (.+?)(?:\s*\|\||\s*$)", script, flags=re.M)
    assert calls
    values = {"OUT": "out", "precision": "bf16-mixed", "compile": "true"}
    for call in calls:
        call = re.sub(r"\$(\w+)", lambda m: values[m.group(1)], call)
        args = parse_args(shlex.split(call))
        assert args.gpu and set(args.only) <= {"step"}
        cases = step_cases(args)
        assert "ResNet-18 b128" in cases
        assert all({"trainer.accelerator=gpu", "compile=true"} <= set(o) for o in cases.values())


def _val_acc(path) -> list[float]:
    with open(path, newline="") as f:
        return [float(r["val/acc"]) for r in csv.DictReader(f) if r.get("val/acc")]


@pytest.mark.slow
def test_time_to_accuracy_hand_loop_trains_the_same_trajectory(tmp_path, make_cfg):
    """The time-to-accuracy baseline is the same recipe by hand: same data, split, net,
    initial weights, optimizer and schedule, so its validation accuracy matches the
    framework's epoch by epoch (only the time it takes may differ)."""
    from benchmarks.tta_handloop import recipe_spec, run

    from experiments.training.pipeline import train

    cfg = make_cfg("experiment=digits", "trainer.max_epochs=3", "logger=csv", "test=false")
    run(recipe_spec(cfg), tmp_path / "hand")
    train(cfg)
    ours = _val_acc(tmp_path / "run" / "csv" / "metrics.csv")
    assert len(ours) == 3
    assert ours == pytest.approx(_val_acc(tmp_path / "hand" / "metrics.csv"), abs=1e-6)


def test_time_to_accuracy_names_what_the_hand_loop_cannot_reproduce(make_cfg):
    from benchmarks.tta_handloop import recipe_spec

    cfg = make_cfg("experiment=digits", "data.mixup_alpha=0.2", "trainer.precision=bf16-mixed")
    with pytest.raises(ValueError, match=r"MixUp.*trainer.precision=bf16-mixed"):
        recipe_spec(cfg)
    assert recipe_spec(make_cfg("experiment=digits"))["scheduler"]["warmup_epochs"] == 1.0


def test_make_data_writes_the_png_folder_the_docs_use():
    rule = re.search(r"^data: .*\n\t(.+)$", (REPO / "Makefile").read_text(), flags=re.M)
    assert rule and "--image-csv fashion_mnist" in rule.group(1)
    assert "data/fashion_mnist_png" in (REPO / "docs" / "models.md").read_text()
