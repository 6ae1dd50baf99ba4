"""Nested config containers as dotted keys, as they are written on the command line."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any


def dotted_leaves(
    node: Mapping, skip: Callable[[str, str, Any], bool] | None = None, prefix: str = ""
) -> Iterator[tuple[str, Any]]:
    """``("optimizer.lr", 0.1)`` for every leaf of ``node``: a value that is not a
    non-empty mapping (a list is one value). ``skip(dotted, key, value)`` returning True
    leaves that entry out, a whole section when the value is a mapping."""
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        if skip is not None and skip(dotted, str(key), value):
            continue
        if isinstance(value, Mapping) and value:
            yield from dotted_leaves(value, skip, f"{dotted}.")
        else:
            yield dotted, value
