"""The layout keeps its promises: the pre-Hydra layer imports no torch, modules stay
small, the configs ship inside the package, and old run dirs still evaluate."""

from __future__ import annotations

import ast
import json
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO, run_process

SRC = REPO / "src" / "experiments"
# what runs before Hydra, or for eval/predict before anything is built
TORCH_FREE = (
    "experiments.cli.commands",
    "experiments.cli.lab_notebook",
    "experiments.cli.check",
    "experiments.config.schema",
    "experiments.config.hints",
    "experiments.config.sweep_settings",
    "experiments.secrets",
    "experiments.recorded.allowlist",
    "experiments.runs.layout",
    "experiments.runs.resume",
    "experiments.runs.lock",
    "experiments.recorded.folder",
    "experiments.recorded.replay",
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
    # read as their new homes, so no module is kept at the old paths
    from experiments.recorded.folder import load_run_config

    logger = load_run_config(run).logger.csv._target_
    assert logger == "experiments.tracking.csv.CSVLogger"


# docs/architecture.md, "The layers": a module may import its own layer and those below
LAYERS = {
    "train": 1, "eval": 1, "predict": 1, "compare": 1, "calibrate": 1, "export": 1,
    "verify": 1, "__init__": 1, "__main__": 1, "cli": 1,
    "evaluation": 2,
    "training": 3,
    "callbacks": 4, "tracking": 4, "analysis": 4,
    "data": 5, "models": 5,
    "config": 6,
    "recorded": 7,
    "runs": 8,
    "compat": 9, "errors": 9, "secrets": 9, "console": 9,
}  # fmt: skip


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] == "hydra_plugins":
        return 2
    if parts[0] != "experiments":
        return None
    return LAYERS[parts[1]] if len(parts) > 1 else 1


def _imports(path: Path):
    """``(line, imported module or module.name)`` for every import of ``path``, anywhere."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield from ((node.lineno, f"{node.module}.{a.name}") for a in node.names)


def _modules():
    for path in sorted((REPO / "src").rglob("*.py")):
        parts = path.relative_to(REPO / "src").with_suffix("").parts
        yield path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_imports_point_one_way_down_the_layers():
    wrong = []
    for path, module in _modules():
        mine = _layer(module)
        for line, name in _imports(path):
            theirs = _layer(name)
            if mine is None or theirs is None:
                continue
            package = module.split(".")[:2]
            if theirs < mine or (package == ["experiments", "models"] and ".data" in name):
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not wrong, "imports pointing back up the layers:\n" + "\n".join(wrong)
    assert set(LAYERS) >= {p.stem if p.is_file() else p.name for p in SRC.iterdir()} - {
        "__pycache__",
        "conf",
        "py",
    }  # a new package or top-level module gets a layer


def test_no_private_name_is_used_across_packages():
    wrong = []
    for path, module in _modules():
        for line, name in _imports(path):
            owner, _, last = name.rpartition(".")
            if not name.startswith("experiments.") or not last.startswith("_"):
                continue
            if last.startswith("__") or owner.split(".")[:2] == module.split(".")[:2]:
                continue
            wrong.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_imports_inside_functions_are_few_and_each_says_why():
    """Imports go at the top of a module; one that waits (the cheap path before torch, an
    optional dependency, a Hydra plugin that Hydra imports at every start) says why with a
    ``# lazy: <reason>`` comment on its line or the line above."""
    found, unmarked = 0, []
    for path, _ in _modules():
        lines = path.read_text().splitlines()
        seen = set()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom) and node.lineno not in seen:
                    seen.add(node.lineno)
                    found += 1
                    here = lines[node.lineno - 1] + lines[node.lineno - 2]
                    if "lazy:" not in here:
                        unmarked.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not unmarked, "imports inside functions without '# lazy: <reason>':\n" + "\n".join(
        unmarked
    )
    assert found <= 40, f"{found} imports inside functions (at most 40)"


def test_task_neutral_services_never_import_the_classifier():
    """Runs, tracking, analysis and the Hydra plugins serve any task (docs/own_task.md): none
    imports the classification module, directly or through ``experiments.models``."""
    neutral = ("experiments.runs", "experiments.tracking", "experiments.analysis",
               "hydra_plugins")  # fmt: skip
    checked, wrong = 0, []
    for path, module in _modules():
        if not module.startswith(neutral):
            continue
        checked += 1
        for line, name in _imports(path):
            if name == "experiments.models" or name.startswith("experiments.models."):
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert checked > 20 and not wrong, "\n".join(wrong)


def test_no_two_modules_share_a_name():
    """One name, one module: a reader never has to ask which ``stats.py`` (``__init__`` aside,
    and no module is named like a package)."""
    paths = [p for p in (REPO / "src").rglob("*.py") if p.name != "__init__.py"]
    names = [p.stem for p in paths] + [p.name for p in (REPO / "src").rglob("*") if p.is_dir()]
    twice = sorted({n for n in names if names.count(n) > 1} - {"__pycache__"})
    assert not twice, f"names used twice under src/: {twice}"
