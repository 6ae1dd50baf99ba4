"""Faults found by trying the project as a new user would; each test failed before its fix."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys

import pytest

from experiments.errors import UserError, find_user_error
from experiments.training.pipeline import train
from tests.helpers import run_inproc


def _val_epochs(run) -> list[int]:
    with open(run / "csv" / "metrics.csv", newline="") as f:
        return sorted(int(r["epoch"]) for r in csv.DictReader(f) if r.get("val/acc"))


@pytest.mark.slow
def test_csv_history_and_curves_survive_any_number_of_resumes(make_cfg, tmp_path):
    run = tmp_path / "run"
    train(make_cfg("trainer.max_epochs=2"))
    train(make_cfg("trainer.max_epochs=3", f"resume={run}"))
    train(make_cfg("trainer.max_epochs=4", f"resume={run}"))
    assert _val_epochs(run) == [0, 1, 2, 3]  # Lightning's writer kept only the last part
    import torch

    history = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["callbacks"]
    curves = next(v for k, v in history.items() if "ValidationAccuracy" in k)["history"]
    assert [row["epoch"] for row in curves] == [0, 1, 2, 3]


def _hold_lock(run_dir):
    """Another process that holds the run dir's lock until killed (it waits on its stdin,
    not on a sleep that a slow machine could outlast)."""
    code = (
        "import sys\nfrom experiments.runs.lock import RunLock\n"
        f"RunLock({str(run_dir)!r}).acquire()\nprint('held', flush=True)\nsys.stdin.read()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.slow
def test_a_second_trainer_on_a_run_dir_is_refused_and_a_stale_lock_taken_over(
    make_cfg, tmp_path, data_dir
):
    run = tmp_path / "run"
    args = ["trainer.max_epochs=1", "logger=none", f"paths.data_dir={data_dir}"]
    res = run_inproc("-m", "experiments.train", *args, f"hydra.run.dir={run}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    holder = _hold_lock(run)
    try:
        with pytest.raises(UserError) as err:
            train(make_cfg("trainer.max_epochs=2", "logger=none", f"resume={run}"))
        assert f"pid {holder.pid}" in str(err.value) and "in use" in str(err.value)
        # the command line refuses it before Hydra touches the folder: one line, exit 2
        res = run_inproc("-m", "experiments.train", f"resume={run}", cwd=tmp_path)
        assert res.returncode == 2 and f"pid {holder.pid}" in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the kernel dropped the dead holder's lock: the next trainer takes it over
    metrics = train(make_cfg("trainer.max_epochs=2", "logger=none", f"resume={run}"))
    assert metrics["val/acc"] > 0.5


@pytest.mark.slow
def test_an_empty_wandb_mode_counts_as_unset(make_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    metrics = train(make_cfg("logger=wandb", "debug=fast"))
    assert "val/acc" in metrics
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*"))  # auto mode: offline


def test_an_unknown_key_of_an_inherited_constructor_fails_before_building(make_cfg, tmp_path):
    # CSVLogger's __init__ is Lightning's (inherited): source alone cannot tell, the
    # imported signature can; nothing is built, no data set up, no folder written
    cfg = make_cfg("+logger.csv.flush_every=5")
    with pytest.raises(Exception) as err:
        train(cfg)
    message = str(find_user_error(err.value))
    assert (
        "logger.csv.flush_every" in message
        and "did you mean logger.csv.flush_logs_every_n_steps" in message
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("env", "rank"),
    [
        ({"SLURM_PROCID": "0", "LOCAL_RANK": "1"}, 1),  # ddp inside an interactive allocation
        ({"SLURM_PROCID": "1"}, 1),
        ({"RANK": "3", "LOCAL_RANK": "1", "SLURM_PROCID": "0"}, 3),
        ({}, 0),
    ],
)
def test_process_rank_reads_the_variables_in_lightnings_order(monkeypatch, env, rank):
    from lightning.fabric.utilities.rank_zero import _get_rank

    from experiments.console import process_rank

    for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert process_rank() == rank == (_get_rank() or 0)


def test_secret_keys_follow_one_rule():
    from experiments.secrets import is_secret_key, redact, redact_argv

    for key in ("api_key", "logger.wandb.api_key", "HF_TOKEN", "db.password", "apiKey", "key"):
        assert is_secret_key(key), key
    for key in ("monitor", "tokenizer", "keypoints", "optimizer.lr", "passing"):
        assert not is_secret_key(key), key
    assert redact({"a": {"token": "x", "n": 1}}) == {"a": {"token": "<redacted>", "n": 1}}
    assert redact_argv(["x=1", "+a.secret=s"]) == ["x=1", "+a.secret=<redacted>"]
