"""DDP with two CPU processes (gloo), through the CLI in a subprocess: `strategy="ddp"`
inside pytest would re-launch pytest itself."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from hydra.utils import instantiate

from experiments.runs.layout import RunDir
from experiments.runs.weights import read_state_dict
from experiments.training.pipeline import train
from tests.helpers import REPO, assert_same_training_state, run_cli

ENV = {"PYTHONPATH": str(REPO), "EXPERIMENTS_TRUSTED_MODULES": "tests.helpers"}


@pytest.mark.slow
def test_two_process_run_one_dir_disjoint_shards_global_val_acc(tmp_path, data_dir, make_cfg):
    reads = tmp_path / "reads"
    reads.mkdir()
    dataset = (
        f"data.dataset={{_target_:tests.helpers.random_sets,_partial_:true,"
        f"record_dir:'{reads}',n:400}}"
    )
    res = run_cli(
        "-m",
        "experiments.train",
        "trainer=ddp_cpu",
        "trainer.max_epochs=1",
        dataset,
        "data.batch_size=16",
        f"paths.data_dir={data_dir}",
        "trainer.num_sanity_val_steps=0",
        cwd=tmp_path,
        env_extra=ENV,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    runs = list((tmp_path / "outputs" / "train" / "runs").iterdir())
    assert len(runs) == 1  # no extra dirs from the second rank
    assert len(list(tmp_path.rglob("metrics.json"))) == 1
    assert sum("epoch 1/1" in line for line in res.stdout.splitlines()) == 1  # said once

    # the first train set built (instance 0) was read by two processes, half each
    shards = [set(map(int, p.read_text().split())) for p in reads.glob("reads-*-0.txt")]
    assert len(shards) == 2
    assert not shards[0] & shards[1]
    n_train = 400 - round(400 * 0.15)  # data=digits' val_fraction; test comes from the set
    assert len(shards[0]) == len(shards[1]) == n_train // 2

    # the logged val/acc is the all-ranks value: recompute it in one process from the best weights
    metrics = json.loads((runs[0] / "metrics.json").read_text())
    assert metrics["epochs"] == 1 and metrics["global_step"] == -(-n_train // 2 // 16)
    cfg = make_cfg(dataset.replace(str(reads), str(tmp_path / "reads2")), "data.batch_size=16")
    (tmp_path / "reads2").mkdir()
    dm = instantiate(cfg.data)
    dm.setup()
    net = instantiate(cfg.model.net, in_shape=dm.input_shape, num_classes=dm.num_classes)
    net.load_state_dict(read_state_dict(RunDir(runs[0]).best_weights))
    net.eval()
    with torch.no_grad():
        correct = sum(int((net(x).argmax(1) == y).sum()) for x, y in dm.val_dataloader())
    assert correct / len(dm.val_set) == pytest.approx(metrics["val/acc"], abs=1e-6)


@pytest.mark.slow
def test_ddp_inside_a_multirun(tmp_path, data_dir):
    res = run_cli(
        "-m",
        "experiments.train",
        "-m",
        "trainer=ddp_cpu",
        "optimizer.lr=0.01,0.1",
        "debug=limit",
        f"paths.data_dir={data_dir}",
        cwd=tmp_path,
        env_extra=ENV,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (sweep,) = (tmp_path / "outputs" / "debug" / "multiruns").iterdir()
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]
    assert not (tmp_path / "outputs" / "debug" / "runs").exists()  # no stray single-run dirs
    with open(sweep / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["job"] for r in rows) == ["0", "1"]
    assert all(r["status"] == "ok" for r in rows)


@pytest.mark.slow
def test_two_processes_match_one_at_the_same_global_batch(tmp_path, data_dir, make_cfg):
    single = train(make_cfg("trainer.max_epochs=8", "data.batch_size=64", "logger=none"))
    res = run_cli(
        "-m",
        "experiments.train",
        "trainer=ddp_cpu",
        "trainer.max_epochs=8",
        "data.batch_size=32",
        "logger=none",
        f"paths.data_dir={data_dir}",
        "hydra.run.dir=ddp",
        cwd=tmp_path,
        env_extra=ENV,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    ddp = json.loads((tmp_path / "ddp" / "metrics.json").read_text())
    assert single["test/acc"] >= 0.9 and ddp["test/acc"] >= 0.9
    assert abs(single["test/acc"] - ddp["test/acc"]) <= 0.04


def test_a_requeued_slurm_job_resumes_its_own_run(tmp_path, monkeypatch):
    from experiments.cli.check import precheck
    from experiments.config import CONF_DIR

    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "outputs" / "train" / "runs"
    for name, job in (("mine", "4242"), ("other", "777")):
        (runs / name / ".hydra").mkdir(parents=True)
        (runs / name / "checkpoints").mkdir()
        (runs / name / "checkpoints" / "last.ckpt").write_bytes(b"x")
        (runs / name / ".hydra" / "overrides.yaml").write_text("- trainer=ddp_cpu\n")
        (runs / name / "env.json").write_text(json.dumps({"slurm_job_id": job}))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert precheck(["trainer=ddp_cpu"], str(CONF_DIR)) == ["trainer=ddp_cpu"]  # first start
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # requeued after SIGUSR1
    mine = (runs / "mine").resolve()
    assert precheck(["trainer=ddp_cpu"], str(CONF_DIR)) == [
        "trainer=ddp_cpu",
        f"resume={mine}",
        f"hydra.run.dir={mine}",
    ]


@pytest.mark.slow
def test_frozen_backbone_stays_exactly_at_its_start_under_ddp(tmp_path, data_dir, make_cfg):
    import lightning as L

    from experiments.training.build import datamodule_and_model

    args = ["model=cnn", "model.freeze_backbone_epochs=1", "seed=3", "logger=none"]
    res = run_cli(
        "-m",
        "experiments.train",
        "trainer=ddp_cpu",
        "trainer.max_epochs=1",
        "test=false",
        f"paths.data_dir={data_dir}",
        *args,
        cwd=tmp_path,
        env_extra=ENV,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = (tmp_path / "outputs" / "train" / "runs").iterdir()
    trained = read_state_dict(RunDir(run).last_weights)
    L.seed_everything(3, verbose=False)  # the same initial weights as the run's
    _, model = datamodule_and_model(make_cfg(*args))
    start = model.net.state_dict()
    for key, value in start.items():
        # gradients dropped and BatchNorms in eval mode: the backbone, running statistics
        # included, is bit-for-bit where it started; the head has trained
        assert torch.equal(trained[key], value) == (not key.startswith("head.")), key


@pytest.mark.slow
def test_sigterm_to_the_fork_workers_saves_exits_143_and_resumes_bit_exact(tmp_path, data_dir):
    # the signal goes to each worker process itself (SignalAt runs in the workers), as a
    # scheduler's SIGTERM to the process group does: it used to hang the parent forever
    common = ["trainer=ddp_cpu", "seed=0", "trainer.max_epochs=3", "logger=none"]
    common.append(f"paths.data_dir={data_dir}")
    stop = ["+callbacks.signal_at._target_=tests.helpers.SignalAt", "+callbacks.signal_at.step=15"]
    res = run_cli("-m", "experiments.train", *common, *stop, "hydra.run.dir=A", cwd=tmp_path)
    assert res.returncode == 143, res.stderr[-3000:]
    out = res.stdout + res.stderr
    assert "stopped by SIGTERM in epoch 2, at step 15" in out
    assert "resume with: python -m experiments.train resume=" in out
    assert not (tmp_path / "A" / "metrics.json").exists()
    res = run_cli("-m", "experiments.train", "resume=A", "callbacks.signal_at.step=-1",
                  cwd=tmp_path, env_extra=ENV)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    res = run_cli("-m", "experiments.train", *common, "hydra.run.dir=B", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert_same_training_state(
        tmp_path / "A/checkpoints/last.ckpt", tmp_path / "B/checkpoints/last.ckpt"
    )
    a, b = (json.loads((tmp_path / r / "metrics.json").read_text()) for r in "AB")
    assert a["val/acc"] == b["val/acc"] and a["test/acc"] == b["test/acc"]
