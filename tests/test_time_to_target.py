"""target='val/acc>=0.9': the wall seconds until a run first reaches it, from launch and from
the first step, in metrics.json, the sweep summary and compare (with an interval over seeds)."""

from __future__ import annotations

import csv
import json

from experiments.callbacks.time_to_target import FROM_FIRST_STEP, FROM_LAUNCH, REACHED
from tests.helpers import run_inproc

FAST = ["trainer.max_epochs=3", "data.batch_size=256"]


def test_a_sweep_records_the_time_to_target_and_compare_gives_its_interval(tmp_path):
    sweep = tmp_path / "sweep"
    res = run_inproc(
        "-m", "experiments.train", "-m", "seed=1,2", "target='val/acc>=0.5'", *FAST,
        f"hydra.sweep.dir={sweep}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    for job in ("0", "1"):
        metrics = json.loads((sweep / job / "metrics.json").read_text())
        assert metrics[REACHED] == 1.0
        # from launch includes the start-up the first step does not
        assert 0 < metrics[FROM_FIRST_STEP] < metrics[FROM_LAUNCH]
        assert metrics["time_to_target/epoch"] == 1.0  # 0.5 is past at the first epoch
    with open(sweep / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert all(float(r[FROM_LAUNCH]) > 0 for r in rows)
    res = run_inproc("-m", "experiments.compare", str(sweep), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert FROM_LAUNCH in res.stdout


def test_a_target_never_reached_records_no_time_and_a_bad_one_is_one_line(tmp_path):
    res = run_inproc(
        "-m", "experiments.train", "target='val/acc>=1.5'", *FAST, "hydra.run.dir=run",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics[REACHED] == 0.0 and FROM_LAUNCH not in metrics
    with open(tmp_path / "run" / "metrics.json") as f:
        assert "time_to_target/epoch" not in json.load(f)
    res = run_inproc("-m", "experiments.train", "target=val/acc", cwd=tmp_path)
    assert res.returncode == 2 and "target='val/acc' is not valid" in res.stderr
    assert res.stderr.count("\n") == 1


def test_the_epoch_that_reaches_the_target_is_the_one_recorded(tmp_path):
    # any accuracy meets >=0: the first validation reaches it, in a run of one epoch too
    # (checked where the epoch's own val/acc is in callback_metrics, not the one before)
    res = run_inproc(
        "-m", "experiments.train", "target='val/acc>=0'", "trainer.max_epochs=1",
        "data.batch_size=256", "hydra.run.dir=run", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics[REACHED] == 1.0 and metrics["time_to_target/epoch"] == 1.0
    assert 0 < metrics[FROM_FIRST_STEP] < metrics[FROM_LAUNCH]
