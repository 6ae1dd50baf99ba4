"""The profiling callback: files, numbers, and a verdict: data-bound or compute-bound.

The slow part of each run is slow by construction, in virtual time (``tests.helpers.
VirtualTime``): a real sleep against a real step measures how busy the machine is."""

from __future__ import annotations

import json
import time

import pytest

from experiments.callbacks.profiling import Profiling
from experiments.training.pipeline import train
from tests.helpers import VirtualTime


def _sets(delay: float, shape: str) -> list[str]:
    return [
        f"data.dataset={{_target_:tests.helpers.random_sets,_partial_:true,delay:{delay},"
        f"shape:{shape},n:480}}",
        "data.batch_size=16",
        "data.num_workers=0",
        "trainer.max_epochs=2",
        "trainer.limit_val_batches=2",
        "test=false",
        "callbacks.profiling._target_=tests.test_profiling.VirtualClockProfiling",
    ]


@pytest.mark.slow
def test_sleepy_dataset_is_called_data_bound(make_cfg, tmp_path):
    # every sample read costs 1 s of virtual time: a step is never 16 s of real compute
    train(make_cfg("profile=true", *_sets(1.0, "[1,8,8]")))
    out = tmp_path / "run" / "profile"
    trace = json.loads((out / "trace.json").read_text())
    assert trace["traceEvents"], "empty trace"
    assert "Self CPU" in (out / "ops.txt").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["epoch"] == 2 and summary["steps"] >= 5  # the 2nd epoch (1-based)
    assert summary["data_wait_frac"] > 0.9
    assert summary["verdict"].startswith("data loading is")
    assert "try data.num_workers=" in summary["verdict"]
    assert summary["steps_per_s"] > 0 and summary["samples_per_s"] > summary["steps_per_s"]
    metrics = (tmp_path / "run" / "csv" / "metrics.csv").read_text()
    assert "perf/data_wait_frac" in metrics and "perf/samples_per_s" in metrics


@pytest.mark.slow
def test_in_memory_tensors_are_called_compute_bound(make_cfg, tmp_path):
    # every forward costs 1 s of virtual time; a batch cut from memory is never that slow
    net = ["~model.net", "+model.net={_target_:tests.helpers.SlowNet,seconds:1.0}"]
    train(make_cfg("profile=true", *net, *_sets(0.0, "[1,8,8]")))
    summary = json.loads((tmp_path / "run" / "profile" / "summary.json").read_text())
    assert summary["data_wait_frac"] < 0.1
    assert "compute dominates" in summary["verdict"]


def test_off_means_no_profiler(make_cfg, tmp_path):
    from hydra.utils import instantiate

    cfg = make_cfg("debug=limit")
    callback = instantiate(cfg.callbacks.profiling)
    assert callback.enabled is False
    train(cfg)
    assert not (tmp_path / "run" / "profile").exists()


class VirtualClockProfiling(Profiling):
    def now(self) -> float:
        return time.perf_counter() + VirtualTime.extra
