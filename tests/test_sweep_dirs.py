"""A sweep dir belongs to one sweep: a different sweep is refused and leaves the first's
files as they were; the same sweep run again resumes it (trust round 3)."""

from __future__ import annotations

import csv
import hashlib
import json

import pytest

from experiments.errors import UserError
from tests.helpers import run_cli, run_inproc


def _snapshot(folder) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _rows(sweep) -> dict[str, dict]:
    with open(sweep / "summary.csv") as f:
        return {r["job"]: r for r in csv.DictReader(f)}


GRID = ["-m", "experiments.train", "-m", "debug=limit", "logger=none", "test=false"]


@pytest.mark.slow
def test_a_stopped_sweep_resumes_with_the_same_command_and_refuses_another(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    command = [
        *GRID,
        "optimizer.lr=0.05,0.1,0.2",
        f"paths.data_dir={data_dir}",
        f"hydra.sweep.dir={sweep}",
        # Ctrl-C (SIGINT) in the last job, at step 3, the first time only
        "+callbacks.stop._target_=tests.helpers.SignalAt",
        "+callbacks.stop.step=3",
        "+callbacks.stop.signum=2",
        "+callbacks.stop.job=2",
        f"+callbacks.stop.marker={tmp_path / 'stopped'}",
    ]
    res = run_cli(*command, cwd=tmp_path)  # a process: Ctrl-C ends it
    assert res.returncode == 130, res.stderr[-3000:]
    rows = _rows(sweep)  # the summary was written for what ran
    assert {k: r["status"] for k, r in rows.items()} == {"0": "ok", "1": "ok", "2": "interrupted"}
    assert (sweep / "2" / "checkpoints" / "last.ckpt").is_file()
    assert json.loads((sweep / "sweep.json").read_text())["space"] == ["optimizer.lr=0.05,0.1,0.2"]
    before = _snapshot(sweep)

    # a different sweep into the same dir: refused in one line; nothing of the first changes
    other = [o if not o.startswith("optimizer.lr=") else "optimizer.lr=0.3,0.4" for o in command]
    other = [o if o != "debug=limit" else "model=cnn" for o in other] + ["debug=limit"]
    res = run_inproc(*other, cwd=tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
    assert f"hydra.sweep.dir={sweep} holds another sweep" in lines[0]
    # the same sweep with another search space: refused too (a grid cannot re-point jobs)
    res = run_inproc(*[o.replace("0.05,0.1,0.2", "0.05,0.1") for o in command], cwd=tmp_path)
    assert res.returncode == 2 and "the search space changed" in res.stderr, res.stderr[-2000:]
    assert _snapshot(sweep) == before

    # the same command: jobs 0 and 1 are kept, only job 2 trains, from its checkpoint
    kept = {k: (sweep / k / "metrics.json").read_bytes() for k in ("0", "1")}
    res = run_inproc(*command, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout + res.stderr
    assert "resuming the sweep in" in out
    assert out.count("finished in an earlier run of this sweep: kept") == 2
    assert "job 2 continues from its checkpoint" in out
    assert {k: (sweep / k / "metrics.json").read_bytes() for k in ("0", "1")} == kept
    assert "resuming" in (sweep / "2" / "train.log").read_text()
    rows = _rows(sweep)
    assert sorted(rows) == ["0", "1", "2"] and all(r["status"] == "ok" for r in rows.values())
    assert json.loads((sweep / "2" / "metrics.json").read_text())["epochs"] >= 1


@pytest.mark.slow
def test_failed_jobs_are_retried_unless_told_not_to(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    bad = "data.dataset={_target_:tests.helpers.random_sets,_partial_:true,fail_after:30}"
    command = [
        *GRID, "optimizer.lr=0.05,0.1", f"paths.data_dir={data_dir}", f"hydra.sweep.dir={sweep}",
    ]  # fmt: skip
    res = run_inproc(*command, bad, cwd=tmp_path)
    assert res.returncode != 0
    assert {k: r["status"] for k, r in _rows(sweep).items()} == {"0": "failed", "1": "failed"}
    res = run_inproc(*command, bad, "sweep.retry_failed=false", cwd=tmp_path)
    assert "failed in an earlier run of this sweep" in res.stdout + res.stderr
    assert "disk error" in _rows(sweep)["0"]["error"]  # the first failure's record stays


def test_the_summary_ranks_jobs_by_their_best_epoch(tmp_path):
    from experiments.tracking.sweep_summary import write_summary

    # job 0 peaked at 0.90 and ended at 0.50; job 1 ended at its best, 0.80
    for job, (last, best) in enumerate([(0.50, 0.90), (0.80, 0.80)]):
        folder = tmp_path / str(job)
        (folder / "checkpoints").mkdir(parents=True)
        (folder / "job.json").write_text(json.dumps(
            {"num": job, "overrides": [f"optimizer.lr={job}"], "status": "ok", "value": last}
        ))  # fmt: skip
        (folder / "metrics.json").write_text(json.dumps({"val/acc": last}))
        (folder / "checkpoints" / "best.json").write_text(
            json.dumps({"monitor": "val/acc", "value": best, "epoch": 3})
        )
    rows = write_summary(tmp_path, "val/acc", "max")
    assert [(r["job"], r["val/acc"]) for r in rows] == [(0, 0.90), (1, 0.80)]


def test_hostile_job_files_are_read_as_data_not_trusted(tmp_path):
    from experiments.runs.layout import RunDir
    from experiments.runs.sweep import plan_job

    job = tmp_path / "0"
    (job / "checkpoints").mkdir(parents=True)
    (job / "checkpoints" / "best.json").write_text("[1, 2]")  # not an object
    assert RunDir(job).best_value("val/acc") is None
    (job / "checkpoints" / "best.json").write_text('{"monitor": "val/acc", "value": true}')
    assert RunDir(job).best_value("val/acc") is None
    (job / "checkpoints" / "last.ckpt").write_bytes(b"x")
    assert plan_job(job, retry_failed=True) == ("resume", job)
    # a corrupt record is one line naming the file, never read as "not finished"
    (job / "job.json").write_text("[]")
    with pytest.raises(UserError, match=r"0/job.json: holds a JSON list"):
        plan_job(job, retry_failed=True)
    (job / "job.json").write_text('{"status": "failed"}')
    (job / "metrics.json").write_text("{torn")
    with pytest.raises(UserError, match=r"0/metrics.json: not valid JSON"):
        plan_job(job, retry_failed=False)
    # a finished run's metrics win over a stale failed record; a partial record does not
    (job / "metrics.json").write_text(json.dumps({"val/acc": 0.5, "run_dir": str(job)}))
    assert plan_job(job, retry_failed=False) == ("keep", {"val/acc": 0.5, "run_dir": str(job)})
    (job / "metrics.json").write_text(json.dumps({"remedies": []}))
    assert plan_job(job, retry_failed=False) == ("failed", {"status": "failed"})
