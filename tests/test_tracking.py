"""W&B tracking: offline without a key, one run per job, grouped sweeps, finished on failure."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from experiments.secrets import REDACTED, redact
from experiments.tracking.wandb import resolve_mode
from tests.helpers import REPO, no_account_env, run_inproc, wandb_records


def test_mode_is_offline_without_a_key_and_online_with_one(tmp_path, monkeypatch):
    for key in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    assert resolve_mode("auto") == "offline"
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password abc123\n")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert resolve_mode("auto") == "online"
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolve_mode("auto") == "online"
    assert resolve_mode("disabled") == "disabled"


def test_redact_hides_secret_looking_keys():
    cfg = {"logger": {"wandb": {"api_key": "sk-123", "project": "p"}}, "db": [{"password": 1}]}
    out = redact(cfg)
    assert out["logger"]["wandb"] == {"api_key": REDACTED, "project": "p"}
    assert out["db"][0]["password"] == REDACTED and cfg["logger"]["wandb"]["api_key"] == "sk-123"


def _read_wandb_run(run_dir: Path) -> dict:
    """``{"run": RunRecord, "config": {...}, "history": [rows], "exit": code}`` of the one
    offline W&B run under ``run_dir``."""
    files = list(run_dir.rglob("run-*.wandb"))
    assert len(files) == 1, files
    out = {"run": None, "config": {}, "history": [], "exit": None}
    for rec in wandb_records(files[0]):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["run"] = rec.run
        if kind in ("run", "config"):
            update = (rec.run.config if kind == "run" else rec.config).update
            out["config"].update((item.key, json.loads(item.value_json)) for item in update)
        elif kind == "history":
            items = rec.history.item
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
            out["history"].append(row)
        elif kind == "exit":
            out["exit"] = rec.exit.exit_code
    return out


def _runs(sweep):
    return {
        job.name: _read_wandb_run(job / "wandb")
        for job in sorted(sweep.iterdir())
        if (job / "wandb").is_dir()
    }


@pytest.mark.slow
def test_three_job_sweep_makes_three_grouped_offline_runs(tmp_path, data_dir):
    res = run_inproc(
        "-m",
        "experiments.train",
        "-m",
        "optimizer.lr=0.01,0.1,0.3",
        "logger=wandb",
        "debug=limit",
        "tags=[sweep_test]",
        f"paths.data_dir={data_dir}",
        cwd=tmp_path,
        env_extra=no_account_env(tmp_path),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (sweep,) = (tmp_path / "outputs" / "debug" / "multiruns").iterdir()
    assert "logging offline" in (sweep / "0" / "train.log").read_text()  # the job's own log
    runs = _runs(sweep)
    assert sorted(runs) == ["0", "1", "2"]
    groups = {r["run"].run_group for r in runs.values()}
    assert groups == {sweep.name}
    assert len({r["run"].run_id for r in runs.values()}) == 3
    for job, lr in (("0", 0.01), ("1", 0.1), ("2", 0.3)):
        run = runs[job]
        assert f"optimizer.lr={lr}" in run["run"].display_name
        assert run["config"]["optimizer"]["lr"] == lr
        assert list(run["run"].tags) == ["sweep_test"]
        keys = {k for row in run["history"] for k in row}
        assert {"val/acc", "val/acc_best"} <= keys
        assert any(k.startswith("train/loss") for k in keys)
        assert run["exit"] == 0

    with open(sweep / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok"] * 3
    accs = [float(r["val/acc"]) for r in rows]
    assert accs == sorted(accs, reverse=True)
    for row in rows:  # the summary agrees with each job's own metrics.json
        metrics = json.loads((sweep / row["dir"] / "metrics.json").read_text())
        assert float(row["test/acc"]) == pytest.approx(metrics["test/acc"])
    assert "| job | overrides | val/acc" in (sweep / "summary.md").read_text()
    assert (sweep / "summary.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_failed_job_does_not_stop_the_sweep_and_is_reported(tmp_path, data_dir):
    dataset = "data.dataset={_target_:tests.helpers.random_sets,_partial_:true,n:200}"
    res = run_inproc(
        "-m",
        "experiments.train",
        "-m",
        dataset,
        "+data.dataset.fail_after=3,-1",
        "logger=wandb",
        "debug=limit",
        f"paths.data_dir={data_dir}",
        cwd=tmp_path,
        env_extra={**no_account_env(tmp_path), "PYTHONPATH": str(REPO)},
    )
    assert res.returncode != 0  # the sweep says something failed ...
    (sweep,) = (tmp_path / "outputs" / "debug" / "multiruns").iterdir()
    with open(sweep / "summary.csv") as f:
        rows = {r["job"]: r for r in csv.DictReader(f)}
    assert rows["1"]["status"] == "ok" and (sweep / "1" / "metrics.json").is_file()  # ... after
    assert rows["0"]["status"] == "failed"  # the later job still ran
    assert "disk error reading sample" in rows["0"]["error"]
    assert "failed" in (sweep / "summary.md").read_text()
    runs = _runs(sweep)
    assert runs["0"]["exit"] == 1 and runs["1"]["exit"] == 0
    assert runs["0"]["run"].run_id != runs["1"]["run"].run_id
