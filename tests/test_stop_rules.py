"""Stop rules of a sweep (sweep.max_jobs, sweep.target, sweep.time_budget): each job checks
them as it starts, so they hold for every launcher; the summary says which stopped it."""

from __future__ import annotations

import csv
import json
import time

import pytest
from omegaconf import OmegaConf

from experiments.errors import UserError
from experiments.runs.sweep import parse_budget, parse_target, stop_reason
from tests.helpers import run_inproc


def _rows(sweep) -> dict[str, dict]:
    with open(sweep / "summary.csv") as f:
        return {r["job"]: r for r in csv.DictReader(f)}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rule", "stopped", "why"),
    [
        ("sweep.max_jobs=1", {"1", "2"}, "sweep.max_jobs=1 reached"),
        (
            "sweep.target='val/acc>=0.01'",
            {"1", "2"},
            "sweep.target=val/acc>=0.01 reached by job 0",
        ),
    ],
)
def test_a_rule_stops_the_sweep_and_the_summary_says_which(tmp_path, data_dir, rule, stopped, why):
    sweep = tmp_path / "sweep"
    res = run_inproc(
        "-m", "experiments.train", "-m", "seed=0,1,2", rule, "debug=limit",
        f"paths.data_dir={data_dir}", f"hydra.sweep.dir={sweep}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    rows = _rows(sweep)
    assert {j for j, r in rows.items() if r["status"] == "stopped"} == stopped
    assert {j for j, r in rows.items() if r["status"] == "ok"} == {"0", "1", "2"} - stopped
    for job in stopped:
        assert why in rows[job]["error"]
        assert not (sweep / job / "metrics.json").exists()  # nothing was trained
    summary = (sweep / "summary.md").read_text()
    assert f"{len(stopped)} not run" in summary and f"Stopped early: {why}" in summary


def test_the_time_budget_counts_from_the_sweeps_start(tmp_path):
    cfg = OmegaConf.create({"sweep": {"time_budget": "00:01:00"}})
    (tmp_path / "sweep.json").write_text(json.dumps({"started": time.time() - 30}))
    assert stop_reason(cfg, tmp_path, 5) is None
    (tmp_path / "sweep.json").write_text(json.dumps({"started": time.time() - 61}))
    assert stop_reason(cfg, tmp_path, 5) == "sweep.time_budget=00:01:00 spent"
    assert parse_budget(90) == 90.0 and parse_budget("1:30:00") == 5400.0


def test_a_target_reached_by_a_finished_job_stops_later_ones(tmp_path):
    cfg = OmegaConf.create({"sweep": {"target": "val/loss<0.2"}})
    for num, loss, status in ((0, 0.5, "ok"), (1, 0.1, "failed"), (2, 0.15, "ok")):
        (tmp_path / str(num)).mkdir()
        (tmp_path / str(num) / "job.json").write_text(json.dumps({"num": num, "status": status}))
        (tmp_path / str(num) / "metrics.json").write_text(json.dumps({"val/loss": loss}))
    assert stop_reason(cfg, tmp_path, 3) == "sweep.target=val/loss<0.2 reached by job 2 (0.1500)"
    assert parse_target(" test/acc >= 0.9 ") == ("test/acc", ">=", 0.9)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("sweep.max_jobs=0", "sweep.max_jobs=0 is not valid: expected int >= 1 or null"),
        ("sweep.target='val/acc=0.9'", "sweep.target='val/acc=0.9' is not valid"),
        ("sweep.target='acc>=0.9'", "expected <stage/metric><op><number>"),
        ("sweep.time_budget=soon", "sweep.time_budget='soon' is not valid"),
        ("sweep.target=val/acc>=0.9", "quote a value with < or > for Hydra"),
    ],
)
def test_a_bad_rule_is_one_line_before_any_job(tmp_path, override, message):
    res = run_inproc("-m", "experiments.train", "-m", "seed=0,1", override, cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and message in res.stderr
    assert not (tmp_path / "outputs").exists() or not list((tmp_path / "outputs").rglob("job.json"))


def test_parse_target_refuses_what_it_cannot_read():
    for bad in ("val/acc", "val/acc>=", ">=0.9", "val/acc=>0.9", 0.9, None):
        with pytest.raises(UserError):
            parse_target(bad)


@pytest.mark.slow
def test_the_optuna_sweeper_asks_for_no_trial_after_a_rule_holds(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    res = run_inproc(
        "-m", "experiments.train", "-m", "hparams_search=optuna", "hydra.sweeper.n_trials=6",
        "sweep.max_jobs=2", "debug=limit", f"paths.data_dir={data_dir}",
        f"hydra.sweep.dir={sweep}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    rows = _rows(sweep)  # 2 trials ran, the third found the rule, no fourth was asked for
    assert [rows[j]["status"] for j in sorted(rows)] == ["ok", "ok", "stopped"]
