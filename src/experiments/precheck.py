"""The command line checked before Hydra runs and before torch/lightning are imported: bad
overrides, unknown keys or options, wrong types, missing values, secrets and unknown
``_target_``s fail in about a second with one line; ``resume=`` is turned into the
original run's overrides plus its run dir."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import os
import re
from functools import cache
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from experiments.config import validate
from experiments.errors import UserError, one_line

# flags after which Hydra does something other than run the task: leave those to Hydra
PASS_THROUGH = {
    "-h",
    "--help",
    "--hydra-help",
    "--info",
    "-i",
    "--shell-completion",
    "-sc",
    "--version",
    "--experimental-rerun",
    "-cp",
    "--config-path",
    "-cn",
    "--config-name",
    "-cd",
    "--config-dir",
}
WITH_VALUE = {"--cfg", "-c", "--package", "-p"}
MULTIRUN = {"-m", "--multirun"}
SECRET_OVERRIDE = re.compile(
    r"(^|[._\-])(api[_-]?key|key|token|secret|passw(or)?d|credentials?)($|[._\-])", re.I
)


def precheck(argv: list[str], conf_dir: str, config_name: str = "train") -> list[str]:
    """Check ``argv`` (Hydra's arguments); return it, rewritten for ``resume=``.

    Raises:
        UserError: one line naming the key or option and what would be valid.
    """
    if any(a in PASS_THROUGH or a.split("=")[0] in PASS_THROUGH for a in argv):
        return argv
    flags, overrides, skip_next = [], [], False
    for arg in argv:
        if skip_next:
            flags.append(arg)
            skip_next = False
        elif arg in WITH_VALUE:
            flags.append(arg)
            skip_next = True
        elif arg.startswith("-"):
            flags.append(arg)
        else:
            overrides.append(arg)
    multirun = any(f in MULTIRUN for f in flags)

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except OverrideParseException as err:
        raise UserError(f"cannot parse override: {one_line(err)}") from None
    for override in parsed:
        key = override.get_key_element().lstrip("+~")
        if SECRET_OVERRIDE.search(key.split("/")[-1]):
            raise UserError(
                f"{key}: secrets are not accepted on the command line (they would be saved in "
                f"the run dir and trackers); put them in the environment, e.g. WANDB_API_KEY"
            )
    probe = [_first_value(o) for o in parsed]
    probe = [p for p in probe if p is not None]
    cfg = compose_or_fail(conf_dir, config_name, probe)
    resume = cfg.get("resume")
    if not resume and not multirun and requeued():
        # SLURM re-ran this job after a pre-emption (Lightning's SIGUSR1 requeue): continue
        # the run this job started instead of starting over in a new folder
        found = find_run_of_slurm_job(cfg, os.environ["SLURM_JOB_ID"])
        if found is not None:
            resume = str(found)
            overrides = [*overrides, f"resume={found}"]
    if resume:
        if multirun:
            raise UserError("resume= resumes one run; it cannot be combined with -m")
        argv = flags + _resume_overrides(cfg, str(resume), overrides)
        overrides = [a for a in argv if a not in flags]
        cfg = compose_or_fail(conf_dir, config_name, overrides)
    validate(cfg)
    check_targets(cfg)
    return argv


def compose_or_fail(conf_dir: str, config_name: str, overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    try:
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            return compose(config_name, overrides=overrides)
    except HydraException as err:
        raise UserError(_hydra_message(err)) from None
    except Exception as err:  # omegaconf errors during composition
        raise UserError(one_line(err)) from None


def _first_value(override) -> str | None:
    """One concrete override for composing: a sweep contributes its first value."""
    if not override.is_sweep_override():
        return override.input_line
    try:
        first = next(iter(override.sweep_string_iterator()))
    except Exception:  # interval(...) and other non-enumerable sweeps: checked by the sweeper
        return None
    return f"{override.get_key_element()}={first}"


def _hydra_message(err: BaseException) -> str:
    text = str(err)
    missing = re.search(r"Could not find '([^']+)'", text)
    if missing:
        group, _, option = missing.group(1).rpartition("/")
        options = re.findall(r"^\t(\S+)$", text, flags=re.M)
        valid = f"; available: {', '.join(options)}" if options else ""
        return f"{group}={option} is not an option of '{group}'{valid}"
    unknown = re.search(r"Could not override '([^']+)'", text)
    if unknown:
        key = unknown.group(1)
        return f"unknown key '{key}' (add a new key with +{key}=...; check the spelling)"
    return one_line(err)


# -- _target_ checks without importing anything ----------------------------------------


def check_targets(cfg: DictConfig) -> None:
    """Every ``_target_`` names a module that exists and a name that module defines."""
    for key, target in _targets(cfg, ""):
        problem = _target_problem(str(target))
        if problem:
            raise UserError(f"{key}._target_={target!r}: {problem}")


def _targets(node, prefix: str):
    if isinstance(node, DictConfig):
        for k in node.keys():
            child = node._get_node(k)
            path = f"{prefix}.{k}" if prefix else str(k)
            if k == "_target_":
                value = OmegaConf.select(node, "_target_", throw_on_resolution_failure=False)
                if isinstance(value, str):
                    yield prefix, value
            elif isinstance(child, DictConfig | ListConfig):
                yield from _targets(child, path)
    elif isinstance(node, ListConfig):
        for i in range(len(node)):
            child = node._get_node(i)
            if isinstance(child, DictConfig | ListConfig):
                yield from _targets(child, f"{prefix}[{i}]")


@cache
def _target_problem(target: str) -> str | None:
    parts = target.split(".")
    spec = importlib.util.find_spec(parts[0]) if parts[0] else None
    if spec is None:
        return f"no module named '{parts[0]}'"
    locations = list(spec.submodule_search_locations or [])
    module_file = spec.origin
    for i, part in enumerate(parts[1:], start=1):
        found = _find_submodule(locations, part)
        if found is None:
            names = _defined_names(module_file)
            if names is None or part in names:
                return None  # defined there (or cannot be told without importing)
            close = difflib.get_close_matches(part, sorted(names), n=1)
            hint = f" (did you mean {'.'.join(parts[:i] + close)}?)" if close else ""
            return f"'{'.'.join(parts[:i])}' has no '{part}'{hint}"
        module_file, locations = found
        if module_file is None:
            return None
    return None


def _find_submodule(locations: list[str], name: str):
    for loc in locations:
        package = Path(loc) / name
        if (package / "__init__.py").is_file():
            return str(package / "__init__.py"), [str(package)]
        if (Path(loc) / f"{name}.py").is_file():
            return str(Path(loc) / f"{name}.py"), []
        if list(Path(loc).glob(f"{name}.*.so")):
            return None, []  # a compiled module: its names cannot be read from source
    return None


def _defined_names(module_file: str | None) -> set[str] | None:
    """Top-level names a module's source binds; None when that cannot be told statically."""
    if not module_file or not module_file.endswith(".py"):
        return None
    try:
        tree = ast.parse(Path(module_file).read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.If | ast.Try):
            return None  # conditional definitions: do not guess
    if "__getattr__" in names:
        return None
    return names


# -- resume ----------------------------------------------------------------------------


def has_last_checkpoint(run_dir: Path) -> bool:
    """``checkpoints/last.ckpt`` (or the ``.prev`` kept beside it) exists in ``run_dir``."""
    return any((run_dir / "checkpoints").glob("last.ckpt*"))


def find_resumable(runs_dir: Path) -> Path | None:
    """The newest run under ``runs_dir`` with a checkpoint and no ``metrics.json``."""
    candidates = [
        d
        for d in runs_dir.glob("*")
        if has_last_checkpoint(d) and not (d / "metrics.json").is_file()
    ]
    return max(candidates, key=lambda d: d.stat().st_mtime, default=None)


def requeued() -> bool:
    """True in a SLURM job that SLURM has restarted (requeue after pre-emption or time-out)."""
    return (
        bool(os.environ.get("SLURM_JOB_ID"))
        and int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0
    )


def find_run_of_slurm_job(cfg: DictConfig, job_id: str) -> Path | None:
    """The unfinished run whose env.json records SLURM job ``job_id``."""
    runs = Path(str(cfg.paths.log_dir)) / str(cfg.task_name) / "runs"
    for env_file in sorted(runs.glob("*/env.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        run_dir = env_file.parent
        try:
            recorded = json.loads(env_file.read_text()).get("slurm_job_id")
        except (OSError, ValueError):
            continue
        if recorded == job_id and not (run_dir / "metrics.json").is_file():
            return run_dir
    return None


def _resume_overrides(cfg: DictConfig, resume: str, overrides: list[str]) -> list[str]:
    if resume == "auto":
        runs = Path(str(cfg.paths.log_dir)) / str(cfg.task_name) / "runs"
        run_dir = find_resumable(runs)
        if run_dir is None:
            raise UserError(f"resume=auto: no unfinished run with a checkpoint under {runs}")
    else:
        run_dir = Path(resume)
    run_dir = run_dir.resolve()
    saved = run_dir / ".hydra" / "overrides.yaml"
    if not saved.is_file():
        raise UserError(f"resume={resume}: {saved} not found (is this a run dir?)")
    if not has_last_checkpoint(run_dir):
        raise UserError(f"resume={resume}: no checkpoint in {run_dir / 'checkpoints'}")
    before = [str(o) for o in OmegaConf.load(saved)]
    drop = ("resume=", "hydra.run.dir=")
    kept = [o for o in before if not o.startswith(drop)]
    mine = [o for o in overrides if not o.startswith(drop) and o not in kept]
    _refuse_changes(mine)
    return kept + mine + [f"resume={run_dir}", f"hydra.run.dir={run_dir}"]


def _refuse_changes(mine: list[str]) -> None:
    """An override of the data or the model would not fit the checkpoint."""
    for override in mine:
        key = override.lstrip("+~").split("=")[0]
        if re.split(r"[./]", key)[0] in ("data", "model", "experiment"):
            raise UserError(
                f"resume: {key} cannot change when resuming (the checkpoint was trained with "
                f"the run's own data and model); start a new run instead"
            )
