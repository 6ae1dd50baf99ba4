"""The console scripts pyproject.toml installs: present next to the interpreter, and their
``--help`` answers at once (no torch import)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers import run_process

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    ("script", "usage"),
    [
        ("experiments-train", "usage: python -m experiments.train"),
        ("experiments-eval", "usage: python -m experiments.eval"),
        ("experiments-predict", "usage: python -m experiments.predict"),
        ("experiments-compare", "usage: python -m experiments.compare"),
    ],
)
def test_console_script_help_exits_0_with_usage(tmp_path, script, usage):
    path = BIN / script
    assert path.is_file(), f"{path} missing: reinstall with pip install -e '.[dev]'"
    res = run_process([str(path), "--help"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(usage), res.stdout[:300]
    assert not (tmp_path / "outputs").exists()  # help runs nothing


def test_hydra_shell_completion_answers_through_the_installed_command(tmp_path):
    import os

    env = {**os.environ, "COMP_LINE": "experiments-train model="}
    res = run_process([str(BIN / "experiments-train"), "-sc", "query=bash"], cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert {"model=cnn", "model=backbone", "model=resnet9"} <= set(res.stdout.split())
