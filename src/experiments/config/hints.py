"""Bounds a constructor's type hints can carry, e.g. ``batch_size: Annotated[int, Ge(1)]``,
``image_size: Annotated[Sequence[Annotated[int, Ge(1)]], Length(2)]``, and the reason a
value is refused where the bound alone would not say it (``Why("...")``).

``experiments.config.schema`` reads them from source (with ``Literal`` choices and the
types themselves) to check a composed config before anything is built, so a constructor's
signature is the one place its options' rules are written.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass


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
BOUNDS = {cls.__name__: cls for cls in (Ge, Gt, Le, Lt)}
