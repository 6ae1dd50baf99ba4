"""Multirun sweeps beyond the basic grid: Optuna (resumable), joblib and submitit launchers."""

from __future__ import annotations

import csv

import pytest
import yaml

from tests.conftest import run_cli


def _sweep(tmp_path, task="debug"):
    (sweep,) = (tmp_path / "outputs" / task / "multiruns").iterdir()
    with open(sweep / "summary.csv") as f:
        return sweep, list(csv.DictReader(f))


@pytest.mark.slow
def test_optuna_search_runs_trials_and_resumes(tmp_path, data_dir):
    args = [
        "-m",
        "experiments.train",
        "-m",
        "hparams_search=optuna",
        "debug=limit",
        f"paths.data_dir={data_dir}",
        "hydra.sweeper.n_trials=3",
    ]
    res = run_cli(*args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    sweep, rows = _sweep(tmp_path)
    assert len(rows) == 3 and all(r["status"] == "ok" for r in rows)
    lrs = {r["overrides"].split("optimizer.lr=")[1].split()[0] for r in rows}
    assert len(lrs) == 3  # three different trials, not one repeated
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    best = max(float(r["val/acc"]) for r in rows)
    assert result["best_value"] == pytest.approx(best) and result["n_trials"] == 3
    assert (sweep / "optuna.db").is_file()

    # the same command pointed at the same sweep dir continues the study to 4 trials
    res = run_cli(*args[:-1], "hydra.sweeper.n_trials=4", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming study" in res.stdout + res.stderr
    _, rows = _sweep(tmp_path)
    assert sorted(int(r["job"]) for r in rows) == [0, 1, 2, 3]
    assert yaml.safe_load((sweep / "optimization_results.yaml").read_text())["n_trials"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_parallel_and_slurm_style_launchers(tmp_path, data_dir, launcher):
    extra = ["hydra.launcher.n_jobs=2"] if launcher == "joblib" else []
    res = run_cli(
        "-m",
        "experiments.train",
        "-m",
        f"hydra/launcher={launcher}",
        *extra,
        "optimizer.lr=0.01,0.1",
        "debug=fast",
        f"paths.data_dir={data_dir}",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    sweep, rows = _sweep(tmp_path)
    assert sorted(r["job"] for r in rows) == ["0", "1"]
    assert all(r["status"] == "ok" for r in rows)
    for job in ("0", "1"):
        assert (sweep / job / "metrics.json").is_file()
