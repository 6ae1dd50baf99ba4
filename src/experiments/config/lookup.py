"""Whether a dotted ``_target_`` names something that exists, read from source (no
import), with a did-you-mean when it does not."""

from __future__ import annotations

import ast
import difflib
from functools import cache

from experiments.config import source_cache
from experiments.config.signatures import _find_spec, _find_submodule, _module_file, _parse


@cache
def target_problem(target: str) -> str | None:
    """Why ``target`` cannot be found (with a did-you-mean), or None when it may exist."""
    key = f"problem:{target}@{_module_file(target.split('.')[0])}"
    cached = source_cache.get(key)
    if isinstance(cached, str) or cached is None:
        return cached
    with source_cache.recording() as files:
        problem = _target_problem(target)
    if files:  # found by reading a module's source: kept while that source stays the same
        source_cache.put(key, problem, files)
    return problem


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
