"""MLflow tracking: real runs into a local SQLite store, read back with MLflow's own client:
params redacted and length-safe, metrics per epoch, the best weights as artifact, one run
per job."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.runs.layout import RunDir
from experiments.secrets import REDACTED
from experiments.tracking.mlflow import MAX_VALUE_LENGTH, flatten_params
from tests.helpers import REPO, run_inproc

CANARY = "CANARY-SECRET-mlflow-5d1e"


@pytest.fixture(autouse=True)
def local_store_only(monkeypatch):
    """A tracking server named in the environment must not receive the test runs."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def _client(log_dir):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{log_dir}/mlflow.db")


def _runs(client, experiment: str) -> list:
    found = client.get_experiment_by_name(experiment)
    assert found is not None, [e.name for e in client.search_experiments()]
    return client.search_runs([found.experiment_id])


def test_params_are_dotted_and_fit_mlflow_limits():
    flat = flatten_params(
        {
            "optimizer": {"lr": 0.1, "betas": [0.9, 0.99]},
            "empty": {},
            "a+b": {"c": None},
            "long": "x" * (MAX_VALUE_LENGTH + 10),
            "k" * 300: 1,
        }
    )
    assert flat["optimizer.lr"] == "0.1" and flat["optimizer.betas"] == "[0.9, 0.99]"
    assert flat["empty"] == "{}" and flat["a_b.c"] == "None"
    assert len(flat["long"]) == MAX_VALUE_LENGTH and flat["long"].endswith("...")
    assert not any(k.startswith("kkk") for k in flat)


@pytest.mark.slow
def test_run_logs_redacted_params_epoch_metrics_and_best_checkpoint(make_cfg, tmp_path):
    from experiments.training.pipeline import train

    cfg = make_cfg(
        "logger=mlflow",
        "debug=limit",
        "tags=[mlflow_test]",
        f"+tracking.api_key={CANARY}",
        "data.num_workers=0",
    )
    train(cfg)
    client = _client(tmp_path / "outputs")
    (run,) = _runs(client, "debug")
    params = run.data.params
    assert params["optimizer.lr"] == str(cfg.optimizer.lr)
    assert params["trainer.max_epochs"] == "2"
    assert params["tracking.api_key"] == REDACTED
    assert not [k for k, v in params.items() if CANARY in v]
    assert run.data.tags["mlflow_test"] == "true"
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "val/acc")
    assert len(history) == 2  # one value per epoch
    assert "test/acc" in run.data.metrics
    files = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")}
    best = RunDir(tmp_path / "run").best_weights
    assert files == {f"checkpoints/{best.name}", "checkpoints/best.json"}
    got = client.download_artifacts(run.info.run_id, f"checkpoints/{best.name}", str(tmp_path))
    assert Path(got).read_bytes() == best.read_bytes()  # the run's own best weights
    # the secret reached neither the store nor the artifacts
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()]
    assert leaks == []


@pytest.mark.slow
def test_failed_job_marks_its_run_failed_without_artifacts(make_cfg, tmp_path):
    from experiments.training.pipeline import train

    cfg = make_cfg(
        "logger=mlflow",
        "debug=limit",
        "data.num_workers=0",
        "data.dataset={_target_:tests.helpers.random_sets,_partial_:true,n:200}",
        "+data.dataset.fail_after=3",
    )
    with pytest.raises(Exception, match="disk error reading sample"):
        train(cfg)
    client = _client(tmp_path / "outputs")
    (run,) = _runs(client, "debug")
    assert run.info.status == "FAILED"
    assert client.list_artifacts(run.info.run_id) == []


@pytest.mark.slow
def test_three_job_sweep_makes_three_finished_runs(tmp_path, data_dir):
    res = run_inproc(
        "-m",
        "experiments.train",
        "-m",
        "optimizer.lr=0.01,0.05,0.1",
        "logger=mlflow",
        "debug=limit",
        "data.num_workers=0",
        f"paths.data_dir={data_dir}",
        cwd=tmp_path,
        env_extra={"PYTHONPATH": str(REPO)},  # MLFLOW_TRACKING_URI is unset (fixture)
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (sweep,) = (tmp_path / "outputs" / "debug" / "multiruns").iterdir()
    runs = _runs(_client(tmp_path / "outputs"), "debug")
    assert len(runs) == 3
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert sorted(r.data.params["optimizer.lr"] for r in runs) == ["0.01", "0.05", "0.1"]
    for run in runs:
        assert f"optimizer.lr={run.data.params['optimizer.lr']}" in run.info.run_name
        assert run.data.tags["sweep"] == sweep.name
    assert not (tmp_path / "mlruns").exists()  # nothing written outside outputs/
