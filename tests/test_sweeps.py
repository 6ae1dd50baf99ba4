"""Multirun sweeps beyond the basic grid: Optuna (resumable), joblib and submitit launchers."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from tests.helpers import run_inproc


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
    res = run_inproc(*args, cwd=tmp_path)
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
    res = run_inproc(
        *args[:-1], "hydra.sweeper.n_trials=4", f"hydra.sweep.dir={sweep}", cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming study" in res.stdout + res.stderr
    _, rows = _sweep(tmp_path)
    assert sorted(int(r["job"]) for r in rows) == [0, 1, 2, 3]
    assert yaml.safe_load((sweep / "optimization_results.yaml").read_text())["n_trials"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_parallel_and_slurm_style_launchers(tmp_path, data_dir, launcher):
    extra = ["hydra.launcher.n_jobs=2"] if launcher == "joblib" else []
    res = run_inproc(
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


def _study(sweep):
    import optuna

    return optuna.load_study(study_name=sweep.name, storage=f"sqlite:///{sweep / 'optuna.db'}")


OPTUNA = ["-m", "experiments.train", "-m", "hparams_search=optuna"]
# the search space comes from the test's own overrides; no logger, runs under debug/
OPTUNA_OWN_SPACE = [*OPTUNA, "hydra.sweeper.params={}", "logger=none", "task_name=debug"]
OPTUNA_PARALLEL = [
    *OPTUNA_OWN_SPACE,
    "hydra/launcher=joblib",
    "hydra.launcher.n_jobs=2",
    "hydra.sweeper.n_jobs=2",
]


@pytest.mark.slow
def test_optuna_workers_do_not_wait_on_each_others_trials(tmp_path, data_dir):
    # trial 0 (2 epochs) starts training only after two other trials ended (tests.helpers.
    # Rendezvous): with a batch barrier trial 2 would be asked for only after trial 0 ended,
    # so trial 0 would wait in vain and fail; asynchronous workers start trial 2 at once
    (tmp_path / "ended").mkdir()
    res = run_inproc(
        *OPTUNA_PARALLEL,
        f"paths.data_dir={data_dir}",
        "hydra.sweeper.n_trials=3",
        "trainer.max_epochs=choice(1,2)",
        "hydra.sweeper.enqueue=[{trainer.max_epochs:2},{trainer.max_epochs:1},"
        "{trainer.max_epochs:1}]",
        "+callbacks.rendezvous._target_=tests.helpers.Rendezvous",
        f"+callbacks.rendezvous.folder={tmp_path / 'ended'}",
        "+callbacks.rendezvous.wait_epochs=2",
        "+callbacks.rendezvous.count=2",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    sweep, rows = _sweep(tmp_path)
    trials = {t.number: t for t in _study(sweep).trials}
    assert [trials[n].params["trainer.max_epochs"] for n in range(3)] == [2, 1, 1]
    # trial 0 trained only after trials 1 and 2 had (the Rendezvous held it, and would have
    # failed it had trial 2 waited for trial 0): it ran while trial 0 was in flight. Their
    # completion times are not asserted: each is told to the study after its process ends
    assert trials[2].datetime_start < trials[0].datetime_complete  # no batch barrier
    assert len(rows) == 3 and all(r["status"] == "ok" for r in rows)
    assert len(list((tmp_path / "ended").glob("ended-*"))) == 2


@pytest.mark.slow
def test_median_pruner_stops_losing_trials(tmp_path, data_dir):
    # two good learning rates finish first; two hopeless ones are pruned after one epoch
    res = run_inproc(
        *OPTUNA_OWN_SPACE,
        f"paths.data_dir={data_dir}",
        "trainer.max_epochs=4",
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.pruner=median",
        "hydra.sweeper.pruner_startup_trials=2",
        "optimizer.lr=choice(0.1,0.0001)",
        "hydra.sweeper.enqueue=[{optimizer.lr:0.1},{optimizer.lr:0.1},"
        "{optimizer.lr:0.0001},{optimizer.lr:0.0001}]",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    sweep, rows = _sweep(tmp_path)
    states = {t.number: t.state.name for t in _study(sweep).trials}
    assert states == {0: "COMPLETE", 1: "COMPLETE", 2: "PRUNED", 3: "PRUNED"}
    by_job = {int(r["job"]): r for r in rows}
    assert [by_job[j]["status"] for j in range(4)] == ["ok", "ok", "pruned@2", "pruned@2"]
    for job in (2, 3):  # stopped after epoch 2 (warm-up 1), and not tested
        metrics = json.loads((sweep / str(job) / "metrics.json").read_text())
        assert metrics["pruned_at_epoch"] == 1 and metrics["epochs"] == 2
        assert "test/acc" not in metrics
    summary = (sweep / "summary.md").read_text()
    assert "4 jobs, 2 ok, 2 pruned, 0 failed" in summary
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert result["pruned"] == 2 and result["complete"] == 2 and result["best_trial"] in (0, 1)


@pytest.mark.slow
def test_multi_objective_search_writes_the_pareto_front(tmp_path, data_dir):
    res = run_inproc(
        *OPTUNA_OWN_SPACE,
        "debug=limit",
        f"paths.data_dir={data_dir}",
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.sampler=random",
        "hydra.sweeper.objectives={val/acc:maximize,params:minimize}",
        "model.net.hidden_sizes=choice([8],[32],[128,64],[256,128])",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    sweep, rows = _sweep(tmp_path)
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert result["objectives"] == {"val/acc": "maximize", "params": "minimize"}
    points = {}
    for job in range(4):
        metrics = json.loads((sweep / str(job) / "metrics.json").read_text())
        points[job] = (metrics["val/acc"], -metrics["params"])  # both: larger is better

    def dominated(p):
        return any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points.values())

    front = {p["trial"] for p in result["pareto_front"]}
    assert front == {j for j, p in points.items() if not dominated(p)}
    assert {int(r["job"]) for r in rows if r["pareto"] == "yes"} == front


@pytest.mark.parametrize(
    "override, named",
    [
        ("hydra.sweeper.pruner=nope", "hydra.sweeper.pruner='nope'"),
        ("hydra.sweeper.direction=up", "hydra.sweeper.direction='up'"),
        ("hydra.sweeper.sampler=grid", "hydra.sweeper.sampler='grid'"),
        ("hydra.sweeper.objectives={val/acc:best}", "hydra.sweeper.objectives.val/acc='best'"),
    ],
)
def test_bad_sweeper_settings_fail_in_one_line(tmp_path, override, named):
    res = run_inproc(*OPTUNA, override, cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [res.stderr.strip()]  # one line
    assert named in res.stderr


def test_pruning_needs_a_single_objective(tmp_path):
    res = run_inproc(
        *OPTUNA,
        "hydra.sweeper.pruner=median",
        "hydra.sweeper.objectives={val/acc:maximize,params:minimize}",
        cwd=tmp_path,
    )
    assert res.returncode == 2 and "single-objective studies only" in res.stderr
