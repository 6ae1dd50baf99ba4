"""The command line checked before Hydra runs and before torch/lightning are imported: bad
overrides, unknown keys or options, wrong types, missing values, secrets, unknown
``_target_``s and keys their constructors do not take fail in about a second with one
line; ``resume=`` (and a SLURM requeue) is turned into the original run's overrides plus
its run dir (``experiments.runs.resume``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf, open_dict

from experiments.compat.hydra import Composer, is_multirun, task_view
from experiments.config import schema
from experiments.config.ray import check_ray_launcher
from experiments.config.replay import check_resumed
from experiments.config.slurm import check_slurm_launcher, check_task_layout
from experiments.errors import UserError, one_line
from experiments.runs.files import check_writable
from experiments.runs.resume import resume_overrides, resume_target
from experiments.secrets import check_args
from experiments.utils import process_rank

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


@dataclass
class Checked:
    """``argv``: Hydra's arguments, rewritten for ``resume=``. ``run_cfg``: for a plain single
    run, the whole config (``hydra`` node included) already composed from ``argv``, and the
    ``composer`` that composed it (``experiments.compat.hydra.run_composed``); else None."""

    argv: list[str]
    run_cfg: DictConfig | None = None
    composer: Composer | None = None


def precheck(argv: list[str], conf_dir: str, config_name: str = "train") -> list[str]:
    """Check ``argv`` (Hydra's arguments); return it, rewritten for ``resume=``.

    Raises:
        UserError: one line naming the key or option and what would be valid.
    """
    return check(argv, conf_dir, config_name).argv


def check(argv: list[str], conf_dir: str, config_name: str = "train") -> Checked:
    """``precheck``, keeping the composed config when it is the one a single run would use."""
    check_args(argv)  # first, on every argument: no flag lets a secret through
    if any(a in PASS_THROUGH or a.split("=")[0] in PASS_THROUGH for a in argv):
        return Checked(argv)
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

    for before, arg in zip([None, *overrides], overrides, strict=False):
        if "=" not in arg and not arg.startswith("~"):
            hint = "overrides are key=value"
            if before is not None and "=" in before:
                hint = (
                    f"if it belongs to {before!r} (a value with a space), quote the value: "
                    f"{before.split('=', 1)[0]}='{before.split('=', 1)[1]} {arg}'"
                )
            raise UserError(f"cannot parse override {arg!r}: {hint}")
    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except OverrideParseException as err:
        hint = ""
        if any("=~" in o for o in overrides):
            hint = "; quote a value that starts with ~ (a home-folder path): key='~/file'"
        elif any(c in o.partition("=")[2] for o in overrides for c in "<>"):
            hint = "; quote a value with < or > for Hydra: \"sweep.target='val/acc>=0.99'\""
        raise UserError(f"cannot parse override: {one_line(err)}{hint}") from None
    probe = [_first_value(o) for o in parsed]
    probe = [p for p in probe if p is not None]
    composer = Composer(conf_dir, config_name)
    try:
        full = compose_or_fail(composer, probe)
    except UserError:
        if not any(p.startswith("resume=") for p in probe):
            raise
        # a key the resumed run added (+key=...) exists only with the run's own overrides:
        # find the run first, then check everything composed with them (below)
        where = ("resume=", "paths.", "task_name=")
        full = compose_or_fail(composer, [p for p in probe if p.startswith(where)])
    cfg = task_view(full)
    resume = resume_target(cfg, multirun)
    if resume:
        if multirun:
            raise UserError("resume= resumes one run; it cannot be combined with -m")
        check_resumed([f"resume={resume}"])  # the run's saved overrides are data: checked first
        argv = flags + resume_overrides(cfg, resume, overrides)
        check_args(argv, "in the resumed run's overrides")  # read from a file we were handed
        overrides = [a for a in argv if a not in flags]
        full = compose_or_fail(composer, overrides)
        cfg = task_view(full)
    schema.check(cfg)
    _check_data_dir(cfg)
    check_task_layout()
    hydra_keys = ("hydra/launcher=", "hydra.launcher.", "hparams_search=", "hydra.sweeper.")
    if multirun and any(o.startswith(hydra_keys) for o in probe):
        # the launcher's and sweeper's settings live in the hydra section
        check_slurm_launcher(full)
        check_sweeper(full)
    sweeps = [o.input_line for o in parsed if o.is_sweep_override()]
    if multirun or is_multirun(full):
        _check_sweep_params(full)
        if set(flags) <= MULTIRUN and process_rank() == 0:  # a sweep that will run jobs
            check_ray_launcher(full)  # connects once: the launcher uses the connection
            argv = claim_sweep_dir(composer, full, argv, parsed)
        return Checked(argv)
    if sweeps:
        key = sweeps[0].split("=")[0]
        raise UserError(
            f"{sweeps[0]}: a sweep runs with -m (one job per value); for one run with a list "
            f"write {key}=[...], with a string containing commas quote it"
        )
    if flags:  # --cfg, --info, ...: Hydra's own
        return Checked(argv)
    if process_rank() == 0:  # (the run_stamp resolver caches: Hydra runs in this same dir)
        check_writable(str(full.hydra.run.dir), "hydra.run.dir")
    return Checked(argv, full, composer)  # Hydra would compose this same config to run it


def claim_sweep_dir(composer: Composer, full: DictConfig, argv: list[str], parsed) -> list[str]:
    """Take the sweep dir for this sweep (``experiments.runs.sweep.claim``); return ``argv``
    with the dir pinned (``hydra.sweep.dir`` holds the start time: Hydra would resolve it
    again a moment later)."""
    from pathlib import Path

    from experiments.runs.sweep import claim, manifest

    try:
        sweep_dir = Path(str(OmegaConf.select(full, "hydra.sweep.dir")))
    except Exception:  # an interpolation only Hydra can resolve: leave the dir to it
        return argv
    given = [o.input_line for o in parsed]
    if not any(o.startswith("hydra.sweep.dir=") for o in given):
        argv = [*argv, f"hydra.sweep.dir='{sweep_dir.resolve()}'"]
    sweeps = {o.input_line for o in parsed if o.is_sweep_override()}
    try:  # the config without the swept values: what every job shares
        base = compose_or_fail(composer, [o for o in given if o not in sweeps])
    except UserError:
        base = full
    params = OmegaConf.select(full, "hydra.sweeper.params", default=None)
    params = OmegaConf.to_container(params) if OmegaConf.is_config(params) else {}
    target = str(OmegaConf.select(full, "hydra.sweeper._target_", default="") or "")
    shared = task_view(base)
    with open_dict(shared):
        for key in ("sweep", "print_config"):  # how the sweep runs, not what its jobs compute
            shared.pop(key, None)
    mine = manifest(given, sweeps, params, OmegaConf.to_yaml(shared), target)
    force = bool(OmegaConf.select(full, "sweep.force", default=False))
    check_writable(sweep_dir, "hydra.sweep.dir")
    if claim(sweep_dir, mine, force):
        print(f"resuming the sweep in {sweep_dir}: finished jobs are kept", flush=True)
    return argv


def _check_sweep_params(full: DictConfig) -> None:
    """A sweeper's ``params`` (from an ``hparams_search`` file) become every job's overrides,
    written to its run dir and the sweep's files: the secret rule holds for them too."""
    try:
        params = OmegaConf.select(full, "hydra.sweeper.params", default=None)
    except Exception:  # an interpolation only Hydra can resolve: the sweeper reports it
        return
    if OmegaConf.is_dict(params):
        plain = OmegaConf.to_container(params, resolve=False)
        check_args([f"{k}={v}" for k, v in plain.items()], "in hydra.sweeper.params")


def _check_data_dir(cfg: DictConfig) -> None:
    from pathlib import Path

    try:
        data_dir = OmegaConf.select(cfg, "paths.data_dir", default=None)
    except Exception:  # resolved later, where it is used
        return
    if data_dir is not None and Path(str(data_dir)).exists() and not Path(data_dir).is_dir():
        raise UserError(
            f"paths.data_dir={data_dir} is a file, not a folder; point it at the folder that "
            f"holds (or will hold) the data sets"
        )


def check_sweeper(cfg: DictConfig) -> None:
    """Our Optuna sweeper's settings (pruner, sampler, directions), before any trial runs."""
    target = str(OmegaConf.select(cfg, "hydra.sweeper._target_", default="") or "")
    if not target.startswith("hydra_plugins.experiments_optuna."):
        return
    from experiments.config.sweeper import check_settings

    try:
        check_settings(OmegaConf.to_container(cfg.hydra.sweeper, resolve=True))
    except ValueError as err:
        raise UserError(str(err)) from None


def compose_or_fail(composer: Composer, overrides: list[str]) -> DictConfig:
    """The whole config (``hydra`` node included); a composition error as one line."""
    from hydra.errors import HydraException

    try:
        return composer.compose(overrides)
    except HydraException as err:
        message = _hydra_message(err)
        unknown = re.search(r"Could not override '([^']+)'", str(err))
        if unknown:
            message += _did_you_mean(composer, overrides, unknown.group(1))
        raise UserError(message) from None
    except Exception as err:  # omegaconf errors during composition
        raise UserError(one_line(err)) from None


def _did_you_mean(composer: Composer, overrides: list[str], key: str) -> str:
    """``; did you mean trainer.max_epochs?`` for an unknown ``trainer.max_epoch``: the
    closest key of the same section, composed without the offending override."""
    import difflib

    parent, _, name = key.rpartition(".")
    rest = [o for o in overrides if not o.lstrip("+~").startswith(f"{key}=")]
    try:
        node = OmegaConf.select(composer.compose(rest), parent) if parent else None
    except Exception:  # another mistake: the first one is reported alone
        return ""
    keys = [str(k) for k in node.keys()] if OmegaConf.is_dict(node) else []
    close = difflib.get_close_matches(name, keys, n=1)
    return f"; did you mean {parent}.{close[0]}?" if close else ""


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
        options = [o for o in re.findall(r"^\t(\S+)$", text, flags=re.M) if not o.startswith("_")]
        valid = f"; available: {', '.join(options)}" if options else ""
        return f"{group}={option} is not an option of '{group}'{valid}"
    unknown = re.search(r"Could not override '([^']+)'", text)
    if unknown:
        key = unknown.group(1)
        return f"unknown key '{key}' (add a new key with +{key}=...; check the spelling)"
    return one_line(err)
