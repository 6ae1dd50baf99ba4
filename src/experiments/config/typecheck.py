"""Type hints as checks: what a constructor argument's hint (read from source as an
``ast`` expression) admits of the values a config can hold, and how to say it in an error
("int >= 1 or null", "auto, true or false", "a list of 2 values, each int >= 1").

A list's items are checked when the hint says their type and it is a plain value type
(``Sequence[Annotated[int, Ge(1)]]``, ``tuple[float, float]``); ``Length(n)`` bounds the
count, and ``Why("...")`` says why a range is what it is."""

from __future__ import annotations

import ast
import numbers
from dataclasses import dataclass, replace
from typing import Any

from omegaconf import DictConfig, ListConfig

from experiments.config import source_cache
from experiments.config.hints import BOUNDS, Bound, Length, Why
from experiments.config.signatures import Param, _module_file, resolve


@dataclass(frozen=True)
class Type:
    """What a type hint admits of the values a config can hold."""

    kind: str  # any, none, int, float, bool, str, list, dict, object, literal, union, ref
    values: tuple = ()  # literal: the choices; union: the member Types; list: its item Type
    bounds: tuple = ()  # hints.Bound every number must satisfy; hints.Length of a list
    why: str = ""  # hints.Why: said when a value is refused

    def admits(self, value: Any) -> bool:
        if self.kind == "ref":
            return self.resolved().admits(value)
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

    def resolved(self) -> Type:
        """A name's Type, found in source only when a check needs it: most values match an
        earlier member of their union (a str for ``Union[str, Accelerator]``), and reading
        the module a name comes from is the slow part of checking a config."""
        expr, module, depth = self.values
        return _bounded(_resolve_name(expr, module, depth), self.bounds)

    def _parts(self) -> list[str]:
        if self.kind == "ref":
            return self.resolved()._parts()
        if self.kind == "union":
            parts = [p for t in self.values for p in t._parts()]
            return list(dict.fromkeys(parts))  # Lightning's precision lists 16 twice
        if self.kind == "literal":
            return [v if isinstance(v, str) else show(v) for v in self.values]
        if self.kind == "bool":
            return ["true", "false"]
        if self.kind == "list":
            return [self._describe_list()]
        names = {"none": "null", "any": "anything", "dict": "a mapping"}
        names["object"] = "a mapping with _target_"
        bounds = " and".join(f" {b.symbol} {show(b.limit)}" for b in self.bounds)
        text = names.get(self.kind, self.kind) + bounds
        return [text]

    def _describe_list(self) -> str:
        count = next((b.count for b in self.bounds if isinstance(b, Length)), None)
        if count is None:
            return f"a list of {self.values[0].describe()}" if self.values else "a list"
        if not self.values:
            return f"a list of {count} values"
        return f"a list of {count} values (each {self.values[0].describe()})"


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
_NAMES = {
    "int": "int", "float": "float", "bool": "bool", "str": "str", "None": "none",
    "list": "list", "List": "list", "tuple": "list", "Tuple": "list", "Sequence": "list",
    "MutableSequence": "list", "Iterable": "list", "ListConfig": "list",
    "dict": "dict", "Dict": "dict", "Mapping": "dict", "MutableMapping": "dict",
    "DictConfig": "dict", "Path": "str", "PathLike": "str",
}  # fmt: skip


def type_of(param: Param, refined: str | None = None) -> Type:
    """The Type of one argument: its hint as written (``refined`` replaces it)."""
    expr = ast.parse(refined, mode="eval").body if refined is not None else param.annotation
    found = _type(expr, param.module, 0)
    if param.none_default and not found.admits(None):
        return _union([found, Type("none")])
    return found


def _type(expr: ast.expr | None, module: str, depth: int) -> Type:
    if expr is None or depth > 8:
        return ANY
    if isinstance(expr, ast.Constant):
        if expr.value is None:
            return Type("none")
        if isinstance(expr.value, str):  # a hint written as a string
            try:
                return _type(ast.parse(expr.value, mode="eval").body, module, depth + 1)
            except SyntaxError:
                return ANY
        return ANY
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
        return _union([_type(e, module, depth + 1) for e in (expr.left, expr.right)])
    if isinstance(expr, ast.Subscript):
        return _subscript(expr, module, depth)
    name = _last_name(expr)
    if name in _NAMES:
        return Type(_NAMES[name])
    if name in ("Any", "object"):
        return ANY
    if name == "Callable":
        return Type("object")
    if not isinstance(expr, ast.Name | ast.Attribute):
        return ANY
    return Type("ref", (expr, module, depth))


def _resolve_name(expr: ast.expr, module: str, depth: int) -> Type:
    key = f"resolve:{module}:{ast.unparse(expr)}@{_module_file(module)}"
    saved = source_cache.get(key)
    if saved is source_cache.MISSING or not isinstance(saved, dict):
        with source_cache.recording() as files:
            found = resolve(module, expr)
        if found is None:
            saved = {"kind": "unknown"}
        elif isinstance(found[0], ast.expr):
            saved = {"kind": "alias", "source": ast.unparse(found[0]), "module": found[1]}
        else:
            saved = {"kind": "class"}
        source_cache.put(key, saved, files)
    if saved.get("kind") == "alias":  # a type alias
        try:
            value = ast.parse(str(saved["source"]), mode="eval").body
        except (SyntaxError, KeyError):
            return ANY
        return _type(value, str(saved.get("module")), depth + 1)
    if saved.get("kind") == "class":
        return Type("object")  # a class: a config gives it as a mapping with _target_
    return ANY  # cannot be told from source (e.g. imported only for type checkers)


def _subscript(expr: ast.Subscript, module: str, depth: int) -> Type:
    base = _last_name(expr.value)
    args = list(expr.slice.elts) if isinstance(expr.slice, ast.Tuple) else [expr.slice]
    if base == "Optional":
        return _union([_type(args[0], module, depth + 1), Type("none")])
    if base == "Union":
        return _union([_type(a, module, depth + 1) for a in args])
    if base == "Literal":
        values = tuple(_literal(a) for a in args)
        return ANY if any(v is _NOT_LITERAL for v in values) else Type("literal", values)
    if base == "Annotated":
        inner = _type(args[0], module, depth + 1)
        marks = [m for m in (_bound(a) for a in args[1:]) if m is not None]
        if inner.kind == "list":
            lengths = tuple(m for m in marks if isinstance(m, Length))
            inner = replace(inner, bounds=inner.bounds + lengths)
        found = _bounded(inner, tuple(m for m in marks if isinstance(m, Bound)))
        why = next((m.text for m in marks if isinstance(m, Why)), "")
        return replace(found, why=why) if why else found
    if base in _NAMES and _NAMES[base] == "list":
        return _list(base, args, module, depth)
    if base in _NAMES:
        return Type(_NAMES[base])
    if base == "Callable":
        return Type("object")
    return ANY


_SCALARS = ("int", "float", "bool", "str", "literal", "none")


def _list(base: str, args: list[ast.expr], module: str, depth: int) -> Type:
    """``Sequence[int]``, ``tuple[float, float]`` (two items), ``tuple[int, ...]``: a list
    whose items are checked when they are plain values (a class or an alias is left to the
    constructor: resolving it is the slow part of a check)."""
    ellipsis = len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value is ...
    if ellipsis:
        args = args[:1]
    shapes = {ast.dump(a) for a in args}
    if len(shapes) != 1:
        return Type("list")
    item = _type(args[0], module, depth + 1)
    members = item.values if item.kind == "union" else (item,)
    if not all(m.kind in _SCALARS for m in members):
        return Type("list")
    tuple_of_n = base in ("tuple", "Tuple") and len(args) > 1
    return Type("list", (item,), (Length(len(args)),) if tuple_of_n else ())


def _union(types: list[Type]) -> Type:
    flat = [m for t in types for m in (t.values if t.kind == "union" else (t,))]
    return ANY if any(t.kind == "any" for t in flat) else Type("union", tuple(flat))


def _bounded(inner: Type, bounds: tuple) -> Type:
    if inner.kind == "union":
        return Type("union", tuple(_bounded(t, bounds) for t in inner.values))
    if inner.kind in ("int", "float", "ref"):
        return Type(inner.kind, inner.values, inner.bounds + bounds)
    return inner


_NOT_LITERAL = object()


def _literal(expr: ast.expr) -> Any:
    try:
        return ast.literal_eval(expr)
    except ValueError:
        return _NOT_LITERAL


def _bound(expr: ast.expr):
    """A hints mark written in ``Annotated[...]``: ``Ge(1)``, ``Length(2)``, ``Why("...")``."""
    if not (isinstance(expr, ast.Call) and expr.args):
        return None
    name, value = _last_name(expr.func), _literal(expr.args[0])
    if name in BOUNDS and isinstance(value, int | float) and not isinstance(value, bool):
        return BOUNDS[name](value)
    if name == "Length" and isinstance(value, int) and not isinstance(value, bool):
        return Length(value)
    if name == "Why" and isinstance(value, str):
        return Why(value)
    return None


def _last_name(expr: ast.expr) -> str:
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return expr.id if isinstance(expr, ast.Name) else ""


def show(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    return repr(value)
