"""The index as a pandas DataFrame, and the ``where`` language that filters it.

A ``where`` expression is clauses joined by ``and`` / ``or`` (``and`` binds tighter),
``not`` and parentheses::

    data=fashion_mnist and val/acc>=0.92 and tag:baseline
    (optimizer.lr<0.05 or model=cnn) and status=finished and not tag:broken-data

A clause is ``KEY OP VALUE`` with OP one of ``= == != < <= > >= ~`` (``~``: the value holds
the text), or ``tag:NAME``. KEY is a column of the table: a metric (``val/acc``), a dotted
config key (``optimizer.lr``), a group choice (``data``, ``model``), or one of ``name status
kind note seed epoch duration_s start sweep``. VALUE is a number, a word, or a quoted
string. An unknown key is an error naming the nearest keys; a run without the key never
matches.
"""

from __future__ import annotations

import difflib
import functools
import math
import operator
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.analysis.groups import direction
from experiments.analysis.notebook.index import Index, build
from experiments.analysis.readings import value_text
from experiments.errors import UserError

# the fixed columns, in the order the table shows them (metrics, choices, config follow)
FIRST = ["name", "status", "kind", "tags", "note", "start", "duration_s", "epoch", "seed"]
LAST = ["overrides", "sweep", "reason", "path"]
OPS = ("==", "!=", "<=", ">=", "=", "<", ">", "~")
_TOKEN = re.compile(
    r"""\s*(?:(?P<lp>\()|(?P<rp>\))|(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')"""
    r"""|(?P<op>==|!=|<=|>=|=|<|>|~)|(?P<word>[^\s()=!<>~"']+))"""
)


def frame(index: Index) -> pd.DataFrame:
    """One row per run of ``index``, in the columns ``find_runs`` returns (unsorted)."""
    rows, metrics, choices, keys = [], {}, {}, {}
    for record in index.records:
        config = index.config(record)
        row = {k: record[k] for k in FIRST + ["reason"]}
        row["tags"] = list(record["tags"])
        row["overrides"] = " ".join(record["overrides"])
        row["sweep"] = os.path.dirname(record["name"]) if record["kind"] == "job" else ""
        row["path"] = str(index.root / record["name"]) if record["name"] != "." else str(index.root)
        optimized = (config.get("optimized") or [None])[0]
        if optimized:
            metrics.setdefault(optimized, None)
        for names, values in ((metrics, record["metrics"]), (choices, record["choices"]),
                              (keys, config.get("config", {}))):  # fmt: skip
            row.update(values)
            names.update(dict.fromkeys(values))  # first seen first
        rows.append(row)
    order = FIRST + list(metrics) + sorted(choices) + sorted(keys) + LAST
    order = list(dict.fromkeys(order))  # a metric and a config key of the same name: once
    df = pd.DataFrame(rows, columns=order)
    df["start"] = pd.to_datetime(df["start"], unit="s", utc=True).dt.tz_convert(None)
    for column in ("duration_s", *metrics):
        df[column] = pd.to_numeric(df[column], errors="coerce")
    df["epoch"] = df["epoch"].astype("Int64")
    return df


def find_runs(
    root: str | os.PathLike = "outputs",
    where: str | None = None,
    sort: str | None = None,
    ascending: bool | None = None,
    limit: int | None = None,
    cache: bool = True,
) -> pd.DataFrame:
    """Every run under ``root`` as a pandas DataFrame, one row per run, newest first.

    Args:
        root: an outputs folder (or any folder above runs), a sweep folder or a run folder.
        where: a filter such as ``"data=fashion_mnist and val/acc>=0.92 and tag:baseline"``
            (the language is in this module's docstring).
        sort: a column to sort by (default ``start``, newest first).
        ascending: the sort direction; default: descending for ``start`` and for a metric
            that is better higher, ascending otherwise (a loss, a name).
        limit: keep the first ``limit`` rows after sorting.
        cache: read and refresh ``<root>/.runs-index.json``.

    Returns:
        Columns ``name status kind tags note start duration_s epoch seed``, the metrics at
        each run's selected epoch, the group choices (``data``, ``model``, ...), the dotted
        config keys, then ``overrides sweep reason path``. Broken and failed runs are rows
        too, with their ``reason``.

    Raises:
        UserError: ``root`` is not a folder, ``where`` does not parse or names an unknown
            key, ``sort`` is not a column, ``limit`` is negative.
    """
    df = frame(build(Path(root), cache=cache))
    if where:
        df = df[evaluate(parse(where), df)]
    return order(df, sort, ascending, limit)


def order(
    df: pd.DataFrame, sort: str | None, ascending: bool | None, limit: int | None
) -> pd.DataFrame:
    """``df`` sorted by ``sort`` (missing values last) and cut to ``limit`` rows."""
    sort = sort or "start"
    if sort not in df.columns:
        raise UserError(f"sort={sort}: not a column; {valid_names(sort, list(df.columns))}")
    if ascending is None:  # a metric (stage/name) best first (``groups.direction``)
        better_lower = "/" not in sort or direction(sort, optimized_pairs(df))[0] == "min"
        ascending = sort != "start" and better_lower
    df = df.sort_values(sort, ascending=ascending, na_position="last", kind="stable")
    if limit is not None:
        if limit < 0:
            raise UserError(f"limit={limit}: must be 0 or more")
        df = df.head(limit)
    return df.reset_index(drop=True)


def optimized_pairs(df: pd.DataFrame) -> list[tuple]:
    if "optimized_metric" not in df or "optimized_mode" not in df:
        return []
    return list(zip(df["optimized_metric"], df["optimized_mode"], strict=True))


@dataclass(frozen=True)
class Clause:
    key: str
    op: str
    value: Any  # str, or float for a number


@dataclass(frozen=True)
class Tag:
    name: str


@dataclass(frozen=True)
class Node:
    op: str  # "and", "or", "not"
    parts: tuple


def parse(text: str) -> Clause | Tag | Node:
    """A ``where`` expression as a tree (see the module docstring).

    Raises:
        UserError: one line naming the expression and what was expected where.
    """
    tokens = _tokens(text)
    tree, at = _or(tokens, 0, text)
    if at != len(tokens):
        raise UserError(f"where={text!r}: unexpected {tokens[at][1]!r}; join clauses with and/or")
    return tree


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, at = [], 0
    text = text.strip()
    while at < len(text):
        m = _TOKEN.match(text, at)  # each token takes the blanks before it
        if m is None:
            raise UserError(f"where={text!r}: cannot read {text[at:].strip()[:20]!r}")
        kind = m.lastgroup or ""
        value = m.group(kind)
        if kind == "str":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        tokens.append((kind, value))
        at = m.end()
    return tokens


def _chain(word: str, lower):
    """A parser of ``lower ( word lower )*`` (``a and b and c``): one node, or the clause."""

    def parse(tokens, at, text):
        parts = []
        while True:
            part, at = lower(tokens, at, text)
            parts.append(part)
            if not (at < len(tokens) and tokens[at] == ("word", word)):
                break
            at += 1
        return (parts[0] if len(parts) == 1 else Node(word, tuple(parts))), at

    return parse


def _not(tokens, at, text):
    if at >= len(tokens):
        raise UserError(f"where={text!r}: ends where a clause was expected (e.g. val/acc>=0.9)")
    kind, value = tokens[at]
    if (kind, value) == ("word", "not"):
        inner, at = _not(tokens, at + 1, text)
        return Node("not", (inner,)), at
    if kind == "lp":
        inner, at = _or(tokens, at + 1, text)
        if at >= len(tokens) or tokens[at][0] != "rp":
            raise UserError(f"where={text!r}: a '(' is not closed")
        return inner, at + 1
    if kind == "word" and value.startswith("tag:"):
        if len(value) == 4:
            raise UserError(f"where={text!r}: tag: needs a name, e.g. tag:baseline")
        return Tag(value[4:]), at + 1
    if kind != "word" or value in ("and", "or"):
        raise UserError(f"where={text!r}: expected a clause such as val/acc>=0.9, not {value!r}")
    if at + 1 >= len(tokens) or tokens[at + 1][0] != "op":
        raise UserError(
            f"where={text!r}: {value!r} needs an operator and a value (one of "
            f"{' '.join(OPS)}), e.g. {value}=..., or tag:NAME"
        )
    if at + 2 >= len(tokens) or tokens[at + 2][0] not in ("word", "str"):
        raise UserError(f"where={text!r}: {value}{tokens[at + 1][1]} needs a value")
    op = "=" if tokens[at + 1][1] == "==" else tokens[at + 1][1]
    raw_kind, raw = tokens[at + 2]
    return Clause(value, op, raw if raw_kind == "str" else _number_or_word(raw)), at + 3


_and = _chain("and", _not)
_or = _chain("or", _and)


def _number_or_word(text: str) -> Any:
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def keys_of(tree) -> list[str]:
    if isinstance(tree, Clause):
        return [tree.key]
    if isinstance(tree, Node):
        return [k for p in tree.parts for k in keys_of(p)]
    return []


def evaluate(tree, df: pd.DataFrame) -> pd.Series:
    """The rows of ``df`` that ``tree`` selects, as a boolean Series.

    Raises:
        UserError: a key that is not a column (with the nearest ones), or an order
            comparison (< <= > >=) of text.
    """
    unknown = [k for k in keys_of(tree) if k not in df.columns]
    if unknown and len(df):
        raise UserError(
            f"where: unknown key {unknown[0]!r}; {valid_names(unknown[0], list(df.columns))}"
        )
    if unknown:  # no runs: nothing matches, and no key can be checked
        return pd.Series(False, index=df.index)
    return _eval(tree, df)


def _eval(tree, df):
    if isinstance(tree, Tag):
        return df["tags"].map(lambda tags: tree.name in tags).astype(bool)
    if isinstance(tree, Node):
        results = [_eval(p, df) for p in tree.parts]
        if tree.op == "not":
            return ~results[0]
        return functools.reduce(operator.and_ if tree.op == "and" else operator.or_, results)
    column = df[tree.key]
    numeric = pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)
    if tree.key == "start":
        return _compare(column, tree.op, pd.Timestamp(str(tree.value)), tree.key)
    if numeric and isinstance(tree.value, float):
        return _compare(pd.to_numeric(column, errors="coerce"), tree.op, tree.value, tree.key)
    text = column.map(shown_value)
    value = shown_value(tree.value)
    if tree.op in ("<", "<=", ">", ">="):
        if isinstance(tree.value, float):  # mixed column (numbers and text): compare numbers
            return _compare(column.map(_maybe_number), tree.op, tree.value, tree.key)
        raise UserError(
            f"where: {tree.key}{tree.op}{tree.value}: {tree.op} compares numbers; use = != or ~"
        )
    present = column.map(lambda v: v is not None and not (isinstance(v, float) and math.isnan(v)))
    if tree.op == "~":
        return present & text.map(lambda t: value in t)
    return present & ((text == value) if tree.op == "=" else (text != value))


def _compare(column, op, value, key):
    ops = {"=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
           ">": operator.gt, ">=": operator.ge}  # fmt: skip
    if op == "~":
        raise UserError(f"where: {key}~...: ~ looks for text; {key} holds numbers")
    result = ops[op](column, value)
    return result.fillna(False).astype(bool) & column.notna()


def _maybe_number(value: Any) -> float:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if is_number else math.nan


def shown_value(value: Any) -> str:
    """A cell as a command line writes it (``value_text``), a whole float as ``1``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list):
        return "[" + ", ".join(shown_value(v) for v in value) + "]"
    return value_text(value)


def valid_names(key: str, columns: list[str]) -> str:
    near = difflib.get_close_matches(key, columns, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(near)}? " if near else ""
    shown = [c for c in columns if "." not in c] + [c for c in columns if "." in c]
    listed = ", ".join(shown[:40]) + (f", ... ({len(shown)} in all)" if len(shown) > 40 else "")
    return f"{hint}valid keys: {listed}"
