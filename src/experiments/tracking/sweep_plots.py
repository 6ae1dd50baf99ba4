"""The sweep summary's static plots.

``parallel.png`` draws every finished job as a line across the swept keys and the metric;
``contour.png`` the metric over the two most important keys (a filled contour when their
values span a plane, else points); ``summary.png`` the metric by the one swept key. Each is
redrawn from every finished job whenever the summary is rebuilt (the sweep's end, a resume),
and removed when it no longer applies, so no plot shows an earlier state of the sweep.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib import colormaps
from matplotlib.figure import Figure

from experiments.runs.files import atomic_write
from experiments.runs.layout import SweepDir
from experiments.tracking.importance import swept


def draw(sweep_dir: Path, done: list[dict], keys: list[str], metric: str, top: list[str]) -> str:
    """Draw ``parallel.png`` from the finished jobs ``done`` across the swept ``keys``, and
    ``contour.png`` over ``top`` (the two most important keys) when there are two; remove
    those not drawn now. Returns the files drawn, as ``` `a.png`, `b.png` ```."""
    sweep = SweepDir(sweep_dir)
    plotted = [_parallel(done, keys, metric, sweep.parallel_png)] if done else []
    if done and len(top) == 2:
        plotted.append(_contour(done, top, metric, sweep.contour_png))
    for stale in (sweep.parallel_png, sweep.contour_png):
        if stale.name not in plotted:
            stale.unlink(missing_ok=True)
    return ", ".join(f"`{p}`" for p in plotted)


def _numeric(values: list[Any]) -> tuple[list[float], list[str] | None]:
    """Values as numbers; categorical ones as their index, with the labels."""
    try:
        return [float(v) for v in values], None
    except (TypeError, ValueError):
        labels = sorted({str(v) for v in values})
        return [float(labels.index(str(v))) for v in values], labels


def _parallel(done: list[dict], keys: list[str], metric: str, path: Path) -> str:
    axes = [*keys, metric]
    columns = [_numeric([r.get(a) for r in done]) for a in axes]
    scaled = []
    for values, _ in columns:
        low, high = min(values), max(values)
        scaled.append([(v - low) / (high - low) if high > low else 0.5 for v in values])
    scores = [r[metric] for r in done]
    low, high = min(scores), max(scores)
    cmap = colormaps["viridis"]
    fig = Figure(figsize=(max(5, 1.6 * len(axes)), 4))
    ax = fig.add_subplot()
    for i in range(len(done)):
        shade = (scores[i] - low) / (high - low) if high > low else 1.0
        ax.plot(range(len(axes)), [col[i] for col in scaled], color=cmap(shade), alpha=0.8)
    ax.set_xticks(range(len(axes)), [a.split(".")[-1] for a in axes], rotation=20)
    for j, (values, labels) in enumerate(columns):
        ends = labels[:1] + labels[-1:] if labels else [f"{min(values):.3g}", f"{max(values):.3g}"]
        ax.text(j, -0.08, ends[0], ha="center", va="top", fontsize=7)
        ax.text(j, 1.08, ends[-1], ha="center", va="bottom", fontsize=7)
    ax.set(ylim=(-0.2, 1.2), yticks=[])
    ax.set_title(f"{len(done)} jobs, colour = {metric} (yellow best when higher)", fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    return path.name


def _contour(done: list[dict], keys: list[str], metric: str, path: Path) -> str:
    (xs, xl), (ys, yl) = (_numeric([r.get(k) for r in done]) for k in keys)
    names = list(keys)
    for i, (values, labels) in enumerate(((xs, xl), (ys, yl))):
        if not labels and min(values) > 0 and max(values) / min(values) >= 20:
            values[:] = [math.log10(v) for v in values]  # spans decades: drawn in log10
            names[i] = f"log10 {keys[i]}"
    zs = [r[metric] for r in done]
    fig = Figure(figsize=(5, 4))
    ax = fig.add_subplot()
    try:
        filled = ax.tricontourf(xs, ys, zs, levels=12, cmap="viridis")
    except (ValueError, RuntimeError):  # too few points, or all on a line
        filled = None
    points = ax.scatter(xs, ys, c=zs, cmap="viridis", edgecolors="black", linewidths=0.5)
    fig.colorbar(filled or points, ax=ax, label=metric)
    for axis, labels, name in ((ax.xaxis, xl, names[0]), (ax.yaxis, yl, names[1])):
        if labels:
            axis.set_ticks(range(len(labels)), labels)
        axis.set_label_text(name)
    ax.set_title(f"{metric} over the two most important keys", fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    return path.name


def plot_one_key(rows, metric: str, path: Path) -> None:
    """``summary.png``: the metric of every finished job by the swept key's value, when
    exactly one key other than seeds varies (each seed a point, their mean the line); the
    file is removed when that does not hold (any more)."""
    done, keys = swept(rows, metric)
    if len(keys) != 1:
        path.unlink(missing_ok=True)  # drawn for an earlier state of the sweep, or never
        return
    (key,) = keys
    points = [(str(r.get(key)), r[metric]) for r in done]
    by_value: dict[str, list[float]] = {}
    for setting, value in points:
        by_value.setdefault(setting, []).append(value)
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    try:
        xs = {s: float(s) for s in by_value}
    except ValueError:  # categorical values: their mean as a bar, each job a point
        names = sorted(by_value)
        ax.bar(names, [sum(by_value[n]) / len(by_value[n]) for n in names], alpha=0.6)
        ax.scatter([s for s, _ in points], [v for _, v in points], color="black", zorder=3)
    else:
        line = sorted((xs[s], sum(v) / len(v)) for s, v in by_value.items())
        ax.plot(*zip(*line, strict=True), marker="o")
        if len(points) > len(by_value):  # seeds: each job a point around the mean
            ax.scatter([xs[s] for s, _ in points], [v for _, v in points], color="black", s=12)
        if min(xs.values()) > 0 and max(xs.values()) / min(xs.values()) >= 20:
            ax.set_xscale("log")
    ax.set(xlabel=key, ylabel=metric, title=f"{metric} by {key} ({len(points)} finished jobs)")
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
