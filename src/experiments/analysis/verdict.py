"""Is the first group really the best? Each other group is tested against it on the seeds
run: a paired t-test on the per-seed differences when the two groups ran the same seeds, else
Welch's t-test; with more than one other group the p-values are Holm-adjusted, and the
first group is named the winner only when it beats every other one at 95%. Otherwise the
groups it cannot be told apart from are a tie. When a comparison cannot decide, about how
many seeds per group would (80% power at the observed difference, capped at 100). Also the
comparison as a LaTeX table for a paper."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from experiments.analysis.significance import Stats, summarize, t_quantile_975, t_two_sided_p

Z_80 = 0.8416212335729143  # one-sided 80% quantile of the normal: the power asked for
ALPHA = 0.05
MAX_SEEDS = 100  # a "seeds needed" above this says "more than 100": an estimate, not a plan
# LaTeX's special characters, written as text
TEX = str.maketrans({
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
    "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}",
})  # fmt: skip


@dataclass(frozen=True)
class Pairwise:
    """The first group against one other: the test, its statistic and (Holm-adjusted) p."""

    other: str
    test: str  # "paired t" | "Welch's t" | "" (cannot be tested: see note)
    n: tuple[int, int]  # runs of the first group and of the other (pairs: both the pairs)
    difference: float  # first minus other, in the better direction (>= 0)
    spread: float | None  # the std of that difference per seed (paired) or sqrt(s_a²+s_b²)
    t: float | None = None
    df: float | None = None
    p: float | None = None
    p_holm: float | None = None
    decided: bool = False
    note: str = ""

    def describe(self) -> str:
        if not self.test:
            return self.note
        seeds = f"{self.n[0]} shared seeds" if self.test == "paired t" else (
            f"seeds {self.n[0]} and {self.n[1]}")  # fmt: skip
        holm = f", Holm-adjusted p = {_p(self.p_holm)}" if self.p_holm != self.p else ""
        return f"{self.test} = {self.t:.2f}, df = {self.df:.1f}, p = {_p(self.p)}{holm}; {seeds}"


@dataclass(frozen=True)
class Verdict:
    best: str  # the first group (highest mean with mode=max)
    winner: str | None  # the first group when it beats every other at 95%, else None
    tied: tuple[str, ...]  # with no winner: the first and the groups not told apart from it
    pairs: tuple[Pairwise, ...]
    seeds_needed: int | None  # per group, to decide the first against the runner-up
    text: str

    @property
    def decided(self) -> bool:
        return self.winner is not None


def _p(p: float | None) -> str:
    if p is None:
        return "?"
    return "< 0.0001" if p < 1e-4 else f"{p:.4f}"


def welch(a: Stats, b: Stats) -> tuple[float, float] | None:
    """Welch's t statistic of ``a.mean - b.mean`` and its degrees of freedom (Welch-
    Satterthwaite); None when a group has fewer than two runs."""
    if a.std is None or b.std is None:
        return None
    va, vb = a.std**2 / a.n, b.std**2 / b.n
    if va + vb == 0:
        return (math.inf if a.mean != b.mean else 0.0), float(a.n + b.n - 2)
    t = (a.mean - b.mean) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1))
    return t, df


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def compare_pair(
    other: str,
    a: Sequence[float],
    b: Sequence[float],
    ra: Sequence[Hashable],
    rb: Sequence[Hashable],
    sign: int,
) -> Pairwise:
    """The first group's values ``a`` against ``b`` (``ra``/``rb``: each run's replicate
    key, which pairs them); ``sign`` 1 when higher is better, -1 when lower is."""
    sa, sb = summarize(a), summarize(b)
    diff = sign * (sa.mean - sb.mean)
    n = (len(a), len(b))
    # the two groups ran the same seeds, each once: their runs pair up by seed
    if len(set(ra)) == len(ra) == len(rb) == len(set(rb)) >= 2 and set(ra) == set(rb):
        by_seed = dict(zip(rb, b, strict=True))
        d = [sign * (x - by_seed[r]) for x, r in zip(a, ra, strict=True)]
        sd = summarize(d).std or 0.0
        if sd == 0.0 or all(_same(x, d[0]) for x in d):
            if _same(diff, 0.0):
                return Pairwise(other, "paired t", n, 0.0, 0.0, 0.0, len(d) - 1.0, 1.0)
            return Pairwise(other, "", n, diff, 0.0, note=(
                "every shared seed gives the same difference, so the seed-to-seed noise "
                "cannot be estimated: not tested"))  # fmt: skip
        t, df = diff / (sd / math.sqrt(len(d))), len(d) - 1.0
        return Pairwise(other, "paired t", n, diff, sd, t, df, t_two_sided_p(t, df))
    many = sa if sb.std is None else sb
    if (sa.std is None) != (sb.std is None) and many.std:
        # one group ran once: its run is tested against the other group's spread (equal
        # variances assumed, the only way one run can be compared): df of the other group
        t, df = diff / (many.std * math.sqrt(1 / len(a) + 1 / len(b))), many.n - 1.0
        spread = many.std * math.sqrt(2)
        return Pairwise(other, "t (one run)", n, diff, spread, t, df, t_two_sided_p(t, df))
    if sa.std is None or sb.std is None:
        if len(a) == 1 and len(b) == 1 and _same(diff, 0.0):
            return Pairwise(other, "", n, 0.0, None, note="the same value, one run each")
        return Pairwise(other, "", n, diff, None, note=(
            "a group with one run has no seed-to-seed spread: not tested (run 2 or more "
            "seeds, each a different seed=)"))  # fmt: skip
    spread = math.sqrt(sa.std**2 + sb.std**2)
    if sa.std == 0.0 and sb.std == 0.0:
        if _same(diff, 0.0):
            return Pairwise(other, "Welch's t", n, 0.0, 0.0, 0.0, n[0] + n[1] - 2.0, 1.0)
        return Pairwise(other, "", n, diff, 0.0, note=(
            "neither group varies from seed to seed, so the noise cannot be estimated: "
            "not tested"))  # fmt: skip
    t, df = welch(sa, sb)  # type: ignore[misc]
    return Pairwise(other, "Welch's t", n, diff, spread, sign * t, df, t_two_sided_p(t, df))


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error at most the level asked)."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def seeds_needed(pair: Pairwise) -> int | None:
    """Runs per group for a two-sided 95% test to detect ``pair``'s observed difference with
    80% power: the smallest n with n >= (t(0.975, df(n)) + z(0.8))^2 spread^2 / d^2, where
    spread^2 is the per-seed variance of the difference (paired) or s_a^2 + s_b^2 (Welch).
    None when the difference is ~0 or there is no spread to go by; ``MAX_SEEDS + 1`` for
    "more than MAX_SEEDS"."""
    if pair.spread is None or pair.spread == 0.0 or _same(pair.difference, 0.0):
        return None
    ratio = (pair.spread / pair.difference) ** 2
    for n in range(2, MAX_SEEDS + 1):
        df = n - 1 if pair.test == "paired t" else 2 * n - 2
        if n >= (t_quantile_975(df) + Z_80) ** 2 * ratio:
            return max(n, max(pair.n) + 1)
    return MAX_SEEDS + 1


def decide(
    names: Sequence[str],
    values: Sequence[Sequence[float]],
    replicates: Sequence[Sequence[Hashable]],
    mode: str,
    metric: str = "the metric",
) -> Verdict:
    """The verdict on groups given best first (``names[0]`` has the best mean).

    Args:
        names: the groups' names, best mean first (two or more).
        values: each group's metric, one value per run.
        replicates: each run's replicate key (its seed): groups whose runs have the same
            set of them are compared paired.
        mode: ``max`` or ``min``.
        metric: its name, for the text.
    """
    if len(names) < 2:
        raise ValueError("a verdict needs two groups or more")
    sign = 1 if mode == "max" else -1
    pairs = [
        compare_pair(names[i], values[0], values[i], replicates[0], replicates[i], sign)
        for i in range(1, len(names))
    ]
    adjusted = holm([p.p if p.p is not None else 1.0 for p in pairs])
    pairs = [
        Pairwise(**{**p.__dict__, "p_holm": q if p.p is not None else None,
                    "decided": p.p is not None and q < ALPHA and p.difference > 0})
        for p, q in zip(pairs, adjusted, strict=True)
    ]  # fmt: skip
    best = names[0]
    if all(p.decided for p in pairs):
        beaten = "; ".join(f"{p.other} ({p.describe()})" for p in pairs)
        corrected = ", Holm-corrected for the comparisons" if len(pairs) > 1 else ""
        text = f"verdict: {best} is the best on {metric} at 95%{corrected}: it beats {beaten}"
        return Verdict(best, best, (), tuple(pairs), None, text)
    tied = (best, *(p.other for p in pairs if not p.decided))
    runner = pairs[0]
    need = seeds_needed(runner) if not runner.decided else None
    equal = [p.other for p in pairs if _same(p.difference, 0.0)]
    if equal:
        head = (
            f"verdict: tie on {metric}: {', '.join([best, *equal])} have the same mean, so "
            f"no group is best"
        )
    else:
        head = (
            f"verdict: no winner on {metric} at 95%: {best} has the best mean but is not told "
            f"apart from {', '.join(tied[1:])}; tie at the top: {', '.join(tied)}"
        )
    details = "; ".join(f"{p.other}: {p.describe()}" for p in pairs if not p.decided)
    if _same(runner.difference, 0.0):
        more = f"no difference detectable between {best} and {runner.other}"
    elif need is None:
        more = ""
    elif need > MAX_SEEDS:
        more = (
            f"more than {MAX_SEEDS} seeds per group would be needed to tell {best} from "
            f"{runner.other} (their difference is small against the seed-to-seed spread)"
        )
    else:
        more = (
            f"about {need} seeds per group would decide {best} against {runner.other} "
            f"(80% power at the observed difference)"
        )
    text = head + f" ({details})" + (f"; {more}" if more else "")
    return Verdict(best, None, tied, tuple(pairs), need, text)


def latex(comparison) -> str:
    """The comparison as a LaTeX ``tabular``: one row per group, the keys that differ, the
    metric's mean and 95% interval (kept in [0, 1] for a fraction, so written as its two
    ends), the number of seeds; the winner in bold (none for a tie)."""
    c = comparison
    names = [h.translate(TEX) for h in ["group", *c.keys]]
    cols = [*names, f"{c.metric} (mean [95\\% CI])", "seeds"]
    lines = [
        "% written by python -m experiments.compare --latex",
        "\\begin{tabular}{" + "l" * len(names) + "rr}",
        "\\hline",
        " & ".join(cols) + " \\\\",
        "\\hline",
    ]
    for group in c.groups:
        s = group.stats[c.metric]
        value = f"{s.mean:.4f}"
        if s.ci_high is not None:
            value += f" [{s.ci_low:.4f}, {s.ci_high:.4f}]"
        if group is c.best:  # a winner at 95% only: a tie has no bold row
            value = f"\\textbf{{{value}}}"
        keys = [str(group.config.get(k, "(absent)")).translate(TEX) for k in c.keys]
        lines.append(" & ".join([group.name, *keys, value, str(len(group.runs))]) + " \\\\")
    lines += ["\\hline", "\\end{tabular}", ""]
    return "\n".join(lines)
