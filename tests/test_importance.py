"""Why the winner won: parameter importance and the plots of a sweep's summary."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from experiments.tracking.importance import spread, swept
from experiments.tracking.sweep_summary import write_summary


def _job(sweep, num, overrides, value, status="ok"):
    job = sweep / str(num)
    job.mkdir(parents=True)
    (job / "job.json").write_text(json.dumps(
        {"num": num, "overrides": overrides, "status": status, "value": value}))  # fmt: skip
    (job / "metrics.json").write_text(json.dumps({"val/acc": value}))


def test_a_grids_importance_is_each_keys_spread_and_both_plots_are_drawn(tmp_path):
    grid = [("0.01", "32", 0.50), ("0.01", "64", 0.60), ("0.1", "32", 0.80), ("0.1", "64", 0.90)]
    for num, (lr, width, acc) in enumerate(grid):
        _job(tmp_path, num, [f"optimizer.lr={lr}", f"model.width={width}"], acc)
    _job(tmp_path, 4, ["optimizer.lr=1.0", "model.width=32"], None, status="failed")
    rows = write_summary(tmp_path, "val/acc", "max")
    done, keys = swept(rows, "val/acc")
    assert len(done) == 4 and keys == ["model.width", "optimizer.lr"]  # the failed job left out
    assert spread(done, keys, "val/acc") == pytest.approx({"optimizer.lr": 0.3, "model.width": 0.1})
    summary = (tmp_path / "summary.md").read_text()
    assert "## Parameter importance" in summary and "spread: the best minus the worst" in summary
    assert "| optimizer.lr | 0.3000 |" in summary and "| model.width | 0.1000 |" in summary
    for png in ("parallel.png", "contour.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_an_optuna_search_shows_fanova_importance(tmp_path):
    optuna = pytest.importorskip("optuna")
    from hydra_plugins.experiments_optuna.sweeper import _importance

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(0))
    for num in range(12):
        trial = study.ask()
        lr, wd = trial.suggest_float("lr", 1e-3, 1.0, log=True), trial.suggest_float("wd", 0, 1)
        value = lr + 0.01 * wd  # lr decides
        study.tell(trial, value)
        _job(tmp_path, num, [f"optimizer.lr={lr}", f"optimizer.weight_decay={wd}"], value)
    importance = _importance(study)
    assert set(importance) == {"lr", "wd"} and importance["lr"] > importance["wd"]
    results = {"importance": importance, "importance_evaluator": "FanovaImportanceEvaluator"}
    (tmp_path / "optimization_results.yaml").write_text(yaml.safe_dump(results))
    write_summary(tmp_path, "val/acc", "max")
    summary = (tmp_path / "summary.md").read_text()
    assert "importance by fANOVA (optuna.importance.FanovaImportanceEvaluator)" in summary
    assert f"| lr | {importance['lr']:.4f} |" in summary
    assert _importance(optuna.create_study()) == {}  # no finished trial: none, not an error
    # a file written before the evaluator was recorded: not labelled with a guess
    (tmp_path / "optimization_results.yaml").write_text(yaml.safe_dump({"importance": importance}))
    write_summary(tmp_path, "val/acc", "max")
    assert "the evaluator was not recorded" in (tmp_path / "summary.md").read_text()


def test_seeds_are_replicates_not_hyperparameters(tmp_path):
    # lr decides; the seed only replicates: it gets no importance and no axis in the plots
    grid = [("0.01", 0, 0.50), ("0.01", 1, 0.52), ("0.1", 0, 0.80), ("0.1", 1, 0.90)]
    for num, (lr, seed, acc) in enumerate(grid):
        _job(tmp_path, num, [f"optimizer.lr={lr}", f"seed={seed}"], acc)
    rows = write_summary(tmp_path, "val/acc", "max")
    done, keys = swept(rows, "val/acc")
    assert keys == ["optimizer.lr"]
    summary = (tmp_path / "summary.md").read_text()
    assert "| optimizer.lr |" in summary and "| seed |" not in summary
    assert not (tmp_path / "contour.png").exists()  # one real key: nothing to contour


def test_plots_follow_the_sweeps_final_state_and_stale_ones_are_removed(tmp_path):
    # two keys vary: parallel and contour plots, no one-key plot
    grid = [("0.01", "32", 0.50), ("0.01", "64", 0.60), ("0.1", "32", 0.80), ("0.1", "64", 0.90)]
    for num, (lr, width, acc) in enumerate(grid):
        _job(tmp_path, num, [f"optimizer.lr={lr}", f"model.width={width}"], acc)
    write_summary(tmp_path, "val/acc", "max")
    assert (tmp_path / "contour.png").is_file() and not (tmp_path / "summary.png").exists()
    # on resume the width=64 jobs ran again and failed: only lr varies among finished jobs
    for num in (1, 3):
        shutil.rmtree(tmp_path / str(num))
        _job(tmp_path, num, ["optimizer.lr=1.0", "model.width=64"], None, status="failed")
    write_summary(tmp_path, "val/acc", "max")
    assert not (tmp_path / "contour.png").exists()  # drawn for a state that is gone
    assert (tmp_path / "summary.png").is_file() and (tmp_path / "parallel.png").is_file()
    assert "from the 2 finished jobs" in (tmp_path / "summary.md").read_text()


def test_the_one_key_plot_averages_seeds_and_is_redrawn_when_a_job_ends(tmp_path):
    # lr x seed, jobs in Hydra's order: after two jobs only the seed varied
    jobs = [("0.01", 0, 0.50), ("0.01", 1, 0.52), ("0.1", 0, 0.80), ("0.1", 1, 0.90)]
    for num, (lr, seed, acc) in enumerate(jobs[:2]):
        _job(tmp_path, num, [f"optimizer.lr={lr}", f"seed={seed}"], acc)
    write_summary(tmp_path, "val/acc", "max")
    assert not (tmp_path / "summary.png").exists()  # the seed is no parameter to plot by
    for num, (lr, seed, acc) in enumerate(jobs[2:], start=2):
        _job(tmp_path, num, [f"optimizer.lr={lr}", f"seed={seed}"], acc)
        write_summary(tmp_path, "val/acc", "max")
    fresh = tmp_path / "fresh"
    for num, (lr, seed, acc) in enumerate(jobs):
        _job(fresh, num, [f"optimizer.lr={lr}", f"seed={seed}"], acc)
    write_summary(fresh, "val/acc", "max")  # all four at once: the final state
    assert (tmp_path / "summary.png").read_bytes() == (fresh / "summary.png").read_bytes()
