"""Constructor signatures read from source, without importing anything.

A config is checked before torch and Lightning are imported (they take seconds), so the
signature of each ``_target_`` -- its argument names, whether it takes ``**kwargs``, and
each argument's type hint as an ``ast`` expression -- is read from the module's source,
following ``from x import y`` re-exports and base classes that define ``__init__``.
Where source cannot tell (compiled modules, conditional or dynamic definitions) the
answer is None and the check is left to the constructor itself.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from experiments.config import source_cache

MAX_DEPTH = 6  # re-exports and base classes followed before giving up


@dataclass(frozen=True)
class Param:
    """One argument: its type hint (None: not annotated) and the module its names live in."""

    name: str
    annotation: ast.expr | None
    module: str
    none_default: bool = False  # `x: int = None`: an implicit Optional, as older code writes


@dataclass(frozen=True)
class Signature:
    target: str
    params: dict[str, Param]
    any_key: bool  # takes **kwargs


def signature(target: str) -> Signature | None:
    """The signature of ``target``'s constructor (or of the function), or None."""
    module, _, name = target.rpartition(".")
    key = f"signature:{target}@{_module_file(module)}"  # the same name in another tree
    cached = source_cache.get(key)
    if cached is not source_cache.MISSING:
        return _signature_from(target, cached)
    with source_cache.recording() as files:
        sig = _read_signature(target)
    source_cache.put(key, _signature_to(sig), files)
    return sig


def _signature_to(sig: Signature | None) -> Any:
    if sig is None:
        return None
    params = [
        [p.name, ast.unparse(p.annotation) if p.annotation is not None else None, p.module,
         p.none_default]
        for p in sig.params.values()
    ]  # fmt: skip
    return {"params": params, "any_key": sig.any_key}


def _signature_from(target: str, saved: Any) -> Signature | None:
    try:
        params = {
            name: Param(
                name, ast.parse(text, mode="eval").body if text else None, module, bool(none)
            )
            for name, text, module, none in saved["params"]
        }
        return Signature(target, params, bool(saved["any_key"]))
    except (TypeError, KeyError, ValueError, SyntaxError):
        return None if saved is None else _read_signature(target)


def _read_signature(target: str) -> Signature | None:
    """``target``'s signature read from its source (no cache)."""
    module, _, name = target.rpartition(".")
    found = _definition(module, name, 0)
    params = _params(*found, 0) if found is not None else None
    return Signature(target, *params) if params is not None else None


def resolve(module: str, expr: ast.expr, depth: int = 0) -> tuple[ast.AST, str] | None:
    """What a ``Name`` or ``a.b.Name`` in ``module`` is bound to: ``(definition, its module)``
    -- a ClassDef, FunctionDef, or the value of a module-level assignment (a type alias)."""
    if isinstance(expr, ast.Name):
        return _definition(module, expr.id, depth)
    if isinstance(expr, ast.Attribute):
        inner = _module_alias(module, expr.value)
        return _definition(inner, expr.attr, depth) if inner else None
    return None


# -- definitions -------------------------------------------------------------------------


@cache
def _definition(module: str, name: str, depth: int) -> tuple[ast.AST, str] | None:
    if depth > MAX_DEPTH or not module:
        return None
    file = _module_file(module)
    tree = _parse(file)
    if tree is None:
        return None
    package = module if file and file.endswith("__init__.py") else module.rpartition(".")[0]
    found = None
    for node in tree.body:  # the last binding wins, as when the module runs
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            found = (node, module)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            found = (node.value, module)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id == name and node.value is not None:
                found = (node.value, module)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    source = _absolute(node, package)
                    found = _definition(source, alias.name, depth + 1)
    return found


def _params(node: ast.AST, module: str, depth: int) -> tuple[dict[str, Param], bool] | None:
    if isinstance(node, ast.FunctionDef):
        return _arguments(node, module, skip_self=False)
    if not isinstance(node, ast.ClassDef) or depth > MAX_DEPTH:
        return None
    init = next(
        (n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None
    )
    if init is not None:
        return _arguments(init, module, skip_self=True)
    if any(_decorator_name(d) == "dataclass" for d in node.decorator_list):
        fields = {
            n.target.id: Param(n.target.id, n.annotation, module)
            for n in node.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }
        return (fields, False) if not node.bases else None
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in ("object", "Generic", "Protocol"):
            continue
        found = resolve(module, base, depth + 1)
        if found is None:
            return None  # a base we cannot read might define __init__
        params = _params(*found, depth + 1)
        if params is not None:
            return params
    return None


def _arguments(func: ast.FunctionDef, module: str, skip_self: bool):
    args = func.args
    positional = args.posonlyargs + args.args
    if skip_self and positional:
        positional = positional[1:]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    pairs = list(zip(positional, defaults, strict=True)) + list(
        zip(args.kwonlyargs, args.kw_defaults, strict=True)
    )
    params = {a.arg: Param(a.arg, a.annotation, module, _is_none(d)) for a, d in pairs}
    return params, args.kwarg is not None


def _is_none(default: ast.expr | None) -> bool:
    return isinstance(default, ast.Constant) and default.value is None


def _decorator_name(node: ast.expr) -> str:
    node = node.func if isinstance(node, ast.Call) else node
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _absolute(node: ast.ImportFrom, package: str) -> str:
    source = node.module or ""
    if node.level:  # a relative import
        base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        source = f"{base}.{source}" if source else base
    return source


def _module_alias(module: str, expr: ast.expr) -> str | None:
    """The module a name such as ``nn`` (``import torch.nn as nn``) or ``torch.nn`` stands for."""
    if isinstance(expr, ast.Attribute):
        outer = _module_alias(module, expr.value)
        return f"{outer}.{expr.attr}" if outer else None
    if not isinstance(expr, ast.Name):
        return None
    tree = _parse(_module_file(module))
    file = _module_file(module) or ""
    package = module if file.endswith("__init__.py") else module.rpartition(".")[0]
    for node in tree.body if tree else ():
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname == expr.id:
                    return alias.name
                if alias.asname is None and alias.name.split(".")[0] == expr.id:
                    return expr.id
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == expr.id:
                    return f"{_absolute(node, package)}.{alias.name}"
    return None


# -- source files ------------------------------------------------------------------------


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


@cache
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


def _parse(module_file: str | None) -> ast.Module | None:
    if module_file:
        source_cache.touched(module_file)
    return _parse_file(module_file)


@cache
def _parse_file(module_file: str | None) -> ast.Module | None:
    if not module_file or not module_file.endswith(".py"):
        return None
    try:
        return ast.parse(Path(module_file).read_text())
    except (OSError, SyntaxError, ValueError):
        return None
