"""The command line checked before Hydra runs and before torch/lightning are imported: bad
overrides, unknown keys or options, wrong types, missing values, secrets, unknown
``_target_``s and keys their constructors do not take fail in about a second with one
line; ``resume=`` (and a SLURM requeue) is turned into the original run's overrides plus
its run dir (``experiments.runs.resume``)."""

from __future__ import annotations

import re

from omegaconf import DictConfig, OmegaConf

from experiments.config.secrets import is_secret_key
from experiments.config.slurm import check_slurm_launcher, check_task_layout
from experiments.config.targets import check_targets
from experiments.config.validate import validate
from experiments.errors import UserError, one_line
from experiments.runs.resume import resume_overrides, resume_target

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
        if is_secret_key(key.split("/")[-1]):
            raise UserError(
                f"{key}: secrets are not accepted on the command line (they would be saved in "
                f"the run dir and trackers); put them in the environment, e.g. WANDB_API_KEY"
            )
    probe = [_first_value(o) for o in parsed]
    probe = [p for p in probe if p is not None]
    try:
        cfg = compose_or_fail(conf_dir, config_name, probe)
    except UserError:
        if not any(p.startswith("resume=") for p in probe):
            raise
        # a key the resumed run added (+key=...) exists only with the run's own overrides:
        # find the run first, then check everything composed with them (below)
        where = ("resume=", "paths.", "task_name=")
        cfg = compose_or_fail(conf_dir, config_name, [p for p in probe if p.startswith(where)])
    resume = resume_target(cfg, multirun)
    if resume:
        if multirun:
            raise UserError("resume= resumes one run; it cannot be combined with -m")
        argv = flags + resume_overrides(cfg, resume, overrides)
        overrides = [a for a in argv if a not in flags]
        cfg = compose_or_fail(conf_dir, config_name, overrides)
    validate(cfg)
    check_targets(OmegaConf.to_container(cfg, resolve=False))
    check_task_layout()
    hydra_keys = ("hydra/launcher=", "hydra.launcher.", "hparams_search=", "hydra.sweeper.")
    if multirun and any(o.startswith(hydra_keys) for o in probe):
        # the launcher's and sweeper's settings live in the hydra section, composed on request
        with_hydra = compose_or_fail(conf_dir, config_name, probe, with_hydra=True)
        check_slurm_launcher(with_hydra)
        check_sweeper(with_hydra)
    return argv


def check_sweeper(cfg: DictConfig) -> None:
    """Our Optuna sweeper's settings (pruner, sampler, directions), before any trial runs."""
    target = str(OmegaConf.select(cfg, "hydra.sweeper._target_", default="") or "")
    if not target.startswith("hydra_plugins.experiments_optuna."):
        return
    from hydra_plugins.experiments_optuna.sweeper import check_settings

    try:
        check_settings(OmegaConf.to_container(cfg.hydra.sweeper, resolve=True))
    except ValueError as err:
        raise UserError(str(err)) from None


def compose_or_fail(
    conf_dir: str, config_name: str, overrides: list[str], with_hydra: bool = False
) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    try:
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            return compose(config_name, overrides=overrides, return_hydra_config=with_hydra)
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
