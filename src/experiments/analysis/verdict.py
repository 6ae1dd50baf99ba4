"""Is the best group really better? Welch's t-test of the best group against the runner-up
at 95%, the seeds per group a decision would need when the answer is "cannot tell", and the
comparison as a LaTeX table for a paper."""

from __future__ import annotations

import math
from dataclasses import dataclass

from experiments.analysis.stats import Z_975, Stats, t_quantile_975

Z_80 = 0.8416212335729143  # one-sided 80% quantile of the normal: the power asked for


@dataclass(frozen=True)
class Verdict:
    best: str
    runner_up: str
    decided: bool  # the best group's mean is higher (or lower) at 95%
    t: float | None
    df: float | None
    seeds_needed: int | None  # per group, for 80% power at the observed difference
    text: str


def welch(a: Stats, b: Stats) -> tuple[float, float] | None:
    """Welch's t statistic of ``a.mean - b.mean`` and its degrees of freedom (Welch-
    Satterthwaite); None when a group has fewer than two runs."""
    if a.std is None or b.std is None:
        return None
    va, vb = a.std**2 / a.n, b.std**2 / b.n
    if va + vb == 0:
        return (math.inf if a.mean != b.mean else 0.0), float(a.n + b.n - 2)
    t = (a.mean - b.mean) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (
        (va**2 / (a.n - 1) if a.n > 1 else 0) + (vb**2 / (b.n - 1) if b.n > 1 else 0)
    )
    return t, df


def seeds_needed(a: Stats, b: Stats) -> int | None:
    """Runs per group for a two-sided 95% test to detect the observed difference with 80%
    power: n = (z_0.975 + z_0.8)^2 (s_a^2 + s_b^2) / d^2 (normal approximation)."""
    if a.std is None or b.std is None or a.mean == b.mean:
        return None
    need = (Z_975 + Z_80) ** 2 * (a.std**2 + b.std**2) / (a.mean - b.mean) ** 2
    return max(2, math.ceil(need))


def verdict(best: str, runner_up: str, a: Stats, b: Stats, metric: str, mode: str) -> Verdict:
    """The seed verdict for ``best`` (stats ``a``) against ``runner_up`` (``b``)."""
    tested = welch(a, b)
    if tested is None:
        text = (
            f"seed verdict: cannot test {best} against {runner_up}: each needs at least 2 "
            f"seeds (runs with different seed=)"
        )
        return Verdict(best, runner_up, False, None, None, None, text)
    t, df = tested
    signed = t if mode == "max" else -t
    critical = t_quantile_975(max(1, math.floor(df))) if math.isfinite(df) and df >= 1 else math.inf
    decided = signed > critical
    if decided:
        text = (
            f"seed verdict: {best} beats {runner_up} on {metric} at 95% (Welch's t = "
            f"{signed:.2f} > {critical:.2f}, df = {df:.1f}, seeds {a.n} and {b.n})"
        )
        return Verdict(best, runner_up, True, signed, df, None, text)
    need = seeds_needed(a, b)
    more = (
        f"about {need} seeds per group would decide it (80% power at this difference)"
        if need
        else "the two means are equal"
    )
    text = (
        f"seed verdict: {best} does not beat {runner_up} on {metric} at 95% with the seeds "
        f"run (Welch's t = {signed:.2f}, needs > {critical:.2f}, df = {df:.1f}; seeds {a.n} "
        f"and {b.n}); {more}"
    )
    return Verdict(best, runner_up, False, signed, df, need, text)


def latex(comparison) -> str:
    """The comparison as a LaTeX ``tabular``: one row per group, the keys that differ, the
    metric's mean ± the 95% interval's half-width, and the number of seeds."""
    c = comparison
    cols = ["group", *c.keys, f"{c.metric} (mean $\\pm$ 95\\% CI)", "seeds"]
    lines = [
        "% written by python -m experiments.compare --latex",
        "\\begin{tabular}{" + "l" * (len(cols) - 2) + "rr}",
        "\\hline",
        " & ".join(_tex(h) if i < len(cols) - 2 else h for i, h in enumerate(cols)) + " \\\\",
        "\\hline",
    ]
    for group in c.groups:
        s = group.stats[c.metric]
        value = f"{s.mean:.4f}"
        if s.ci_high is not None:
            value += f" $\\pm$ {s.ci_high - s.mean:.4f}"
        if group is c.best:
            value = f"\\textbf{{{value}}}"
        keys = [_tex(str(group.config.get(k, "(absent)"))) for k in c.keys]
        lines.append(" & ".join([group.name, *keys, value, str(len(group.runs))]) + " \\\\")
    lines += ["\\hline", "\\end{tabular}", ""]
    return "\n".join(lines)


TEX_ESCAPES = str.maketrans({
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
    "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}",
})  # fmt: skip


def _tex(text: str) -> str:
    return text.translate(TEX_ESCAPES)
