"""Type hints as checks: the bounds a constructor's hints can carry, and what a hint admits
of the values a config can hold, said the way an error says it ("int >= 1 or null", "auto,
true or false", "a list of 2 values (each int >= 1)").

Bounds are ``Annotated`` marks: ``batch_size: Annotated[int, Ge(1)]``, ``image_size:
Annotated[Sequence[Annotated[int, Ge(1)]], Length(2)]``, and ``Why("...")``, the reason a
value is refused where the bound alone would not say it. ``experiments.config.schema``
reads them with ``typing.get_type_hints`` from the imported constructor, so a signature is
the one place its options' rules are written.

A list's items are checked when the hint says their type and it is a plain value type
(``Sequence[Annotated[int, Ge(1)]]``, ``tuple[float, float]``); a class in a hint stands
for a mapping with ``_target_`` that builds one.
"""

from __future__ import annotations

import collections.abc as abc
import enum
import numbers
import operator
import os
import types
from dataclasses import dataclass, replace
from pathlib import PurePath
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from omegaconf import DictConfig, ListConfig

# -- the marks ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Bound:
    """``value <op> limit``; ``Ge(0)`` is ``value >= 0``."""

    limit: float
    symbol = "?"

    def holds(self, value: float) -> bool:
        return bool(_OPS[self.symbol](value, self.limit))


class Ge(Bound):
    symbol = ">="


class Gt(Bound):
    symbol = ">"


class Le(Bound):
    symbol = "<="


class Lt(Bound):
    symbol = "<"


@dataclass(frozen=True)
class Length:
    """A list of exactly ``count`` items (``[height, width]``)."""

    count: int


@dataclass(frozen=True)
class Why:
    """Said after the valid range when a value is refused: why the range is what it is."""

    text: str


_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


class Built:
    """In a hint written for a third-party argument (``schema.REFINED``): an object the
    config builds, given as a mapping with ``_target_`` (Lightning's ``Accelerator``)."""


# -- what a hint admits ------------------------------------------------------------------


@dataclass(frozen=True)
class Type:
    """What a type hint admits of the values a config can hold."""

    kind: str  # any, none, int, float, bool, str, list, dict, object, literal, union
    values: tuple = ()  # literal: the choices; union: the member Types; list: its item Type
    bounds: tuple = ()  # Bound every number must satisfy; Length of a list
    why: str = ""  # Why: said when a value is refused

    def admits(self, value: Any) -> bool:
        if self.kind == "union":
            return any(t.admits(value) for t in self.values)
        ok = _ADMITS[self.kind](self, value)
        if ok and self.bounds and isinstance(value, numbers.Real):
            return all(b.holds(value) for b in self.bounds if isinstance(b, Bound))
        return ok

    def reason(self) -> str:
        """The first ``Why`` of this Type or its members ("" when none says one)."""
        if self.why:
            return self.why
        members = self.values if self.kind in ("union", "list") else ()
        return next((t.reason() for t in members if t.reason()), "")

    def describe(self) -> str:
        parts = self._parts()
        return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} or {parts[-1]}"

    def _parts(self) -> list[str]:
        if self.kind == "union":
            parts = [p for t in self.values for p in t._parts()]
            return list(dict.fromkeys(parts))  # Lightning's precision lists 16 twice
        if self.kind == "literal":
            return [v if isinstance(v, str) else show(v) for v in self.values]
        if self.kind == "bool":
            return ["true", "false"]
        if self.kind == "list":
            count = next((b.count for b in self.bounds if isinstance(b, Length)), None)
            each = self.values[0].describe() if self.values else ""
            if count is None:
                return [f"a list of {each}" if each else "a list"]
            return [f"a list of {count} values" + (f" (each {each})" if each else "")]
        names = {"none": "null", "any": "anything", "dict": "a mapping"}
        names["object"] = "a mapping with _target_"
        bounds = " and".join(f" {b.symbol} {show(b.limit)}" for b in self.bounds)
        return [names.get(self.kind, self.kind) + bounds]


def _admits_list(t: Type, value: Any) -> bool:
    if not isinstance(value, list | tuple | ListConfig):
        return False
    if any(isinstance(b, Length) and len(value) != b.count for b in t.bounds):
        return False
    if not t.values:
        return True
    # an interpolation inside the list is resolved, and checked, by its constructor
    return all(t.values[0].admits(v) for v in value if not (isinstance(v, str) and "${" in v))


_ADMITS = {
    "any": lambda t, v: True,
    "none": lambda t, v: v is None,
    "int": lambda t, v: isinstance(v, numbers.Integral) and not isinstance(v, bool),
    "float": lambda t, v: isinstance(v, numbers.Real) and not isinstance(v, bool),
    "bool": lambda t, v: isinstance(v, bool),
    "str": lambda t, v: isinstance(v, str),
    "list": _admits_list,
    "dict": lambda t, v: isinstance(v, dict | DictConfig),
    "object": lambda t, v: isinstance(v, dict | DictConfig),  # a config that builds one
    "literal": lambda t, v: any(type(c) is type(v) and c == v for c in t.values),
}
ANY = Type("any")
_SCALARS = {bool: "bool", int: "int", float: "float", str: "str", type(None): "none"}
_PLAIN = ("int", "float", "bool", "str", "literal", "none")
# a Tensor iterates too, but a config never gives one as a list
_SEQUENCES = (abc.Sequence, abc.MutableSequence, abc.Iterable, abc.Collection, ListConfig)


def type_of(hint: Any, none_default: bool = False) -> Type:
    """The Type of one argument's hint (as ``typing.get_type_hints`` returns it);
    ``none_default``: ``x: int = None``, an implicit Optional, as older code writes."""
    found = _type(hint, 0)
    if none_default and not found.admits(None):
        return _union([found, Type("none")])
    return found


def _type(hint: Any, depth: int) -> Type:
    origin, args = get_origin(hint), get_args(hint)
    if depth > 8 or hint is Any:
        return ANY
    if origin is Annotated:
        return _annotated(_type(args[0], depth + 1), args[1:])
    if origin in (Union, types.UnionType):
        return _union([_type(a, depth + 1) for a in args])
    if origin is Literal:
        return Type("literal", args)
    if hint is None or (isinstance(hint, type) and hint in _SCALARS):
        return Type(_SCALARS[type(None) if hint is None else hint])
    cls = origin if isinstance(origin, type) else hint
    if not isinstance(cls, type) or cls is object or issubclass(cls, enum.Enum | type):
        return ANY  # a TypeVar, a name only type checkers know, an enum: the constructor's
    if issubclass(cls, str | PurePath | os.PathLike):
        return Type("str")
    if issubclass(cls, abc.Mapping):
        return Type("dict")
    if issubclass(cls, list | tuple) or cls in _SEQUENCES:
        return _list(cls, args, depth)
    return Type("object")  # a class: a config gives it as a mapping with _target_


def _annotated(inner: Type, marks: tuple) -> Type:
    if inner.kind == "list":
        lengths = tuple(m for m in marks if isinstance(m, Length))
        inner = replace(inner, bounds=inner.bounds + lengths)
    found = _bounded(inner, tuple(m for m in marks if isinstance(m, Bound)))
    why = next((m.text for m in marks if isinstance(m, Why)), "")
    return replace(found, why=why) if why else found


def _list(cls: type, args: tuple, depth: int) -> Type:
    """``Sequence[int]``, ``tuple[float, float]`` (two items), ``tuple[int, ...]``: a list
    whose items are checked when they are plain values (a class is left to the constructor)."""
    fixed = issubclass(cls, tuple) and len(args) > 1 and args[-1] is not Ellipsis
    args = tuple(a for a in args if a is not Ellipsis)
    if len({repr(a) for a in args}) != 1:
        return Type("list")
    item = _type(args[0], depth + 1)
    members = item.values if item.kind == "union" else (item,)
    if not all(m.kind in _PLAIN for m in members):
        return Type("list")
    return Type("list", (item,), (Length(len(args)),) if fixed else ())


def _union(types_: list[Type]) -> Type:
    flat = [m for t in types_ for m in (t.values if t.kind == "union" else (t,))]
    return ANY if any(t.kind == "any" for t in flat) else Type("union", tuple(flat))


def _bounded(inner: Type, bounds: tuple) -> Type:
    if inner.kind == "union":
        return Type("union", tuple(_bounded(t, bounds) for t in inner.values))
    if inner.kind in ("int", "float"):
        return Type(inner.kind, inner.values, inner.bounds + bounds)
    return inner


def show(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    return repr(value)
