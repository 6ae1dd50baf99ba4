"""Sweeps under faults (trust round 4): a sweep's workers die with it, a re-run trusts a
finished job's metrics over a stale record, one job's user error is that job's failure, a
corrupt Optuna storage or job file is one line, never a traceback."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from lightning.pytorch import Callback

from experiments.errors import UserError
from tests.helpers import run_cli, run_inproc


def _rows(sweep) -> dict[str, dict]:
    with open(sweep / "summary.csv") as f:
        return {r["job"]: r for r in csv.DictReader(f)}


def _alive(pid: int) -> bool:
    """``pid`` runs (a zombie, which nobody may reap in a container, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _wait_for(what, timeout: float, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(every)
    return what()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_joblib_sweep_takes_its_workers_with_it(tmp_path, data_dir):
    # a joblib (loky) worker trains slowly; the sweep's own process is killed with -9
    # (nothing it can catch) once the job has started: its worker must not train on
    started = tmp_path / "started"
    sweep = tmp_path / "sweep"
    ended: list = []
    command = threading.Thread(target=lambda: ended.append(run_cli(  # a process, to kill
        "-m", "experiments.train", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
        "trainer.max_epochs=50", "logger=none", f"paths.data_dir={data_dir}",
        "+callbacks.slow._target_=tests.helpers.Started",
        f"+callbacks.slow.folder={started}", f"hydra.sweep.dir={sweep}", cwd=tmp_path,
    )))  # fmt: skip
    command.start()
    workers: list[int] = []
    try:
        markers = _wait_for(lambda: sorted(started.glob("started-*")), timeout=300)
        assert markers, "no job started training"
        workers = [int(m.name.split("-")[1]) for m in markers]
        (parent,) = {int(m.read_text()) for m in markers}  # the sweep's process
        assert parent not in workers and parent != os.getpid() and _alive(parent)
        os.kill(parent, signal.SIGKILL)
        command.join(timeout=60)
        assert ended and ended[0].returncode == -signal.SIGKILL
        gone = _wait_for(lambda: not any(_alive(w) for w in workers), timeout=60)
        assert gone, f"worker(s) {[w for w in workers if _alive(w)]} outlived the sweep"
        # the job's state was recorded as it stopped: the same command resumes it
        job = json.loads((sweep / "0" / "job.json").read_text())
        assert job["status"] == "interrupted", job
        assert (sweep / "0" / "checkpoints" / "last.ckpt").is_file()
    finally:  # on failure, leave no orphan training on the test machine
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


GRID = [
    "-m", "experiments.train", "-m", "debug=fast", "logger=none",
    "+callbacks.refuse._target_=tests.test_sweep_faults.RefuseValue",
    "+callbacks.refuse.value=1,2,3", "+callbacks.refuse.refused=2",
]  # fmt: skip


@pytest.mark.slow
def test_one_jobs_user_error_is_its_failure_and_a_rerun_trusts_finished_metrics(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    command = [*GRID, f"paths.data_dir={data_dir}", f"hydra.sweep.dir={sweep}"]
    res = run_inproc(*command, cwd=tmp_path)
    # job 1's mistake is job 1's failure: the others ran; the end is one line, exit 1
    assert res.returncode == 1, res.stderr[-3000:]
    assert res.stderr.strip().splitlines() == [
        "error: 1 of 3 jobs failed; job 1: UserError: callbacks.refuse.value=2 is not valid: "
        f"expected not 2; see {sweep / 'summary.md'}"
    ]
    rows = _rows(sweep)
    assert {k: r["status"] for k, r in rows.items()} == {"0": "ok", "1": "failed", "2": "ok"}
    assert rows["1"]["error"].endswith("callbacks.refuse.value=2 is not valid: expected not 2")
    assert "| failed | UserError: callbacks.refuse.value=2" in (sweep / "summary.md").read_text()

    # job 0's record says failed (as when its sweep was killed after its run had ended):
    # its complete metrics.json wins, on this re-run and every later one
    job0 = json.loads((sweep / "0" / "job.json").read_text())
    (sweep / "0" / "job.json").write_text(json.dumps({**job0, "status": "failed", "error": "x"}))
    kept = (sweep / "0" / "metrics.json").read_bytes()
    for _ in range(2):
        res = run_inproc(*command, "sweep.retry_failed=false", cwd=tmp_path)
        assert res.returncode == 1, res.stderr[-3000:]
        assert (res.stdout + res.stderr).count("finished in an earlier run") == 2
        rows = _rows(sweep)
        assert {k: r["status"] for k, r in rows.items()} == {"0": "ok", "1": "failed", "2": "ok"}
        assert (sweep / "0" / "metrics.json").read_bytes() == kept  # kept, not trained again


def test_a_corrupt_optuna_storage_is_one_line_with_the_way_out(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "optuna.db").write_bytes(os.urandom(4096))  # not SQLite
    res = run_inproc(
        "-m", "experiments.train", "-m", "hparams_search=optuna", "debug=fast",
        "hydra.sweeper.n_trials=1", f"hydra.sweep.dir={sweep}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {sweep / 'optuna.db'} cannot be")
    assert "delete it to start the search afresh" in lines[0]
    assert "hydra.sweeper.storage" in lines[0]
    assert not list(sweep.glob("*/job.json"))  # no trial ran


def test_the_summary_lists_a_job_with_corrupt_files_as_broken(tmp_path):
    from experiments.tracking.sweep_summary import write_summary

    def job(num: int, record: str, metrics: str | None = None) -> None:
        (tmp_path / str(num)).mkdir()
        (tmp_path / str(num) / "job.json").write_text(record)
        if metrics is not None:
            (tmp_path / str(num) / "metrics.json").write_text(metrics)

    ok = {"num": 0, "overrides": ["optimizer.lr=0.1"], "status": "ok", "value": 0.5}
    job(0, json.dumps(ok), json.dumps({"val/acc": 0.5, "remedies": "not a list"}))
    job(1, '{"num": 1, "status": "ok", "overr')  # torn
    job(2, json.dumps({**ok, "num": 2}), "[]")  # metrics.json not an object
    job(3, json.dumps({**ok, "num": 3, "overrides": 7}))  # the wrong type
    (tmp_path / "optimization_results.yaml").write_text("a: [unclosed")
    rows = {r["job"]: r for r in write_summary(tmp_path, "val/acc", "max")}
    assert rows[0]["status"] == "ok" and rows[0]["val/acc"] == 0.5
    for num, says in ((1, "1/job.json: not valid JSON"), (2, "2/metrics.json: holds a JSON"),
                      (3, "3/job.json: not a job record")):  # fmt: skip
        assert rows[num]["status"] == "broken" and says in rows[num]["error"], rows[num]
    assert "4 jobs, 1 ok, 3 failed" in (tmp_path / "summary.md").read_text()


def test_a_recorded_failure_is_passed_over_by_hydras_sweepers():
    # experiments.compat.hydra pins Hydra's JobReturn: a failed job's return_value raises
    from hydra.core.utils import JobReturn, JobStatus

    from experiments.compat.hydra import as_recorded_failure

    ret = JobReturn(overrides=["a=1"], status=JobStatus.FAILED, _return_value=ValueError("x"))
    with pytest.raises(ValueError):
        _ = ret.return_value
    as_recorded_failure(ret)
    assert ret.status == JobStatus.COMPLETED and ret.return_value is None


class RefuseValue(Callback):
    """A callback whose ``value`` may not be ``refused``: a one-line user error that only
    the grid job with that value meets, as it builds its callbacks."""

    def __init__(self, value: int, refused: int) -> None:
        if value == refused:
            raise UserError(f"callbacks.refuse.value={value} is not valid: expected not {refused}")
