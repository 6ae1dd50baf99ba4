"""Self-healing jobs: out of memory -> half the batch, twice the accumulation; a diverged
loss -> a lower learning rate, or status "diverged" in a sweep; each shown in the summary."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from lightning.pytorch import Callback

from tests.helpers import run_inproc

OOM = ["+callbacks.oom._target_=tests.test_remedies.OomAbove", "+callbacks.oom.max_batch=16"]
NAN = ["+callbacks.nan._target_=tests.test_remedies.NanAboveLr", "+callbacks.nan.max_lr=0.05"]


def _rows(sweep) -> dict[str, dict]:
    with open(sweep / "summary.csv") as f:
        return {r["job"]: r for r in csv.DictReader(f)}


@pytest.mark.slow
def test_out_of_memory_halves_the_batch_and_the_sweep_summary_shows_it(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    res = run_inproc(
        "-m", "experiments.train", "-m", "seed=0", "data.batch_size=64", *OOM, "debug=limit",
        f"paths.data_dir={data_dir}", f"hydra.sweep.dir={sweep}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    for job in ("0",):
        metrics = json.loads((sweep / job / "metrics.json").read_text())
        assert metrics["remedies"] == [
            "data.batch_size=32 trainer.accumulate_grad_batches=2 (out of memory at batch 64)",
            "data.batch_size=16 trainer.accumulate_grad_batches=4 (out of memory at batch 32)",
        ]
        assert "test/acc" in metrics  # then it trained to the end
        hparams = (sweep / job / "csv" / "hparams.yaml").read_text()
        assert "batch_size: 16" in hparams and "accumulate_grad_batches: 4" in hparams
    rows = _rows(sweep)
    assert {r["status"] for r in rows.values()} == {"ok"}
    assert all("data.batch_size=16" in r["remedies"] for r in rows.values())
    assert "| remedies |" in (sweep / "summary.md").read_text()


def test_out_of_memory_below_the_floor_is_one_line(tmp_path, data_dir):
    res = run_inproc(
        "-m", "experiments.train", "data.batch_size=64", "remedies.min_batch_size=32", *OOM,
        "debug=limit", f"paths.data_dir={data_dir}", f"hydra.run.dir={tmp_path / 'r'}",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == (
        "error: out of memory at data.batch_size=32, and half of it is below "
        "remedies.min_batch_size=32: use a smaller model or input, or a larger device"
    )


@pytest.mark.slow
def test_a_diverged_job_is_retried_at_a_lower_lr_or_ends_as_diverged(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    res = run_inproc(
        "-m", "experiments.train", "-m", "remedies.diverged_retries=0,1", "optimizer.lr=0.1",
        *NAN, "debug=limit", f"paths.data_dir={data_dir}", f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]  # a diverged job is no crash
    rows = _rows(sweep)
    assert rows["0"]["status"] == "diverged" and "training loss is nan" in rows["0"]["error"]
    assert rows["1"]["status"] == "ok"
    assert rows["1"]["remedies"] == "optimizer.lr=0.01 (diverged at lr 0.1)"
    first = json.loads((sweep / "0" / "metrics.json").read_text())
    assert first["status"] == "diverged" and first["diverged_at_step"] >= 2  # NaN from step 2
    summary = (sweep / "summary.md").read_text()
    assert "1 diverged" in summary and "| remedies |" in summary


def test_the_cpu_allocators_out_of_memory_halves_the_batch_too(tmp_path, data_dir):
    # the real CPU allocator error ("DefaultCPUAllocator: can't allocate memory", not "out of
    # memory") for a batch above 16: the run halves its batch twice and trains to the end
    run = tmp_path / "r"
    res = run_inproc(
        "-m", "experiments.train", "data.batch_size=64", "debug=limit", "logger=none",
        "+callbacks.oom._target_=tests.test_remedies.OomAbove", "+callbacks.oom.allocator=true",
        "+callbacks.oom.max_batch=16", f"paths.data_dir={data_dir}", f"hydra.run.dir={run}",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["remedies"] == [
        "data.batch_size=32 trainer.accumulate_grad_batches=2 (out of memory at batch 64)",
        "data.batch_size=16 trainer.accumulate_grad_batches=4 (out of memory at batch 32)",
    ]
    assert "test/acc" in metrics
    assert "can't allocate memory" in res.stdout + res.stderr  # the cause, in one line each


def test_what_counts_as_out_of_memory():
    import torch

    from experiments.training.remedies import is_out_of_memory

    with pytest.raises(RuntimeError) as cpu:
        torch.empty(2**50, dtype=torch.uint8)  # more than any address space
    assert is_out_of_memory(cpu.value)
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate"))
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("can't allocate memory"))  # not an allocator's


class OomAbove(Callback):
    """Out of memory for a training batch above ``max_batch``: torch's CUDA error, faked on a
    CPU; or, with ``allocator``, the CPU allocator's real error for a request of 1 PiB."""

    def __init__(self, max_batch: int, allocator: bool = False) -> None:
        self.max_batch, self.allocator = max_batch, allocator

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch[0].shape[0] <= self.max_batch:
            return
        if self.allocator:
            torch.empty(2**50, dtype=torch.uint8)  # more than any address space
        raise torch.OutOfMemoryError(
            f"CUDA out of memory (simulated): batch of {batch[0].shape[0]} > {self.max_batch}"
        )


class NanAboveLr(Callback):
    """NaN weights (so a NaN loss) while the learning rate is above ``max_lr``: what too high
    a learning rate does, made certain."""

    def __init__(self, max_lr: float, at_step: int = 2) -> None:
        self.max_lr, self.at_step = max_lr, at_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        if trainer.global_step == self.at_step and lr > self.max_lr:
            with torch.no_grad():
                next(pl_module.net.parameters()).fill_(float("nan"))
