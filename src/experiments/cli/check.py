"""The command line checked before Hydra runs, in one line each.

First what is cheap and exact, before torch/lightning are imported (well under a second):
bad overrides, unknown groups, options and keys (with a did-you-mean), secrets, missing
values, launcher and sweep settings; ``resume=`` (and a SLURM requeue) is turned into the
original run's overrides plus its run dir (``experiments.runs.resume``). Then, for a run
or a sweep that will start jobs, ``config.schema`` imports every ``_target_`` and binds its
keys to the real signature: a wrong type or an out-of-range value takes the import time,
and still answers before Hydra makes a run dir or any job starts."""

from __future__ import annotations

import difflib
import re
import weakref
from dataclasses import dataclass
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict

from experiments.compat.hydra import Composer, is_multirun, task_view
from experiments.config import schema
from experiments.config.ray import check_ray_launcher
from experiments.config.slurm import check_slurm_launcher, check_task_layout
from experiments.config.sweep_settings import check_settings
from experiments.console import process_rank
from experiments.errors import UserError, one_line
from experiments.recorded.replay import check_resumed
from experiments.runs.files import check_writable
from experiments.runs.resume import resume_overrides, resume_target
from experiments.runs.sweep import claim, manifest
from experiments.secrets import check_args

# flags after which Hydra does something other than run the task: leave those to Hydra
PASS_THROUGH = {
    "-h", "--help", "--hydra-help", "--info", "-i", "--shell-completion", "-sc", "--version",
    "--experimental-rerun", "-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir",
}  # fmt: skip
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


def runs_task(argv: list[str]) -> bool:
    """Whether Hydra will run the task on ``argv``: not for its own flags (``--cfg job``,
    ``--info``, ...), which print and exit."""
    return all(a in MULTIRUN for a in argv if a.startswith("-"))


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
    flags, overrides, value_next = [], [], False
    for arg in argv:
        if value_next or arg.startswith("-"):
            flags.append(arg)
            value_next = not value_next and arg in WITH_VALUE
        else:
            overrides.append(arg)
    multirun = any(f in MULTIRUN for f in flags)
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
    probe = [p for p in map(_first_value, parsed) if p is not None]
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
        argv = flags + resume_overrides(cfg, resume, overrides)  # read as data, nothing run
        # what each saved entry may do, for the run found (explicit, resume=auto or a SLURM
        # requeue's), before anything composes them
        check_resumed(argv)
        check_args(argv, "in the resumed run's overrides")  # read from a file we were handed
        overrides = [a for a in argv if a not in flags]
        full = compose_or_fail(composer, overrides)
        cfg = task_view(full)
    check_option_keys(composer, full, overrides)
    _check_data_dir(cfg)
    check_task_layout()
    sweeper = str(OmegaConf.select(full, "hydra.sweeper._target_", default="") or "")
    hydra_keys = ("hydra/launcher=", "hydra.launcher.", "hparams_search=", "hydra.sweeper.")
    if multirun and any(o.startswith(hydra_keys) for o in probe):
        # the launcher's and sweeper's settings live in the hydra section
        check_slurm_launcher(full)
        if sweeper.startswith("hydra_plugins.experiments_optuna."):  # before any trial runs
            check_settings(OmegaConf.to_container(full.hydra.sweeper, resolve=True))
    sweeps = [o.input_line for o in parsed if o.is_sweep_override()]
    runs = set(flags) <= MULTIRUN  # no --cfg, --info, ...: jobs will run
    if multirun or is_multirun(full):
        _check_sweep_params(full)
        if runs:  # the first job's config, bound before any job starts (each job binds its own)
            schema.check(cfg)
        if runs and process_rank() == 0:  # a sweep that will run jobs
            check_ray_launcher(full)  # connects once: the launcher uses the connection
            argv = claim_sweep_dir(composer, full, argv, parsed, sweeper)
        return Checked(argv)
    if sweeps:
        key = sweeps[0].split("=")[0]
        raise UserError(
            f"{sweeps[0]}: a sweep runs with -m (one job per value); for one run with a list "
            f"write {key}=[...], with a string containing commas quote it"
        )
    if flags:  # --cfg, --info, ...: Hydra's own; nothing is built
        return Checked(argv)
    schema.check(cfg)  # imports the targets: the cheap checks above answered without torch
    if process_rank() == 0:  # (the run_stamp resolver caches: Hydra runs in this same dir)
        check_writable(str(full.hydra.run.dir), "hydra.run.dir")
    return Checked(argv, full, composer)  # Hydra would compose this same config to run it


def claim_sweep_dir(
    composer: Composer, full: DictConfig, argv: list[str], parsed, sweeper: str
) -> list[str]:
    """Take the sweep dir for this sweep (``experiments.runs.sweep.claim``; ``sweeper``: the
    sweeper's ``_target_``); return ``argv`` with the dir pinned (``hydra.sweep.dir`` holds
    the start time: Hydra would resolve it again a moment later)."""
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
    shared = task_view(base)
    with open_dict(shared):
        for key in ("sweep", "print_config"):  # how the sweep runs, not what its jobs compute
            shared.pop(key, None)
    mine = manifest(given, sweeps, params, OmegaConf.to_yaml(shared), sweeper)
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
    try:
        data_dir = OmegaConf.select(cfg, "paths.data_dir", default=None)
    except Exception:  # resolved later, where it is used
        return
    if data_dir is not None and Path(str(data_dir)).exists() and not Path(data_dir).is_dir():
        raise UserError(
            f"paths.data_dir={data_dir} is a file, not a folder; point it at the folder that "
            f"holds (or will hold) the data sets"
        )


def compose_or_fail(composer: Composer, overrides: list[str]) -> DictConfig:
    """The whole config (``hydra`` node included); a composition error as one line."""
    try:
        return composer.compose(overrides)
    except HydraException as err:
        text = str(err)
        missing = re.search(r"Could not find '([^']+)'", text)
        unknown = re.search(r"Could not override '([^']+)'", text)
        if missing:
            group, _, option = missing.group(1).rpartition("/")
            options = [
                o for o in re.findall(r"^\t(\S+)$", text, flags=re.M) if not o.startswith("_")
            ]
            valid = f"; available: {', '.join(options)}" if options else ""
            message = f"{group}={option} is not an option of '{group}'{valid}"
        elif unknown:
            message = _unknown_key(composer, overrides, unknown.group(1))
        else:
            message = one_line(err)
        raise UserError(message) from None
    except Exception as err:  # omegaconf errors during composition
        raise UserError(one_line(err)) from None


def check_option_keys(composer: Composer, full: DictConfig, overrides: list[str]) -> None:
    """Refuse a key added on the command line (``+data.csv_file=...``) that the chosen option
    of its config group does not use but another option has: ``data=digits`` trains on the
    bundled digits whatever ``data.csv_file`` says, so the run would silently ignore the CSV.

    Raises:
        UserError: ``data.csv_file belongs to data=image_csv, not data=digits: ...``.
    """
    for override in overrides:
        if not override.startswith("+"):
            continue
        key = override.lstrip("+").partition("=")[0]
        found = _owners(composer, full, key)
        if found is not None and found[2]:
            raise UserError(_belongs(key, *found))


def _unknown_key(composer: Composer, overrides: list[str], key: str) -> str:
    """``unknown key`` with a hint from the config composed without that override: for
    ``data.csv_file=...`` while ``data=digits`` is chosen, the option that has the key (not
    ``+data.csv_file=``, which would add a key the option ignores); else the closest key."""
    message = f"unknown key '{key}' (add a new key with +{key}=...; check the spelling)"
    rest = [o for o in overrides if not o.lstrip("+~").startswith(f"{key}=")]
    try:
        others = composer.compose(rest)
        found = _owners(composer, others, key)
        if found is None:
            return message + _did_you_mean(others, key)
    except Exception:  # another mistake: the first one is reported alone
        return message
    group, chosen, ignored, owners = found
    if ignored:
        return _belongs(key, group, chosen, ignored, owners)
    named = ", ".join(f"{group}={o}" for o in owners)
    return (
        f"unknown key '{key}': {named} {'sets' if len(owners) == 1 else 'set'} it (choose "
        f"{'it' if len(owners) == 1 else 'one'}), or add it to {group}={chosen} with +{key}=..."
    )


def _belongs(key: str, group: str, chosen: str, ignored: bool, owners: list[str]) -> str:
    named = ", ".join(f"{group}={o}" for o in owners)
    way = f"add {named}" if len(owners) == 1 else f"choose one of {named}"
    return f"{key} belongs to {named}, not {group}={chosen}, which does not use it: {way}"


def _owners(
    composer: Composer, full: DictConfig, key: str
) -> tuple[str, str, bool, list[str]] | None:
    """For ``group.name...`` that the chosen option of ``group`` lacks: the group, the chosen
    option, whether that option would ignore the key, and the other options that have it;
    None when the key is not in a config group's option or the chosen option has it.

    The chosen option ignores a key another option has when (a) there it is an object of its
    own (``logger.wandb``: a ``_target_`` the chosen option never builds), or (b) the other
    option builds another class (``data=image_csv``'s ``CsvData``, not ``data=digits``'
    ``DigitsData``): a key of that class's. Otherwise (``trainer.sync_batchnorm``:
    Lightning's Trainer reads it whatever the option) the key is used.
    """
    group, _, rest = key.partition(".")
    if not rest or group == "hydra":
        return None
    folder = composer.conf_dir / group
    if not folder.is_dir():
        return None
    choices = OmegaConf.select(full, "hydra.runtime.choices", default=None) or {}
    chosen = choices.get(group) if hasattr(choices, "get") else None
    options = sorted(p.stem for p in folder.glob("*.yaml") if not p.stem.startswith("_"))
    if not isinstance(chosen, str) or chosen not in options or len(options) < 2:
        return None
    name = rest.split(".")[0]
    # a typo: no config file sets it (as ``name:``), so no option is composed (~0.1 s each)
    written = re.compile(rf"^\s*{re.escape(name)}\s*:", flags=re.M)
    if not any(written.search(p.read_text()) for p in composer.conf_dir.rglob("*.yaml")):
        return None
    # the chosen option as its file composes (``full`` holds the added key already)
    node = _option_node(composer, group, chosen)
    if node is None or name in node:
        return None
    owners, ignored = [], False
    for option in options:
        other = _option_node(composer, group, option) if option != chosen else None
        if other is None or name not in other:
            continue
        owners.append(option)
        own_object = isinstance(other[name], dict) and "_target_" in other[name]
        ignored = ignored or own_object or other.get("_target_") != node.get("_target_")
    return (group, chosen, ignored, owners) if owners else None


# per composer (a conf dir): each option's node, composed once (~0.2 s each)
_OPTION_NODES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _option_node(composer: Composer, group: str, option: str) -> dict | None:
    """``group``'s node as ``group=option`` composes it (its defaults included), as plain
    data; None when it does not compose on its own."""
    nodes = _OPTION_NODES.setdefault(composer, {})
    if (group, option) not in nodes:
        try:
            node = OmegaConf.select(composer.compose([f"{group}={option}"]), group)
            # unresolved: ${...} stays text, ??? stays a key (``in`` skips a missing value)
            node = OmegaConf.to_container(node, resolve=False) if OmegaConf.is_dict(node) else None
        except Exception:  # an option that needs other choices: not a candidate
            node = None
        nodes[group, option] = node
    return nodes[group, option]


def _did_you_mean(others: DictConfig, key: str) -> str:
    """``; did you mean trainer.max_epochs?`` for an unknown ``trainer.max_epoch``: the
    closest key of the same section of ``others`` (composed without the offending override)."""
    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(others, parent) if parent else None
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
