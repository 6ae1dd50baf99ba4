"""``hydra/launcher=ray`` on a real Ray cluster: two nodes (a head and a worker, one CPU
each) started once for this module with Ray's own ``ray start``, joined through
``hydra.launcher.address``; and Ray started by the sweep itself on this machine."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from experiments.runs.layout import RunDir
from tests.helpers import REPO, guide_project, run_cli, run_inproc, run_process

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

# a cluster of the tests' own, not one a developer runs: no token to share, no reporting
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray(*args: str, env: dict) -> None:
    ray_cli = Path(sys.executable).with_name("ray")
    res = run_process([ray_cli, *args], env=env, timeout=180)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]


@pytest.fixture(scope="module")
def cluster():
    """``<host>:<port>`` of a 2-node Ray cluster (1 CPU per node) on this machine."""
    # Ray's sockets live under its temp dir, and a socket path may not pass 107 bytes:
    # pytest's temp dirs (under xdist, popen-gwN/...) are too deep for them
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, **RAY_ENV, "PYTHONPATH": path}  # jobs import tests.helpers
    port = _free_port()
    common = ["--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats"]
    try:
        _ray("start", "--head", f"--port={port}", "--include-dashboard=false",
             f"--temp-dir={temp}", *common, env=env)  # fmt: skip
        _ray("start", f"--address=127.0.0.1:{port}", *common, env=env)
        yield f"127.0.0.1:{port}"
    finally:
        _ray("stop", "--force", env=env)
        shutil.rmtree(temp, ignore_errors=True)


def _sweep(tmp_path, data_dir, *args: str, address: str | None = None, runner=None):
    sweep = tmp_path / "sweep"
    where = [f"hydra.launcher.address={address}"] if address else []
    res = (runner or run_cli)(
        "-m", "experiments.train", "-m", "hydra/launcher=ray", *where, *args,
        f"paths.data_dir={data_dir}", f"hydra.sweep.dir={sweep}", "logger=csv",
        cwd=tmp_path, env_extra=RAY_ENV,
    )  # fmt: skip
    return res, sweep


def _jobs(sweep: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(sweep.glob("*/job.json"))]


def _complete(job_dir: Path) -> bool:
    return (job_dir / "metrics.json").is_file() and RunDir(job_dir).best_weights.is_file()


def test_an_optuna_search_queues_its_trials_for_the_slots_of_both_nodes(
    tmp_path, data_dir, cluster
):
    # 6 trials, 3 Optuna workers, 2 one-CPU slots on 2 nodes: Ray queues the third
    # worker's trial until a slot frees, and each free slot takes the next trial
    res, sweep = _sweep(
        tmp_path, data_dir, "hparams_search=optuna", "hydra.sweeper.n_trials=6",
        "hydra.sweeper.n_jobs=3", "hydra.sweeper.n_startup_trials=3", "debug=limit",
        address=cluster,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    jobs = _jobs(sweep)
    assert sorted(j["trial"] for j in jobs) == list(range(6))
    assert all(j["status"] == "ok" and _complete(sweep / str(j["num"])) for j in jobs)
    assert len({j["node"] for j in jobs}) == 2  # the head and the worker both ran jobs
    # never more jobs at once than slots: at each job's start, count those running
    spans = [(j["ended"] - j["wall_time_s"], j["ended"]) for j in jobs]
    assert max(sum(s <= start < e for s, e in spans) for start, _ in spans) <= 2
    with open(sweep / "summary.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 6
    summary = (sweep / "summary.md").read_text()
    assert "Parameter importance" in summary and "fANOVA" in summary
    assert (sweep / "parallel.png").stat().st_size > 1000


@pytest.fixture
def not_ray():
    """``<host>:<port>`` where a plain TCP server answers (what a wrong port may reach)."""
    server = socket.create_server(("127.0.0.1", 0))

    def answer():
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                conn.sendall(b"HTTP/1.1 200 OK\r\n\r\nnot a Ray head\n")

    threading.Thread(target=answer, daemon=True).start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()


def test_ray_mistakes_are_one_line_before_any_job(tmp_path, data_dir, cluster, not_ray):
    cases = {
        # ray.init waited more than 5 minutes there, deaf to SIGTERM
        f"hydra.launcher.address={not_ray}": "something answers there, but not a Ray head",
        f"hydra.launcher.address=127.0.0.1:{_free_port()}": "no Ray head answers there",
        "hydra.launcher.address=nohost": "expected <host>:<port>",
        "hydra.launcher.cpus_per_job=0": "needs more than 0 CPUs",
        "hydra.launcher.address=127.0.0.1:99999": "expected <host>:<port>",
        "hydra.launcher.lost_retries=-1": "lost_retries=-1 is not valid: expected 0 or more",
        "hydra.launcher.num_cpus=-3": "num_cpus=-3 is not valid: expected 0 or more",
        f"hydra.launcher.address={cluster} hydra.launcher.gpus_per_job=1": "no node of the Ray",
    }
    for args, says in cases.items():
        # refused before Ray starts: in-process, but for the one that joins a real cluster
        runner = run_cli if "gpus_per_job" in args else run_inproc
        res, sweep = _sweep(tmp_path, data_dir, *args.split(), "optimizer.lr=0.01,0.1",
                            runner=runner)  # fmt: skip
        assert res.returncode == 2, (args, res.stderr[-2000:])
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and says in lines[0], (args, lines)
        assert not sweep.exists()  # nothing written, no job started
    assert not sys.modules.get("ray") or not sys.modules["ray"].is_initialized()  # never joined


def test_a_lost_job_is_recorded_and_run_again_on_ray_started_here(tmp_path):
    # no address: the sweep starts Ray on this machine itself; job 0's worker is killed
    # (SIGKILL, as when its node goes) after its first step, the first time only. The jobs
    # train docs/own_task.md's package, which Ray's workers here import through the
    # PYTHONPATH they inherit, as the guide says
    _, own = guide_project(tmp_path)
    sweep = tmp_path / "sweep"
    res = run_cli(
        "-m", "experiments.train", "-m", "hydra/launcher=ray", "hydra.launcher.num_cpus=2",
        "experiment=mine", "model.hidden=4,16", "logger=csv", f"hydra.sweep.dir={sweep}",
        "+callbacks.die._target_=tests.helpers.SignalAt", "+callbacks.die.step=1",
        "+callbacks.die.job=0", "+callbacks.die.signum=9",
        f"+callbacks.die.marker={tmp_path / 'died'}",
        cwd=tmp_path, env_extra={**RAY_ENV, **own},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "died").exists()
    jobs = {j["num"]: j for j in _jobs(sweep)}
    assert jobs[0]["status"] == "ok" and "WorkerCrashedError" in jobs[0]["lost"]
    assert jobs[1]["status"] == "ok" and jobs[1]["lost"] is None
    assert all(_complete(sweep / str(n)) for n in jobs)
    with open(sweep / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    by_job = {r["job"]: r for r in rows}
    assert by_job["0"]["remedies"].startswith("lost, ran again (WorkerCrashedError")
    values = [float(r["val/mae"]) for r in rows]
    assert len(values) == 2 and values == sorted(values)  # its own metric, lowest first


def test_a_job_the_launcher_could_not_run_is_failed_not_healed(tmp_path):
    from experiments.tracking.sweep_summary import collect, record_lost

    record_lost(tmp_path / "0", 0, ["optimizer.lr=0.1"], "RaySystemError: gone", False, "failed")
    record_lost(tmp_path / "1", 1, ["optimizer.lr=0.2"], "WorkerCrashedError: died", False)
    rows = {r["job"]: r for r in collect(tmp_path, "val/acc")}
    assert (rows[0]["status"], rows[0]["remedies"]) == ("failed", "")
    assert (rows[1]["status"], rows[1]["remedies"]) == ("lost", "")  # lost for good
    assert rows[1]["error"] == "WorkerCrashedError: died"


def test_sigterm_stops_a_ray_sweep_and_records_its_running_jobs(tmp_path, data_dir, cluster):
    started = tmp_path / "started"
    ended: list = []
    runner = threading.Thread(target=lambda: ended.append(_sweep(
        tmp_path, data_dir, "optimizer.lr=0.01,0.1", "trainer.max_epochs=50",
        "+callbacks.slow._target_=tests.helpers.Started",
        f"+callbacks.slow.folder={started}", address=cluster,
    )))  # fmt: skip
    runner.start()
    deadline = time.monotonic() + 300
    while not list(started.glob("started-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list(started.glob("started-*")), "no job started"
    # the sweep's process holds the sweep dir's lock, which names it
    driver = json.loads((tmp_path / "sweep" / ".lock").read_text())["pid"]
    os.kill(driver, signal.SIGTERM)
    runner.join(timeout=120)
    (res, sweep) = ended[0]
    assert res.returncode == 143, res.stderr[-3000:]
    jobs = _jobs(sweep)
    assert {j["status"] for j in jobs} == {"interrupted"} and len(jobs) == 2
    assert "2 interrupted" in (sweep / "summary.md").read_text()


def test_a_job_lost_past_its_retries_is_failed_and_the_summary_written(tmp_path, data_dir, cluster):
    # its worker is killed (SIGKILL, as when its node goes) and lost_retries=0: no crash
    res, sweep = _sweep(
        tmp_path, data_dir, "hydra.launcher.lost_retries=0", "debug=limit",
        "+callbacks.die._target_=tests.helpers.SignalAt", "+callbacks.die.step=1",
        "+callbacks.die.job=0", "+callbacks.die.signum=9",
        f"+callbacks.die.marker={tmp_path / 'died'}", address=cluster,
    )  # fmt: skip
    assert res.returncode == 1, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: 1 of 1 jobs failed; job 0: lost 1 time")
    (job,) = _jobs(sweep)
    assert job["status"] == "failed" and "WorkerCrashedError" in job["error"]
    assert "1 jobs, 0 ok, 1 failed" in (sweep / "summary.md").read_text()
