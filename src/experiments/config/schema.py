"""The composed config checked once, before anything is built: constructor signatures are
the schema.

Every ``_target_``'s arguments come from its constructor's signature (read from source by
``experiments.config.signatures``, so torch is not imported yet): an unknown key gets a
did-you-mean, and a value its type hint does not admit -- ``int``, ``float``, ``bool``,
``str``, ``Literal[...]`` choices, ``Annotated[..., Ge(1)]`` bounds -- gets one line naming
the key, the value and what would be valid. Adding an argument to a constructor is the
whole change: the config, the command line and this check follow.

Only two things are written here by hand: ``REFINED``, bounds and choices of third-party
constructors whose signatures cannot say them (torch's ``lr: float``), and the rules that
join several keys (``_cross_key_rules``).
"""

from __future__ import annotations

import ast
import difflib
import numbers
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from experiments.config.hints import BOUNDS
from experiments.config.signatures import Param, Signature, resolve, signature, target_problem
from experiments.errors import UserError

# keys Hydra's instantiate reads itself, and our switch for callbacks (see build.callbacks)
HYDRA_KEYS = frozenset({"_target_", "_partial_", "_recursive_", "_convert_", "_args_", "enabled"})

# top-level sections no constructor takes, described by dataclasses in config.options
SECTIONS = {
    "": "experiments.config.options.RunOptions",
    "sweep": "experiments.config.options.SweepOptions",
    "cv": "experiments.config.options.CrossValidation",
}

_OPTIMIZER = {"lr": "Annotated[float, Ge(0)]", "weight_decay": "Annotated[float, Ge(0)]"}
REFINED = {
    "lightning.pytorch.Trainer": {
        "accelerator": "Literal['auto', 'cpu', 'gpu', 'cuda', 'mps', 'tpu'] | Accelerator",
        "max_epochs": "Annotated[int, Ge(-1)] | None",
        "log_every_n_steps": "Annotated[int, Ge(1)] | None",
        "accumulate_grad_batches": "Annotated[int, Ge(1)]",
    },
    "torch.optim.SGD": {**_OPTIMIZER, "momentum": "Annotated[float, Ge(0)]"},
    "torch.optim.AdamW": _OPTIMIZER,
    "torch.optim.Adam": _OPTIMIZER,
}


def check(cfg: DictConfig) -> None:
    """Raise UserError naming the first key of ``cfg`` that no constructor would accept."""
    missing = sorted(k for k in _missing_keys(cfg, "") if not k.startswith("hydra"))
    if missing:
        raise UserError(
            f"missing value for {', '.join(missing)}: set it on the command line, "
            f"e.g. {missing[0]}=<value>"
        )
    plain = OmegaConf.to_container(cfg, resolve=False)
    for section, target in SECTIONS.items():
        node = plain.get(section) if section else plain
        if isinstance(node, dict):
            _check_node(cfg, section, target, node, known_only=not section)
    for key, target, node in walk_targets(plain):
        if not isinstance(target, str) or "${" in target:
            continue
        problem = target_problem(target)
        if problem:
            raise UserError(f"{key}._target_={target!r}: {problem}")
        _check_node(cfg, key, target, node, known_only=False)
    _cross_key_rules(cfg)


def walk_targets(node: Any, key: str = "") -> Iterator[tuple[str, Any, dict]]:
    """Yield ``(dotted key, target, mapping)`` for every plain mapping with a ``_target_``."""
    if isinstance(node, dict):
        if "_target_" in node:
            yield key or "<root>", node["_target_"], node
        for k, v in node.items():
            yield from walk_targets(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk_targets(v, f"{key}.{i}" if key else str(i))


def _check_node(cfg: DictConfig, key: str, target: str, node: dict, known_only: bool) -> None:
    sig = signature(target)
    if sig is None:
        return  # source cannot tell: the constructor checks its own arguments
    for name, value in node.items():
        if name in HYDRA_KEYS:
            continue
        path = f"{key}.{name}" if key else str(name)
        param = sig.params.get(name)
        if param is None:
            if not (sig.any_key or known_only):
                raise UserError(_unknown_key(path, name, sig))
            continue
        if isinstance(value, dict) and "_target_" in value:
            continue  # built by its own target, checked on its own
        if isinstance(value, str) and "${" in value:
            try:
                value = OmegaConf.select(cfg, path, throw_on_missing=False)
            except Exception:  # an interpolation only Hydra's run can resolve
                continue
        spec = type_of(param, REFINED.get(target, {}).get(name))
        if not spec.admits(value):
            raise UserError(f"{path}={_show(value)} is not valid: expected {spec.describe()}")


def _unknown_key(path: str, name: Any, sig: Signature) -> str:
    names = sorted(sig.params)
    close = difflib.get_close_matches(str(name), names, n=1)
    if close:
        parent = path.rpartition(".")[0]
        hint = f"did you mean {parent + '.' if parent else ''}{close[0]}?"
    else:
        more = f", ... ({len(names)} in all)" if len(names) > 12 else ""
        hint = f"it takes {', '.join(names[:12])}{more}"
    return f"{path}: {sig.target} has no argument '{name}'; {hint}"


# -- type hints as checks ----------------------------------------------------------------


@dataclass(frozen=True)
class Type:
    """What a type hint admits of the values a config can hold."""

    kind: str  # any, none, int, float, bool, str, list, dict, object, literal, union
    values: tuple = ()  # literal: the choices; union: the member Types
    bounds: tuple = ()  # hints.Bound instances every number must satisfy

    def admits(self, value: Any) -> bool:
        if self.kind == "union":
            return any(t.admits(value) for t in self.values)
        ok = _ADMITS[self.kind](self, value)
        if ok and self.bounds and isinstance(value, numbers.Real):
            return all(b.holds(value) for b in self.bounds)
        return ok

    def describe(self) -> str:
        parts = self._parts()
        return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} or {parts[-1]}"

    def _parts(self) -> list[str]:
        if self.kind == "union":
            parts = [p for t in self.values for p in t._parts()]
            return list(dict.fromkeys(parts))  # Lightning's precision lists 16 twice
        if self.kind == "literal":
            return [v if isinstance(v, str) else _show(v) for v in self.values]
        if self.kind == "bool":
            return ["true", "false"]
        names = {"none": "null", "any": "anything", "list": "a list", "dict": "a mapping"}
        names["object"] = "a mapping with _target_"
        bounds = " and".join(f" {b.symbol} {_show(b.limit)}" for b in self.bounds)
        text = names.get(self.kind, self.kind) + bounds
        return [text]


_ADMITS = {
    "any": lambda t, v: True,
    "none": lambda t, v: v is None,
    "int": lambda t, v: isinstance(v, numbers.Integral) and not isinstance(v, bool),
    "float": lambda t, v: isinstance(v, numbers.Real) and not isinstance(v, bool),
    "bool": lambda t, v: isinstance(v, bool),
    "str": lambda t, v: isinstance(v, str),
    "list": lambda t, v: isinstance(v, list | tuple | ListConfig),
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
    found = resolve(module, expr) if isinstance(expr, ast.Name | ast.Attribute) else None
    if found is None:
        return ANY  # cannot be told from source (e.g. imported only for type checkers)
    if isinstance(found[0], ast.expr):  # a type alias
        return _type(found[0], found[1], depth + 1)
    return Type("object")  # a class: a config gives it as a mapping with _target_


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
        bounds = tuple(b for b in (_bound(a) for a in args[1:]) if b is not None)
        return _bounded(inner, bounds)
    if base in _NAMES:
        return Type(_NAMES[base])
    if base == "Callable":
        return Type("object")
    return ANY


def _union(types: list[Type]) -> Type:
    flat = [m for t in types for m in (t.values if t.kind == "union" else (t,))]
    return ANY if any(t.kind == "any" for t in flat) else Type("union", tuple(flat))


def _bounded(inner: Type, bounds: tuple) -> Type:
    if inner.kind == "union":
        return Type("union", tuple(_bounded(t, bounds) for t in inner.values))
    if inner.kind in ("int", "float"):
        return Type(inner.kind, inner.values, inner.bounds + bounds)
    return inner


_NOT_LITERAL = object()


def _literal(expr: ast.expr) -> Any:
    try:
        return ast.literal_eval(expr)
    except ValueError:
        return _NOT_LITERAL


def _bound(expr: ast.expr):
    if isinstance(expr, ast.Call) and _last_name(expr.func) in BOUNDS and expr.args:
        limit = _literal(expr.args[0])
        if isinstance(limit, int | float):
            return BOUNDS[_last_name(expr.func)](limit)
    return None


def _last_name(expr: ast.expr) -> str:
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return expr.id if isinstance(expr, ast.Name) else ""


def _show(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    return repr(value)


# -- rules that join keys ----------------------------------------------------------------


def _cross_key_rules(cfg: DictConfig) -> None:
    epochs = _select(cfg, "trainer.max_epochs")
    if epochs == -1 and _select(cfg, "trainer.max_steps") in (None, -1):
        if _select(cfg, "trainer.max_time") is None:
            raise UserError(
                "trainer.max_epochs=-1 trains forever: also set trainer.max_steps=<N> or "
                "trainer.max_time=DD:HH:MM:SS, or give trainer.max_epochs=<N>"
            )
    warmup = _select(cfg, "scheduler.warmup_epochs")
    if warmup is not None and epochs is not None and epochs > 0 and not 0 <= warmup < epochs:
        raise UserError(
            f"scheduler.warmup_epochs={warmup} is not valid: the warmup must be shorter than the "
            f"run (trainer.max_epochs={epochs})"
        )
    metric = cfg.get("optimized_metric")
    if metric is not None and "/" not in str(metric):
        raise UserError(
            f"optimized_metric={metric!r} is not valid: expected stage/name, e.g. val/acc"
        )


def _missing_keys(node, prefix: str):
    """``???`` values, found without resolving interpolations (``${hydra:...}`` may not be set)."""
    items = node.items_ex(resolve=False) if isinstance(node, DictConfig) else enumerate(node)
    for key, _ in items:
        child = node._get_node(key)
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(child, DictConfig | ListConfig):
            if not child._is_missing() and not child._is_none():
                yield from _missing_keys(child, path)
        elif child._is_missing():
            yield path


def _select(cfg: DictConfig, key: str):
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=False)
    except Exception as err:  # an interpolation that cannot resolve
        raise UserError(f"{key}: {err}") from None
