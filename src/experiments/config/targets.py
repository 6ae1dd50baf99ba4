"""``_target_`` checks: the object exists and takes every key its config gives it.

Config keys are bound to the constructor's signature (as torchtune binds its configs): an
unknown key such as ``+trainer.nosuch=1`` is one line with "did you mean", before anything
is built. ``check_targets`` reads module sources with ``ast`` (no import, so it runs
before torch is loaded); ``check_signatures`` imports the targets and covers what source
alone cannot tell (inherited constructors, compiled modules).
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

from experiments.errors import UserError

# keys Hydra's instantiate reads itself, and our switch for callbacks (see build.callbacks)
HYDRA_KEYS = frozenset({"_target_", "_partial_", "_recursive_", "_convert_", "_args_", "enabled"})


def walk_targets(node: Any, key: str = ""):
    """Yield ``(dotted key, target, mapping)`` for every plain mapping with a ``_target_``."""
    if isinstance(node, dict):
        if "_target_" in node:
            yield key or "<root>", node["_target_"], node
        for k, v in node.items():
            yield from walk_targets(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk_targets(v, f"{key}.{i}" if key else str(i))


def check_targets(plain: dict) -> None:
    """Every ``_target_`` names an existing object that accepts its keys (from source).

    Raises:
        UserError: naming the key, the target and the closest valid name.
    """
    for key, target, node in walk_targets(plain):
        if not isinstance(target, str) or "${" in target:
            continue
        problem = _target_problem(target)
        if problem:
            raise UserError(f"{key}._target_={target!r}: {problem}")
        params = _static_params(target)
        if params is not None:
            _check_keys(key, target, node, *params)


def check_signatures(plain: dict) -> None:
    """``check_targets``' key check with the imported objects' real signatures."""
    import inspect

    from hydra.utils import get_object

    for key, target, node in walk_targets(plain):
        if not isinstance(target, str) or "${" in target:
            continue
        try:
            obj = get_object(target)
            sig = inspect.signature(obj)
        except Exception:  # not importable here, or no signature: instantiate will say
            continue
        kinds = {p.kind for p in sig.parameters.values()}
        names = {
            n for n, p in sig.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        }
        _check_keys(key, target, node, names, inspect.Parameter.VAR_KEYWORD in kinds)


def _check_keys(key: str, target: str, node: dict, params: set[str], any_key: bool) -> None:
    if any_key:
        return
    for name in node:
        if name in HYDRA_KEYS or name in params:
            continue
        close = difflib.get_close_matches(str(name), sorted(params), n=1)
        if close:
            hint = f"did you mean {key}.{close[0]}?"
        else:
            names = sorted(params)
            more = f", ... ({len(names)} in all)" if len(names) > 12 else ""
            hint = f"it takes {', '.join(names[:12])}{more}"
        raise UserError(f"{key}.{name}: {target} has no argument '{name}'; {hint}")


# -- reading sources ---------------------------------------------------------------------


@cache
def _target_problem(target: str) -> str | None:
    parts = target.split(".")
    spec = _find_spec(parts[0]) if parts[0] else None
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


def _find_spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
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


def _module_file(module: str) -> str | None:
    """The source file of a dotted module name, found without importing it."""
    parts = module.split(".")
    spec = _find_spec(parts[0])
    if spec is None:
        return None
    file, locations = spec.origin, list(spec.submodule_search_locations or [])
    for part in parts[1:]:
        found = _find_submodule(locations, part)
        if found is None:
            return None
        file, locations = found
    return file


@cache
def _parse(module_file: str | None) -> ast.Module | None:
    if not module_file or not module_file.endswith(".py"):
        return None
    try:
        return ast.parse(Path(module_file).read_text())
    except (OSError, SyntaxError, ValueError):
        return None


def _defined_names(module_file: str | None) -> set[str] | None:
    """Top-level names a module's source binds; None when that cannot be told statically."""
    tree = _parse(module_file)
    if tree is None:
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


@cache
def _static_params(target: str) -> tuple[set[str], bool] | None:
    """``(argument names, takes **kwargs)`` of a target's constructor or function, read from
    source; None when source cannot tell (inherited ``__init__``, compiled, re-assigned)."""
    module, _, name = target.rpartition(".")
    return _params_in(module, name, depth=0)


def _params_in(module: str, name: str, depth: int) -> tuple[set[str], bool] | None:
    if depth > 4 or not module:
        return None
    file = _module_file(module)
    tree = _parse(file)
    if tree is None:
        return None
    package = module if file and file.endswith("__init__.py") else module.rpartition(".")[0]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return _arguments(node, skip_self=False)
        if isinstance(node, ast.ClassDef) and node.name == name:
            init = next(
                (n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
                None,
            )
            return _arguments(init, skip_self=True) if init is not None else None
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    source = node.module or ""
                    if node.level:  # relative import
                        base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                        source = f"{base}.{source}" if source else base
                    return _params_in(source, alias.name, depth + 1)
    return None


def _arguments(func: ast.FunctionDef, skip_self: bool) -> tuple[set[str], bool]:
    args = func.args
    positional = args.posonlyargs + args.args
    if skip_self and positional:
        positional = positional[1:]
    names = {a.arg for a in positional + args.kwonlyargs}
    return names, args.kwarg is not None
