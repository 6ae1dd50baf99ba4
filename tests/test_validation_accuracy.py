"""ValidationAccuracy: best-so-far, per-class accuracy, confusion matrix and curves on disk."""

from __future__ import annotations

import csv

import pytest

from experiments.runs.layout import RunDir
from experiments.training.pipeline import train


@pytest.mark.slow
def test_default_run_dir_holds_checkpoints_and_plots(make_cfg, tmp_path):
    metrics = train(make_cfg("trainer.max_epochs=3"))
    run = tmp_path / "run"
    for name in (
        RunDir(run).best_weights.relative_to(run),
        RunDir(run).last_weights.relative_to(run),
        "confusion_matrix.png",
        "learning_curves.png",
        "confusion_matrix.csv",
    ):
        assert (run / name).is_file() and (run / name).stat().st_size > 0, name
    assert (run / "confusion_matrix.png").read_bytes()[:4] == b"\x89PNG"

    with open(run / "confusion_matrix.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0][1:] == [str(i) for i in range(10)]
    matrix = [[int(v) for v in row[1:]] for row in rows[1:]]
    assert sum(map(sum, matrix)) == 269  # the whole (stratified) val split of the digits
    last_acc = sum(matrix[i][i] for i in range(10)) / 269

    with open(run / "csv" / "metrics.csv") as f:
        logged = [r for r in csv.DictReader(f) if r.get("val/acc")]
    accs = [float(r["val/acc"]) for r in logged]
    assert len(accs) == 3
    assert float(logged[-1]["val/acc_best"]) == pytest.approx(max(accs), abs=1e-6)
    assert last_acc == pytest.approx(accs[-1], abs=1e-6)
    assert "val/recall/7" in logged[0] and "val/acc_class/7" not in logged[0]  # one key each
    assert metrics["val/acc_best"] == pytest.approx(max(accs), abs=1e-6)
