"""Interpolations of a saved run config resolved as data: ``${a.b}`` (and the relative
``${.b}``) copy another node of the same file; nothing else is evaluated.

A run's ``.hydra/config.yaml`` is a file anyone could have edited. OmegaConf's resolvers
(``${oc.env:...}``, ``${oc.decode:...}``, our own) would read the environment or run code
when a value is resolved, so a saved file gets none of them: a resolver reached from a
section a command builds is one line naming the key, and the rest of the file stays
unresolved. Results are bounded (string length, node count), so a chain of references
that doubles at every step ends in one line, not in memory exhaustion.
"""

from __future__ import annotations

import re
from typing import Any

from experiments.errors import UserError
from experiments.recorded import shown

# ${name}, ${a.b.c}, ${.sibling}, ${..uncle.x}: a node reference, nothing more
REFERENCE = re.compile(r"\.*[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*")
MAX_STRING = 64 * 1024  # a resolved string longer than this is not a path or a name
MAX_NODES = 200_000  # as runs.files.MAX_YAML_NODES
MAX_DEPTH = 64  # references followed from one another


def resolve(root: dict, key: str, where: str) -> Any:
    """The value at dotted ``key`` of the plain config ``root``, every reference in it
    replaced by the value it names (recursively), as new plain containers.

    Args:
        root: the whole config as plain data (``OmegaConf.to_container(resolve=False)``).
        key: the dotted key of the section to resolve, e.g. ``data`` or ``model.net``.
        where: the file, for messages.

    Returns:
        The resolved value, or None when ``key`` is not in ``root``.

    Raises:
        UserError: a resolver (``${oc.env:...}``), a reference to a missing key or to
            itself, a result too large; naming the key.
    """
    parts = key.split(".")
    node = lookup(root, parts)
    if node is ABSENT:
        return None
    try:
        value = _Resolver(root, where).value(node, parts, 0)
    except RecursionError:
        raise UserError(f"{where}: {key} is nested too deeply (refused)") from None
    _check_size(value, key, where)
    return value


ABSENT: Any = object()


def lookup(node: Any, parts: list[str]) -> Any:
    """The value at a dotted path (``parts``) of plain data, or ``ABSENT``."""
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return ABSENT
    return node


class _Resolver:
    def __init__(self, root: dict, where: str) -> None:
        self.root, self.where = root, where
        self.done: dict[tuple[str, ...], Any] = {}  # each referenced node resolved once
        self.active: set[tuple[str, ...]] = set()

    def value(self, node: Any, path: list[str], depth: int) -> Any:
        if isinstance(node, dict):
            return {k: self.value(v, [*path, str(k)], depth) for k, v in node.items()}
        if isinstance(node, list):
            return [self.value(v, [*path, str(i)], depth) for i, v in enumerate(node)]
        if isinstance(node, str) and "${" in node:
            return self.string(node, path, depth)
        return node

    def string(self, text: str, path: list[str], depth: int) -> Any:
        key = ".".join(path)
        pieces, i = [], 0
        while i < len(text):
            start = text.find("${", i)
            if start < 0:
                pieces.append(text[i:])
                break
            if start > 0 and text[start - 1] == "\\":  # an escaped \${: a literal ${
                pieces.append(text[i : start - 1] + "${")
                i = start + 2
                continue
            end = text.find("}", start)
            inner = text[start + 2 : end] if end > 0 else text[start + 2 :]
            if end < 0 or not REFERENCE.fullmatch(inner):
                raise UserError(
                    f"{self.where}: {key}={shown(text)} is refused: only references to other "
                    f"keys (${{a.b}}) are resolved in a saved run config, never a resolver or "
                    f"the environment; give the value itself: {key}=<value>"
                )
            pieces.append(text[i:start])
            pieces.append(self.reference(inner, path, depth, key))
            i = end + 1
        if len(pieces) == 2 and pieces[0] == "" and not isinstance(pieces[1], str):
            return pieces[1]  # the whole value is one reference: keep its type
        if len(pieces) == 1:
            return pieces[0]
        out = "".join(_as_text(p, key, self.where) for p in pieces)
        if len(out) > MAX_STRING:
            raise UserError(f"{self.where}: {key} resolves to more than {MAX_STRING} characters")
        return out

    def reference(self, inner: str, path: list[str], depth: int, key: str) -> Any:
        if inner.startswith("."):
            dots = len(inner) - len(inner.lstrip("."))
            base = path[: max(0, len(path) - dots)]
            target = [*base, *inner[dots:].split(".")]
        else:
            target = inner.split(".")
        node = lookup(self.root, target)
        name = ".".join(target)
        if node is ABSENT:
            raise UserError(
                f"{self.where}: {key}=${{{inner}}} names {name}, which is not in the config; "
                f"override {key}=<value>"
            )
        ref = tuple(target)
        if ref in self.done:
            return self.done[ref]
        if ref in self.active or depth >= MAX_DEPTH:
            raise UserError(f"{self.where}: {key}=${{{inner}}} refers back to itself")
        self.active.add(ref)
        value = self.value(node, target, depth + 1)
        self.active.discard(ref)
        self.done[ref] = value
        return value


def _as_text(value: Any, key: str, where: str) -> str:
    if isinstance(value, dict | list):
        raise UserError(f"{where}: {key} puts a whole section inside a string")
    return "None" if value is None else str(value)


def _check_size(value: Any, key: str, where: str) -> None:
    """References share their results: a few lines can name 2**40 nodes. Count up to the
    budget without recursion."""
    count, stack = 0, [value]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise UserError(f"{where}: {key} expands to more than {MAX_NODES} values (refused)")
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
