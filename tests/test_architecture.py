"""The layout keeps its promises: the pre-Hydra layer imports no torch, modules stay
small, the configs ship inside the package, and old run dirs still evaluate."""

from __future__ import annotations

import json
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO, run_process

SRC = REPO / "src" / "experiments"
# what runs before Hydra, or for eval/predict before anything is built
TORCH_FREE = (
    "experiments.config.precheck",
    "experiments.config.schema",
    "experiments.config.signatures",
    "experiments.config.options",
    "experiments.config.secrets",
    "experiments.config.allowlist",
    "experiments.runs.layout",
    "experiments.runs.resume",
    "experiments.runs.lock",
    "experiments.runs.saved",
    "experiments.runs.sweep",
    "experiments.compat.hydra",
    "experiments.errors",
)


def test_the_pre_hydra_layer_imports_no_torch():
    code = f"import sys\nfor m in {TORCH_FREE!r}:\n    __import__(m)\n" + (
        "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    )
    out = run_process([sys.executable, "-c", code], check=True)
    assert out.stdout.strip() == "[]"


def test_no_module_is_over_300_lines():
    sizes = {p.relative_to(SRC): len(p.read_text().splitlines()) for p in SRC.rglob("*.py")}
    assert len(sizes) > 20
    assert {p: n for p, n in sizes.items() if n > 300} == {}


def test_readme_stands_on_its_own():
    text = (REPO / "README.md").read_text()
    assert "ENVIRONMENT.md" not in text and "shared/" not in text


@pytest.mark.slow
def test_a_wheel_ships_the_configs_and_finds_them(tmp_path):
    # built from a copy: setuptools leaves a build/ folder beside the sources
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("conf", "src"):
        shutil.copytree(REPO / name, source / name, symlinks=True, ignore=skip)
    run_process(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(source)],
        check=True,
    )  # fmt: skip
    wheel = next((tmp_path / "dist").glob("experiments-*.whl"))
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("experiments/conf/")}
    on_disk = {
        "experiments/conf/" + str(p.relative_to(REPO / "conf"))
        for p in (REPO / "conf").rglob("*.yaml")
    }
    assert on_disk and shipped == on_disk
    # installed elsewhere, away from the checkout: it composes from its own copy
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    code = (
        "from experiments.config import CONF_DIR\n"
        "from hydra import compose, initialize_config_dir\n"
        "with initialize_config_dir(config_dir=str(CONF_DIR), version_base='1.3'):\n"
        "    cfg = compose('train', overrides=['model=cnn'])\n"
        "print(CONF_DIR, cfg.model.net._target_)"
    )
    out = run_process(
        [sys.executable, "-c", code], cwd=tmp_path, check=True,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    conf_dir, target_name = out.stdout.split()
    assert Path(conf_dir).is_relative_to(target) and target_name == "experiments.models.CNN"


@pytest.mark.slow
def test_a_run_dir_made_before_the_layout_move_still_evaluates(tmp_path, data_dir):
    # saved with the old module paths (experiments.csv_logger.CSVLogger, ...)
    run = tmp_path / "old_run"
    shutil.copytree(REPO / "tests" / "data" / "run_before_layout_move", run)
    assert "experiments.csv_logger.CSVLogger" in (run / ".hydra" / "config.yaml").read_text()
    res = run_process(
        [sys.executable, "-m", "experiments.eval", f"run_dir={run}", f"paths.data_dir={data_dir}",
         "data.num_workers=0"],
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    then = json.loads((run / "metrics.json").read_text())["test/acc"]
    now = json.loads((run / "eval_metrics.json").read_text())["test/acc"]
    assert now == then
    # and the old targets still resolve in a config that builds them
    from experiments.csv_logger import CSVLogger
    from experiments.sweep import SweepSummary
    from experiments.tracking import wandb_logger
    from experiments.tracking.csv import CSVLogger as current

    assert CSVLogger is current
    assert SweepSummary.__module__ == "experiments.tracking.sweep_summary"
    assert callable(wandb_logger)
