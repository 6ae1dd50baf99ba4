"""Why the winner won: parameter importance and two static plots of a sweep.

Importance is Optuna's fANOVA (``optuna.importance``) for an Optuna search, written by the
sweeper into ``optimization_results.yaml``; for a grid it is each swept key's spread: the
largest minus the smallest mean of the metric over the jobs that share one of its values.
``parallel.png`` draws every finished job as a line across the swept keys and the metric;
``contour.png`` the metric over the two most important keys (a filled contour when their
values span a plane, else points).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from experiments.runs.files import atomic_write

PARALLEL, CONTOUR = "parallel.png", "contour.png"
# keys that only replicate a setting: never a hyperparameter (no importance, no axis in the
# plots; a contour between seed 0 and seed 1 means nothing)
REPLICATE_KEYS = frozenset({"seed", "+seed"})


def is_replicate(key: str) -> bool:
    """``seed`` (any section's, e.g. ``data.split_seed``) replicates a run; not a setting."""
    name = key.lstrip("+~").rsplit(".", 1)[-1]
    return key in REPLICATE_KEYS or name == "seed" or name.endswith("_seed")


def swept(rows: list[dict[str, Any]], metric: str) -> tuple[list[dict], list[str]]:
    """The finished rows as ``{key: value, ..., metric: number}`` and the keys that vary."""
    done = []
    for row in rows:
        value = row.get(metric)
        if not isinstance(value, int | float) or not math.isfinite(value):
            continue
        setting = dict(item.partition("=")[::2] for item in str(row["overrides"]).split())
        done.append({**setting, metric: float(value)})
    keys = sorted({k for r in done for k in r if k != metric and not is_replicate(k)})
    varying = [k for k in keys if len({r.get(k) for r in done}) > 1]
    return done, varying


def spread(done: list[dict], keys: list[str], metric: str) -> dict[str, float]:
    """Per key: max minus min, over its values, of the mean metric of the jobs with it."""
    out = {}
    for key in keys:
        by_value: dict[Any, list[float]] = {}
        for row in done:
            by_value.setdefault(row.get(key), []).append(row[metric])
        means = [sum(v) / len(v) for v in by_value.values()]
        out[key] = max(means) - min(means)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def section(sweep_dir: Path, rows: list[dict], metric: str, fanova: dict | None) -> str:
    """The summary's importance table (and the two plots, written next to it)."""
    done, keys = swept(rows, metric)
    if len(done) < 2 or not keys:
        return ""
    if fanova:
        importance = {k: float(v) for k, v in fanova.items() if not is_replicate(k)}
        how = "Optuna's fANOVA importance (share of the metric's variance each parameter explains)"
    else:
        importance = spread(done, keys, metric)
        how = f"spread: the best minus the worst mean {metric} over each key's values"
    lines = ["", "## Parameter importance", "", how + ".", "", "| key | importance |", "|---|---|"]
    lines += [f"| {k} | {v:.4f} |" for k, v in importance.items()]
    top = [k for k in importance if k in keys][:2] or keys[:2]
    plotted = [_parallel(done, keys, metric, Path(sweep_dir) / PARALLEL)]
    if len(top) == 2:
        plotted.append(_contour(done, top, metric, Path(sweep_dir) / CONTOUR))
    lines += ["", "Plots: " + ", ".join(f"`{p}`" for p in plotted if p) + "."]
    return "\n".join(lines) + "\n"


def _numeric(values: list[Any]) -> tuple[list[float], list[str] | None]:
    """Values as numbers; categorical ones as their index, with the labels."""
    try:
        return [float(v) for v in values], None
    except (TypeError, ValueError):
        labels = sorted({str(v) for v in values})
        return [float(labels.index(str(v))) for v in values], labels


def _parallel(done: list[dict], keys: list[str], metric: str, path: Path) -> str:
    from matplotlib import colormaps
    from matplotlib.figure import Figure

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
    ax.set_ylim(-0.2, 1.2)
    ax.set_yticks([])
    ax.set_title(f"{len(done)} jobs, colour = {metric} (yellow best when higher)", fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    return path.name


def _contour(done: list[dict], keys: list[str], metric: str, path: Path) -> str:
    from matplotlib.figure import Figure

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


def _one_key(rows) -> str | None:
    """The one override key whose value differs between jobs, if there is exactly one."""
    values: dict[str, set[str]] = {}
    for row in rows:
        for item in row["overrides"].split():
            key, _, value = item.partition("=")
            values.setdefault(key, set()).add(value)
    varying = [k for k, v in values.items() if len(v) > 1]
    return varying[0] if len(varying) == 1 else None


def plot_one_key(rows, metric: str, path: Path) -> None:
    """``summary.png``: the metric by the swept key's value, when exactly one key varies."""
    key = _one_key(rows)
    if key is None:
        return
    from matplotlib.figure import Figure

    points = []
    for row in rows:
        value = row.get(metric)
        if not isinstance(value, int | float):
            continue
        setting = dict(i.partition("=")[::2] for i in row["overrides"].split())[key]
        points.append((setting, value))
    if not points:
        return
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    try:
        numeric = sorted((float(s), v) for s, v in points)
        ax.plot(*zip(*numeric, strict=True), marker="o")
        xs = [x for x, _ in numeric]
        if min(xs) > 0 and max(xs) / min(xs) >= 20:
            ax.set_xscale("log")
    except ValueError:  # categorical values
        ax.bar([s for s, _ in points], [v for _, v in points])
    ax.set_xlabel(key)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} by {key}")
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
