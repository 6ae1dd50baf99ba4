"""A finished run's folder read back for ``eval`` and ``predict`` as data: its saved config
with ``key=value`` overrides applied and its references resolved without any resolver
(``recorded.references``), its weights-only checkpoints with their sidecars checked for type
and range, and the places a command may write. What may be built from it is decided by
``recorded.allowlist``.

Nothing here imports torch or Lightning, so argument and config mistakes answer in
well under a second.
"""

from __future__ import annotations

import datetime
import difflib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from experiments.errors import UserError, one_line
from experiments.recorded import CONF_DIR, shown
from experiments.recorded.references import ABSENT, lookup, resolve
from experiments.runs.files import read_yaml
from experiments.runs.layout import RunDir, sidecar_of
from experiments.runs.layout import read_sidecar as layout_sidecar

# an option every command that opens a saved run takes: use a run whose files differ from
# its manifest.json (one warning line per file) instead of refusing it
TRUST_MODIFIED = "trust_modified"
BOOLEANS = {"true": True, "false": False}


def boolean(key: str, value: str) -> bool:
    if value.strip().lower() not in BOOLEANS:
        raise UserError(f"{key}={value!r} is not valid: expected true or false")
    return BOOLEANS[value.strip().lower()]


def split_trust(overrides: Sequence[str]) -> tuple[bool, list[str]]:
    """``(trust_modified, the other overrides)``: the option ``cli.parse`` passed on."""
    trust, rest = False, []
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key.strip() == TRUST_MODIFIED:
            trust = boolean(TRUST_MODIFIED, value)
        else:
            rest.append(arg)
    return trust, rest


def load_run_config(run_dir: str | Path, overrides: Sequence[str] = ()) -> DictConfig:
    """The run's saved config with ``paths.output_dir`` set to ``run_dir`` and overrides applied.

    Args:
        overrides: ``key=value`` (the key must exist in the run's config) or ``+key=value``
            (adds a key). Values are parsed like YAML / Hydra: ``128``, ``null``, ``[1,2]``.

    Raises:
        UserError: missing folder or config, unknown key, unreadable or non-plain YAML (an
            alias bomb, a tag). Nothing is resolved or checked against the vocabulary
            here (see ``resolved`` and ``recorded.allowlist``).
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
    plain = _plain(read_yaml(path, kind=dict), str(path), "")
    try:
        cfg = OmegaConf.create(plain)
    except (OmegaConfBaseException, ValueError, TypeError) as err:
        raise UserError(f"{path}: {one_line(err)}") from None
    # `${hydra:runtime.output_dir}` only resolves inside a Hydra run; this is the folder it named
    if isinstance(cfg.get("paths"), DictConfig):
        cfg.paths.output_dir = str(run_dir.resolve())
        _shipped_paths(cfg.paths)
    for arg in overrides:
        _apply_override(cfg, arg, path)
    return cfg


def _shipped_paths(paths: DictConfig) -> None:
    """A ``paths`` value that is exactly what ``conf/paths/default.yaml`` ships, resolver
    and all (``root_dir: ${oc.env:EXPERIMENTS_ROOT,.}``), is resolved as that file says: it
    is our own text, not the file's, so it reads only the variable our config names. Any
    other resolver in a saved run stays refused (``references.resolve``)."""
    shipped = OmegaConf.load(CONF_DIR / "paths" / "default.yaml")  # ours, in the package
    ours = OmegaConf.to_container(shipped, resolve=False)
    saved = OmegaConf.to_container(paths, resolve=False)
    for key, value in saved.items():
        if isinstance(value, str) and value == ours.get(key) and "${oc.env:" in value:
            paths[key] = OmegaConf.select(shipped, key)  # resolves the shipped text only


def _plain(node: Any, where: str, key: str) -> Any:
    """The YAML as plain data: string keys; str, int, float, bool, None, lists, mappings
    (a date a hand edit left unquoted is its text, as OmegaConf would read it); a ``MOVED``
    target renamed."""
    if isinstance(node, dict):
        bad = next((k for k in node if not isinstance(k, str)), None)
        if bad is not None:
            raise UserError(f"{where}: {key or '<root>'} has a key {bad!r} that is not a string")
        plain = {k: _plain(v, where, f"{key}.{k}" if key else k) for k, v in node.items()}
        target = plain.get("_target_")
        if isinstance(target, str) and target in MOVED:
            plain["_target_"] = MOVED[target]
        return plain
    if isinstance(node, list):
        return [_plain(v, where, f"{key}.{i}") for i, v in enumerate(node)]
    if isinstance(node, datetime.date):
        return node.isoformat()
    if not isinstance(node, str | int | float | bool | type(None)):
        raise UserError(f"{where}: {key} holds a {type(node).__name__}, not plain data (refused)")
    return node


# targets that run configs saved before the layout move name, and where they live now
MOVED = {
    "experiments.csv_logger.CSVLogger": "experiments.tracking.csv.CSVLogger",
    "experiments.sweep.SweepSummary": "experiments.tracking.sweep_summary.SweepSummary",
}


def _apply_override(cfg: DictConfig, arg: str, path: Path) -> None:
    key, _, text = arg.partition("=")
    add = key.startswith("+")
    key = key.lstrip("+").strip()
    try:
        value = OmegaConf.to_container(OmegaConf.from_dotlist([f"k={text}"]))["k"]
    except Exception as err:
        raise UserError(f"override {arg!r}: cannot parse the value: {one_line(err)}") from None
    plain = OmegaConf.to_container(cfg, resolve=False)
    current = lookup(plain, key.split("."))
    if current is ABSENT and not add:
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


def _all_keys(node: Any, prefix: str = "") -> Iterable[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{prefix}{key}"
            yield from _all_keys(value, f"{prefix}{key}.")


def resolved(cfg: DictConfig, key: str) -> Any:
    """``cfg[key]`` as plain data with its references (``${a.b}``) resolved (never a
    resolver: ``references.resolve``), or None. Only the parts a command builds are resolved:
    the rest may hold ``${hydra:...}`` values that have no meaning outside a Hydra run."""
    return resolve(OmegaConf.to_container(cfg, resolve=False), key, "the run's config")


def resolved_keys(cfg: DictConfig, section: str, keys: Iterable[str]) -> dict[str, Any]:
    """Those of ``keys`` that ``cfg[section]`` sets, each ``resolved``; the rest of the
    section is never read."""
    saved = OmegaConf.to_container(cfg, resolve=False).get(section)
    saved = saved if isinstance(saved, dict) else {}
    return {k: resolved(cfg, f"{section}.{k}") for k in keys if k in saved}


def checkpoint_path(run_dir: str | Path, ckpt: str) -> Path:
    """``best`` / ``last`` -> the run's weights (``RunDir.weights``); else a file path, a
    relative one tried from the current folder, then from ``run_dir`` and its checkpoints.

    Raises:
        UserError: the file does not exist, or is a full ``.ckpt`` (naming the path).
    """
    run = RunDir(run_dir)
    if ckpt in ("best", "last"):
        path = run.weights(ckpt)
    else:
        path = Path(ckpt)
        if not path.is_absolute() and not path.exists():
            path = next((p for p in (run.path / path, run.checkpoints / path) if p.exists()), path)
    if not path.is_file():
        raise UserError(f"checkpoint not found: {path}")
    if path.suffix == ".ckpt":
        raise UserError(
            f"checkpoint {path} is a full Lightning checkpoint (for resuming); "
            f"give a weights-only file: ckpt=best, ckpt=last or ckpt=<file.safetensors|.pt>"
        )
    return path


# a sample larger than this (elements) is not an image a run here trained on: 4x4096x4096
MAX_SAMPLE = 4 * 4096 * 4096
MAX_CLASSES = 100_000


def read_sidecar(ckpt: Path) -> dict:
    """The ``.json`` written next to a run's weights (``best.json`` beside
    ``best.safetensors``), or ``{}`` when there is none.

    Its values are only ever read as data: the fields training reads are type-checked by
    ``runs.layout.read_sidecar`` (the one reader of sidecars), and those a saved run uses
    are range-checked here: ``in_shape`` (``[C, H, W]``, at most ``MAX_SAMPLE`` elements),
    ``class_names`` (at most ``MAX_CLASSES`` names) and ``epoch``. Its ``net`` is never built.

    Raises:
        UserError: a corrupt file or a value out of type or range, naming the file.
    """
    path = sidecar_of(ckpt)
    data = layout_sidecar(path)  # below, [] is data that knows none (a task of your own)
    data = {k: v for k, v in data.items() if not (k in ("in_shape", "class_names") and v == [])}
    if "in_shape" in data:
        shape = data["in_shape"]
        ok = isinstance(shape, list) and len(shape) == 3 and all(_count(v) for v in shape)
        if not ok or shape[0] > 4 or shape[0] * shape[1] * shape[2] > MAX_SAMPLE:
            raise UserError(
                f"{path}: in_shape={shown(shape, 60)} is not valid: expected [C, H, W], C 1-4 and "
                f"at most {MAX_SAMPLE} values; restore the file, or delete it to read the "
                f"shape from the run's data"
            )
    if "class_names" in data:
        names = data["class_names"]
        ok = isinstance(names, list) and 0 < len(names) <= MAX_CLASSES
        if not ok or not all(isinstance(n, str | int) and len(str(n)) <= 1000 for n in names):
            raise UserError(
                f"{path}: class_names={shown(names, 60)} is not valid: expected a list of 1 to "
                f"{MAX_CLASSES} names; restore the file, or delete it to read them from the data"
            )
    for key in ("epoch", "epoch_base"):
        if key in data and not _count(data[key], low=0):
            raise UserError(f"{path}: {key}={shown(data[key], 60)} is not a whole number >= 0")
    return data


def _count(value: Any, low: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= 2**31


# the headers of an earlier predictions CSV, per task: classification, regression, segmentation
PREDICTIONS_HEADERS = ("file,predicted,probability", "row,predicted", "file,mask,classes")


def check_output(output: Path, run_dir: Path) -> Path:
    """``output`` if a command may write its CSV there: anywhere outside the run folder; in
    it, only a new file or an earlier predictions CSV -- never a checkpoint, a sidecar,
    ``metrics.json``, the saved config or any other file of the run.

    Raises:
        UserError: naming the path and why, with a way out.
    """
    target = output.resolve()
    if target.is_dir():
        raise UserError(f"output={output} is a folder; give a file name, e.g. {output}/pred.csv")
    if not target.is_relative_to(run_dir.resolve()) or not target.exists():
        return output
    try:
        with open(target, encoding="utf-8", errors="replace") as f:
            first = f.readline().strip()
    except OSError:
        first = ""
    if first not in PREDICTIONS_HEADERS:
        raise UserError(
            f"output={output} would replace {target.name}, a file of the run {run_dir}; "
            f"give a new file name (the default is {RunDir(run_dir).predictions})"
        )
    return output
