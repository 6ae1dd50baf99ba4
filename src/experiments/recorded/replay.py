"""A run's saved overrides (``.hydra/overrides.yaml``), read back as data.

``experiments-verify`` and ``train resume=<run>`` replay the overrides a run was started
with. That file sits in a run folder anyone could have edited, and Hydra runs code from
some overrides (``+hydra.callbacks.x._target_=...`` is built when Hydra starts), so each
entry is parsed with Hydra's own override grammar (parsing only: nothing is composed or
built) and refused, in one line naming the file, the entry and why, when it could:

- change how Hydra runs (any ``hydra`` key or package) or pass a flag (``-...``);
- build something the repo's ``conf/`` tree does not (a ``_target_`` in the key or at any
  depth of the value, a ``get_object`` path, an interpolation through a resolver that
  turns a string into config, such as ``oc.decode``);
- load a config file from outside ``conf/`` and your own config folders
  (``EXPERIMENTS_CONFIG_PATH``, the command line's ``hydra.searchpath``): a group option
  such as ``model=../../x``;
- write outside the run folder (a key whose default in ``conf/`` is under
  ``${paths.output_dir}``, or the deletion of a ``paths`` key);
- carry a secret (a secret-named key at any depth) or a control character (a newline in a
  value ends a line of ``reproduce.sh``);
- be a sweep (a saved run is one job).

Nothing here imports torch.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from experiments.errors import UserError, one_line
from experiments.recorded import CONF_DIR, CONFIG_PATH_ENV, config_dirs, shown
from experiments.recorded.allowlist import TRUSTED_ENV, is_trusted
from experiments.runs.files import parse_yaml, read_text
from experiments.runs.layout import RunDir
from experiments.runs.provenance import NOT_REPRODUCED, is_control
from experiments.runs.resume import saved_overrides
from experiments.secrets import is_secret_key

NOT_REPLAYED = tuple(o.rstrip("=") for o in NOT_REPRODUCED)  # the replaying command's own
# resolvers that only read a value; any other (oc.decode, oc.create, a new one) could turn a
# string into config holding a _target_, after this check has passed it
READ_ONLY_RESOLVERS = ("oc.env", "oc.select", "oc.dict.keys", "oc.dict.values", "hydra")
OWN_RESOLVER_PREFIX = "experiments."
GET_OBJECT = "hydra.utils.get_object"  # looks an object up by its path: the path is a target
_RESOLVER = re.compile(r"\$\{\s*([^:}\s]+)\s*:")
_ENV_NAME = re.compile(r"\$\{\s*oc\.env\s*:\s*([^,}\s]+)")


def read_overrides(path: str | Path, searchpath: Sequence[Path] = ()) -> list[str]:
    """The overrides saved in ``path``, each checked (see the module docstring), without
    those that only say where the run went (``resume=``, ``paths.output_dir=``).

    Args:
        path: the run's ``.hydra/overrides.yaml``.
        searchpath: config folders the replaying command line gives besides ``conf/`` and
            ``EXPERIMENTS_CONFIG_PATH``'s (its ``hydra.searchpath``): a group option may be
            a file of one of them.

    Raises:
        UserError: one line naming the file and, for a refused entry, the entry and why.
    """
    path = Path(path)
    roots = (CONF_DIR, *config_dirs(), *searchpath)
    kept = []
    for number, entry in enumerate(saved_overrides(path), 1):
        key = check_override(entry, f"{path}: entry {number} {shown(entry)}", roots)
        if key not in NOT_REPLAYED:
            kept.append(entry)
    return kept


def check_resumed(argv: list[str]) -> None:
    """``resume=<run>`` replays the run's saved overrides: check each entry of them
    (``read_overrides``) before Hydra starts, and before a compose reads a file one names."""
    for arg in argv:
        if not arg.lstrip("+").startswith("resume="):
            continue
        run = arg.split("=", 1)[1]
        saved = RunDir(Path(run)).saved_overrides
        if run not in ("", "auto", "null") and (saved.exists() or saved.is_symlink()):
            read_overrides(saved, searchpath_dirs(argv))


def searchpath_dirs(argv: Sequence[str]) -> list[Path]:
    """The folders of the ``file://`` entries of a ``hydra.searchpath=[...]`` argument (the
    last one, as Hydra takes it); nothing for none, or one Hydra cannot parse (Hydra says)."""
    given = [a for a in argv if a.lstrip("+").startswith("hydra.searchpath=")]
    if not given:
        return []
    try:
        value = _parser().parse_override(given[-1].lstrip("+")).value()
    except Exception:  # Hydra's own error, when it composes, is the one to show
        return []
    entries = value if isinstance(value, list) else [value]
    return [Path(str(e).removeprefix("file://")) for e in entries
            if isinstance(e, str) and not e.startswith("pkg://")]  # fmt: skip


def check_override(entry: str, where: str, roots: Sequence[Path] = (CONF_DIR,)) -> str:
    """Check one saved override; return its key (without ``+``/``++``/``~``). ``roots``:
    the config folders a group option may be a file of (``conf/`` first).

    Raises:
        UserError: ``<where>: <why> (refused before anything runs); <way out>``.
    """

    def refuse(why: str, way_out: str = "") -> UserError:
        way_out = way_out or (
            "a saved overrides file holds only the run's own key=value overrides: restore "
            "it, or start a new run"
        )
        return UserError(f"{where}: {why} (refused before anything runs); {way_out}")

    if any(is_control(c) for c in entry):
        raise refuse("it holds a control character")
    if entry.startswith("-"):
        raise refuse("a command-line flag, not an override")
    try:
        override = _parser().parse_override(entry)
    except (HydraException, ValueError, TypeError, RecursionError) as err:
        raise refuse(f"not an override Hydra can parse ({shown(one_line(err))})") from None
    except Exception as err:  # the grammar's own failure on hostile text: still data
        raise refuse(f"not an override Hydra can parse ({type(err).__name__})") from None
    key = str(override.key_or_group)
    package = override.package or ""
    segments = [s for s in re.split(r"[./@]", f"{key}@{package}") if s]
    if "hydra" in segments:
        raise refuse("a hydra key changes how Hydra runs, which a saved run never does")
    if override.is_sweep_override():
        raise refuse("a sweep of values, where a saved run has one value per key")
    if override.is_delete():
        if segments[0] == "paths":
            raise refuse("deleting a paths key changes where the run writes")
        return key
    if any(is_secret_key(s) for s in segments) or is_secret_key(key):
        raise refuse(f"{key} is a secret-named key; secrets come from the environment")
    value = override.value()
    if key.replace("/", ".") in NOT_REPLAYED:
        return key.replace("/", ".")
    if any(key in _groups(root) for root in roots):
        _check_option(key, value, refuse, roots)
        return key
    last = segments[-1] if segments else key
    if last == "_target_" or last in ("path", "_args_"):
        _check_target(key, value, refuse)
    elif last in _output_keys():
        raise refuse(f"{key} says where the run writes; the replaying command decides that")
    _check_value(value, key, refuse)
    return key


@functools.cache
def _parser():
    return OverridesParser.create()


def _check_value(value: Any, key: str, refuse) -> None:
    """Walk a parsed value at every depth (Hydra parses ``{...}`` and ``[...]``)."""
    stack = [(key, value)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                name = str(k)
                if any(is_control(c) for c in name):
                    raise refuse(f"a key inside {where} holds a control character")
                if is_secret_key(name):
                    raise refuse(f"{where}.{name} is a secret-named key")
                if name == "_target_" or (name in ("path", "_args_") and "_target_" in node):
                    _check_target(f"{where}.{name}", v, refuse)
                    continue
                if name in _output_keys():
                    raise refuse(f"{where}.{name} says where the run writes")
                stack.append((f"{where}.{name}", v))
        elif isinstance(node, list | tuple):
            stack.extend((f"{where}.{i}", v) for i, v in enumerate(node))
        elif isinstance(node, str):
            if any(is_control(c) for c in node):
                raise refuse(f"the value of {where} holds a control character")
            for name in _ENV_NAME.findall(node):
                if is_secret_key(name):
                    raise refuse(f"the value of {where} reads the secret variable {name}")
            for resolver in _RESOLVER.findall(node):
                own = resolver.startswith(OWN_RESOLVER_PREFIX)
                if not own and resolver not in READ_ONLY_RESOLVERS:
                    raise refuse(
                        f"the value of {where} calls the resolver {resolver}, which can turn "
                        f"text into config"
                    )


def _check_target(key: str, value: Any, refuse) -> None:
    values = value if isinstance(value, list) else [value]
    for target in values:
        if not isinstance(target, str) or not (target in _conf_targets() or is_trusted(target)):
            package = str(target).rsplit(".", 1)[0] if isinstance(target, str) else "<package>"
            raise refuse(
                f"{key}={shown(str(target))} is not a target the repo's conf/ builds",
                f"if it is your own code, trust its package: {TRUSTED_ENV}={package}",
            )


def _check_option(group: str, value: Any, refuse, roots: Sequence[Path] = (CONF_DIR,)) -> None:
    """A group option must be a file of that group in ``conf/`` or in one of the other
    config folders ``roots`` names (or null)."""
    way_out = (
        f"an option of your own config folder: name it with {CONFIG_PATH_ENV}=<folder> (or "
        f"hydra.searchpath=[file://<folder>]) as when the run started"
    )
    for option in value if isinstance(value, list) else [value]:
        if option is None:
            continue
        if not isinstance(option, str) or not option or option.startswith(("/", "\\")):
            raise refuse(f"{group}={shown(str(option))} is not an option of conf/{group}")
        if not any(_is_option(root, group, option) for root in roots):
            raise refuse(f"{group}={shown(option)} is not an option of conf/{group}", way_out)


def _is_option(root: Path, group: str, option: str) -> bool:
    """``<root>/<group>/<option>.yaml`` is a file inside that group's folder."""
    folder = (Path(root) / group).resolve()
    file = (folder / f"{option}.yaml").resolve()
    return file.is_relative_to(folder) and file.is_file()


@functools.cache
def _groups(conf_dir: Path = CONF_DIR) -> frozenset[str]:
    """The config groups: every folder under ``conf/`` (``model``, ``hydra/launcher``), or
    under another config folder."""
    root = Path(conf_dir).resolve()
    if not root.is_dir():
        return frozenset()
    return frozenset(str(d.relative_to(root)) for d in root.rglob("*") if d.is_dir())


@functools.cache
def _conf_targets(conf_dir: Path = CONF_DIR) -> frozenset[str]:
    """Every literal ``_target_`` in the repo's ``conf/`` tree, and the ``path`` (or
    ``_args_``) of each ``hydra.utils.get_object`` node: they ship with the code."""
    found: set[str] = set()
    for node in _conf_mappings(conf_dir):
        target = node.get("_target_")
        if isinstance(target, str):
            found.add(target)
        if target == GET_OBJECT:
            args = node.get("_args_") or []
            named = [node.get("path"), *(args if isinstance(args, list) else [args])]
            found.update(v for v in named if isinstance(v, str))
    return frozenset(t for t in found if "${" not in t)


def _conf_mappings(conf_dir: Path, skip_hydra: bool = False) -> Iterator[dict]:
    """Every mapping, at any depth, of each YAML file of ``conf/`` (a broken file is train's
    error to report)."""
    root = conf_dir.resolve()
    for file in sorted(root.rglob("*.yaml")):
        if skip_hydra and file.relative_to(root).parts[0] == "hydra":
            continue
        try:
            stack = [parse_yaml(read_text(file), str(file))]
        except UserError:
            continue
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                yield node
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)


@functools.cache
def _output_keys(conf_dir: Path = CONF_DIR) -> frozenset[str]:
    """Names of the keys whose default in ``conf/`` lies under the run folder
    (``dirpath``, ``save_dir``, ``stats_file``...): an override of one moves where the run
    writes, outside the folder the replaying command chose."""
    names = {"output_dir"}
    for node in _conf_mappings(conf_dir, skip_hydra=True):
        for k, v in node.items():
            if isinstance(v, str) and ("paths.output_dir" in v or "runtime.output_dir" in v):
                names.add(str(k))
    return frozenset(names)
