"""Statistics of a group of runs: mean, sample std and the 95% confidence interval of the
mean from Student's t (its own table: no scipy import)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

T_975 = (
    12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004,
    2.262157, 2.228139, 2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905,
    2.109816, 2.100922, 2.093024, 2.085963, 2.079614, 2.073873, 2.068658, 2.063899,
    2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272,
)  # fmt: skip


Z_975 = 1.959963984540054


@dataclass(frozen=True)
class Stats:
    """n, mean, sample std (n - 1) and the 95% CI of the mean; std and CI are None for n=1."""

    n: int
    mean: float
    std: float | None
    ci_low: float | None
    ci_high: float | None


def t_quantile_975(df: int) -> float:
    """Student's t quantile t(0.975, df), the factor of a two-sided 95% interval.

    A table for df <= 30 and the Cornish-Fisher expansion above it (off by < 1e-7 from
    ``scipy.stats.t.ppf``): no scipy import, which would cost half a second.
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(T_975):
        return T_975[df - 1]
    z, v = Z_975, float(df)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4)
    )


def summarize(values: Sequence[float]) -> Stats:
    """n, mean, sample std and the 95% t confidence interval of the mean of ``values``."""
    n = len(values)
    if n == 0:
        raise ValueError("no values to summarize")
    mean = math.fsum(values) / n
    if n == 1:
        return Stats(1, mean, None, None, None)
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in values) / (n - 1))
    half = t_quantile_975(n - 1) * std / math.sqrt(n)
    return Stats(n, mean, std, mean - half, mean + half)
