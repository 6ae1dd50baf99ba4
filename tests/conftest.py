"""Fixtures (the digits data, configs composed over temp dirs, a trained run) and hooks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from experiments.config import CONF_DIR
from tests.helpers import train_cli


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """One data dir per test session (the digits export is made once and reused)."""
    path = tmp_path_factory.mktemp("data")
    from experiments.data import export_digits

    export_digits(path / "digits")
    return path


@pytest.fixture
def make_cfg(tmp_path, data_dir):
    """Compose ``train.yaml`` with overrides, data and outputs under temp dirs."""
    paths = [f"paths.data_dir={data_dir}", f"paths.log_dir={tmp_path / 'outputs'}",
             f"paths.output_dir={tmp_path / 'run'}", "paths.sweep_group=null",
             "paths.job_name=null"]  # fmt: skip

    def _make(*overrides: str, config_name: str = "train") -> DictConfig:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name, overrides=[*paths, *overrides])

    return _make


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, data_dir) -> Path:
    """One finished run (2 epochs of digits, by the train CLI), shared by the eval and predict
    tests: read it, or tamper with a copy."""
    run = tmp_path_factory.mktemp("trained") / "outputs/train/runs/2025-01-01_00-00-00"
    run.parent.mkdir(parents=True)
    return train_cli(run, data_dir, "trainer.max_epochs=2", "logger=none")


@pytest.fixture(scope="session")
def few_images(data_dir, tmp_path_factory) -> Path:
    """Every 30th digit image, in a folder of their own (what predict is given)."""
    folder = tmp_path_factory.mktemp("few")
    for name in sorted((data_dir / "digits" / "images").iterdir())[::30]:
        shutil.copy(name, folder)
    return folder


# The longest test files start first: with ``--dist loadfile`` a long file started last
# keeps one worker busy while the other has nothing left to do (the order only; the
# durations of ``make test``'s --durations report show which files these are).
LONGEST_FIRST = ("test_ray.py", "test_sweeps.py", "test_docs_commands_guides.py", "test_bench.py",
                 "test_slurm.py")  # fmt: skip


def pytest_collection_modifyitems(items) -> None:
    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file's tests stay together, in their order
    if not torch.cuda.is_available():  # reported as skipped with the reason, never silent
        skip = pytest.mark.skip(reason="gpu: no CUDA GPU is visible here")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
