"""Quiet by default: what a newcomer sees on the documented paths is a few dozen lines with
no third-party warning (issue: a newcomer's first hour)."""

from __future__ import annotations

import json
import warnings

import pytest

from tests.helpers import run_cli, run_inproc

NOISE = ("Warning", "warn(", "ERROR", "Traceback")


def _console(tmp_path, data_dir, *args, process: bool = False) -> list[str]:
    run = run_cli if process else run_inproc
    res = run("-m", "experiments.train", *args, f"paths.data_dir={data_dir}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    noisy = [ln for ln in lines if any(n in ln for n in NOISE)]
    assert noisy == [], noisy
    return lines


@pytest.mark.slow
@pytest.mark.parametrize("args", [(), ("debug=overfit",), ("debug=profile",)])
def test_documented_runs_print_a_few_lines_and_no_warning(tmp_path, data_dir, args):
    # the plain run is a process of its own: warnings printed while importing count too
    lines = _console(tmp_path, data_dir, *args, process=not args)
    assert len(lines) <= 40, "\n".join(lines)
    assert lines[1].startswith("[") and "run: data=digits model=mlp" in lines[1], lines[:3]
    assert any("done in" in ln for ln in lines) and "acc" in lines[-1]
    (log,) = tmp_path.rglob("train.log")  # everything, Lightning's notices too, is there
    assert "GPU available" in log.read_text()
    if args == ("debug=overfit",):  # it trains (it used to crash: StoreLoader)
        (metrics,) = tmp_path.rglob("metrics.json")
        assert json.loads(metrics.read_text())["train/loss"] < 0.1


@pytest.mark.slow
def test_a_three_job_sweep_prints_a_line_per_job_and_the_summary(tmp_path, data_dir):
    lines = _console(tmp_path, data_dir, "-m", "optimizer.lr=0.05,0.1,0.2", "debug=limit")
    assert sum("done in" in ln for ln in lines) == 3
    assert not any(ln.startswith("[") and " epoch " in ln for ln in lines)
    assert any("sweep summary (3 jobs)" in ln for ln in lines)
    assert len(lines) <= 25, "\n".join(lines)


def test_the_filtered_upstream_warning_still_happens_without_the_filter():
    # when Lightning fixes it (Lightning-AI/pytorch-lightning#21326), this fails: drop the
    # filter in experiments.console.UPSTREAM_WARNINGS
    from lightning.pytorch.utilities._pytree import _tree_flatten

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _tree_flatten(1.0)
    assert any("LeafSpec" in str(w.message) for w in caught)


def test_the_srun_hint_still_comes_from_lightning_and_is_hidden_outside_slurm_jobs(
    tmp_path, monkeypatch
):
    # Lightning's checkpoint connector asks SLURMEnvironment.detect() on every fit, whatever
    # plugin the Trainer has: with srun installed and no SLURM job, it warns. When this test
    # fails, Lightning stopped doing that: drop SRUN_HINT in experiments.console.
    from lightning.fabric.plugins.environments import SLURMEnvironment

    from experiments.console import filter_upstream_warnings

    (tmp_path / "srun").write_text("#!/bin/sh\n")
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    for var in ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_JOB_NAME"):
        monkeypatch.delenv(var, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SLURMEnvironment.detect()
    assert any("`srun` command is available" in str(w.message) for w in caught)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        filter_upstream_warnings()
        SLURMEnvironment.detect()
    assert not any("`srun` command is available" in str(w.message) for w in caught)


def test_the_profiler_cycle_warning_is_hidden_around_the_profiler_only():
    # torch warns on a scheduled CUDA profile (seen on an H200, not on this CPU build)
    from experiments.compat.torch import quiet_profiler

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_profiler():
            warnings.warn("Warning: Profiler clears events at the end of each cycle.", stacklevel=1)
        warnings.warn("Warning: Profiler clears events at the end of each cycle.", stacklevel=1)
    assert len(caught) == 1  # outside the block it is not hidden
