"""A finished run's folder read back for ``eval`` and ``predict``: its saved config with
``key=value`` overrides applied (every ``_target_`` checked before anything is built),
and its weights-only checkpoints with their sidecars.

Nothing here imports torch or Lightning, so argument and config mistakes answer in
well under a second.
"""

from __future__ import annotations

import difflib
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from experiments.config.allowlist import check_allowed
from experiments.errors import UserError, one_line
from experiments.runs.layout import RunDir


def parse_args(argv: Sequence[str], own: dict[str, Any], usage: str) -> tuple[dict, list[str]]:
    """Split ``key=value`` arguments into the command's own options and config overrides.

    Args:
        argv: the arguments after the program name.
        own: the command's own keys and their defaults (``None`` = required).
        usage: printed for ``-h`` / ``--help`` (then exit 0).

    Returns:
        ``(options, overrides)``: ``own`` updated from ``argv``, and the rest in order.
    """
    if any(a in ("-h", "--help", "help") for a in argv):
        print(usage)
        sys.exit(0)
    options, overrides = dict(own), []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or not key.strip():
            raise UserError(f"argument {arg!r} is not key=value (see --help)")
        if key in own:
            # `run_dir=` (an unset shell variable) would otherwise mean the current folder
            options[key] = value if value or own[key] is not None else None
        else:
            overrides.append(arg)
    missing = [k for k, v in options.items() if v is None]
    if missing:
        raise UserError(f"missing {', '.join(f'{k}=<...>' for k in missing)} (see --help)")
    return options, overrides


def load_run_config(run_dir: str | Path, overrides: Sequence[str] = ()) -> DictConfig:
    """The run's saved config with ``paths.output_dir`` set to ``run_dir`` and overrides applied.

    Args:
        run_dir: a run folder, as ``python -m experiments.train`` made it.
        overrides: ``key=value`` (the key must exist in the run's config) or ``+key=value``
            (adds a key). Values are parsed like YAML / Hydra: ``128``, ``null``, ``[1,2]``.

    Raises:
        UserError: missing folder or config, unknown key, unreadable YAML, a ``_target_``
            outside the allowlist. The config is not resolved here (see ``resolved``).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run_dir not found: {run_dir}")
    path = RunDir(run_dir).saved_config
    if not path.is_file():
        raise UserError(
            f"{run_dir} is not a run folder: {path} is missing "
            f"(give the folder python -m experiments.train wrote, outputs/<task>/runs/<time>)"
        )
    try:
        cfg = OmegaConf.load(path)  # a SafeLoader: YAML tags cannot build objects
    except Exception as err:
        raise UserError(f"cannot read {path}: {one_line(err)}") from None
    if not isinstance(cfg, DictConfig):
        raise UserError(f"{path} does not hold a mapping of config keys")
    # `${hydra:runtime.output_dir}` only resolves inside a Hydra run; this is the folder it named
    if isinstance(cfg.get("paths"), DictConfig):
        cfg.paths.output_dir = str(run_dir.resolve())
    _follow_moves(cfg)
    for arg in overrides:
        _apply_override(cfg, arg, path)
    where = f"{path} with overrides" if overrides else str(path)
    check_allowed(OmegaConf.to_container(cfg, resolve=False), where=where)
    return cfg


# targets that run configs saved before the layout move name, and where they live now
MOVED = {
    "experiments.csv_logger.CSVLogger": "experiments.tracking.csv.CSVLogger",
    "experiments.sweep.SweepSummary": "experiments.tracking.sweep_summary.SweepSummary",
}


def _follow_moves(node: Any) -> None:
    if isinstance(node, DictConfig):
        target = node._get_node("_target_") if "_target_" in node else None
        if target is not None and target._value() in MOVED:
            node._target_ = MOVED[target._value()]
        for key in node.keys():
            _follow_moves(node._get_node(key))
    elif isinstance(node, ListConfig):
        for i in range(len(node)):
            _follow_moves(node._get_node(i))


def _apply_override(cfg: DictConfig, arg: str, path: Path) -> None:
    key, _, text = arg.partition("=")
    add = key.startswith("+")
    key = key.lstrip("+").strip()
    try:
        value = OmegaConf.to_container(OmegaConf.from_dotlist([f"k={text}"]))["k"]
    except Exception as err:
        raise UserError(f"override {arg!r}: cannot parse the value: {one_line(err)}") from None
    plain = OmegaConf.to_container(cfg, resolve=False)
    found, current = _lookup(plain, key.split("."))
    if not found and not add:
        hint = difflib.get_close_matches(key, list(_all_keys(plain)), n=1)
        did_you_mean = f"; did you mean {hint[0]}?" if hint else ""
        raise UserError(
            f"override {key}: no such key in the run's config ({path}){did_you_mean} "
            f"(+{key}=... adds one)"
        )
    if isinstance(current, dict) and value is not None and not isinstance(value, dict):
        raise UserError(
            f"override {key}={text}: {key} is a whole section of the run's config; "
            f"eval/predict reuse the run's choice, set its keys instead (e.g. {key}.<key>=...)"
        )
    try:
        OmegaConf.update(cfg, key, value, merge=False, force_add=add)
    except OmegaConfBaseException as err:
        raise UserError(f"override {arg!r}: {one_line(err)}") from None


def _lookup(node: Any, parts: list[str]) -> tuple[bool, Any]:
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def _all_keys(node: Any, prefix: str = "") -> Iterable[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{prefix}{key}"
            yield from _all_keys(value, f"{prefix}{key}.")


def resolved(cfg: DictConfig, key: str) -> Any:
    """``cfg[key]`` with interpolations resolved and its ``_target_``s checked, as a new config.

    Only the parts a command builds are resolved: the rest of a run's config may hold
    ``${hydra:...}`` values that have no meaning outside a Hydra run.
    """
    try:
        node = OmegaConf.select(cfg, key)
        plain = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    except OmegaConfBaseException as err:
        bad = getattr(err, "full_key", None) or key
        raise UserError(
            f"cannot resolve {bad} of the run's config: {one_line(err)} "
            f"(override it, e.g. {bad}=<value>)"
        ) from None
    if plain is None:
        return None
    # checked again after resolving: an interpolation can put a new value in a _target_
    check_allowed(plain, where=key, prefix=f"{key}.")
    return OmegaConf.create(plain) if isinstance(plain, dict | list) else plain


def checkpoint_path(run_dir: str | Path, ckpt: str) -> Path:
    """``best`` / ``last`` -> ``<run_dir>/checkpoints/<name>.pt``; else a file path.

    A relative file path is tried from the current folder, then from ``run_dir`` and
    ``run_dir/checkpoints``.

    Raises:
        UserError: the file does not exist (naming the path).
    """
    run_dir = Path(run_dir)
    if ckpt in ("best", "last"):
        path = run_dir / "checkpoints" / f"{ckpt}.pt"
    else:
        path = Path(ckpt)
        if not path.is_absolute() and not path.exists():
            path = next(
                (p for p in (run_dir / path, run_dir / "checkpoints" / path) if p.exists()), path
            )
    if not path.is_file():
        raise UserError(f"checkpoint not found: {path}")
    if path.suffix == ".ckpt":
        raise UserError(
            f"checkpoint {path} is a full Lightning checkpoint (for resuming); "
            f"give a weights-only .pt file: ckpt=best, ckpt=last or ckpt=<file.pt>"
        )
    return path


def read_sidecar(ckpt: Path) -> dict:
    """The ``.json`` written next to ``best.pt`` / ``last.pt``, or ``{}`` when there is none.

    Its values are only ever read as data (shapes, class names), never built.
    """
    path = ckpt.with_suffix(".json")
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {path}: {one_line(err)}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} does not hold a JSON object")
    return data
