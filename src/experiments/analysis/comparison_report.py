"""The comparison as compare.md, compare.csv and compare.png."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from experiments.analysis.groups import Comparison, Group
from experiments.analysis.readings import Value, read_curve, show_path, value_text
from experiments.analysis.significance import Stats
from experiments.analysis.verdict import latex
from experiments.errors import UserError
from experiments.runs.files import atomic_write
from experiments.runs.layout import BEST_SIDECAR, CHECKPOINTS
from experiments.runs.notes import read_tags
from experiments.tracking.sweep_summary import markdown_table
from experiments.tracking.sweep_summary import table_cell as cell

CURVE_METRIC = "val/acc"
MAX_LEGEND = 12


def _config_cell(group: Group, key: str) -> str:
    return value_text(group.config[key]) if key in group.config else "(absent)"


def marker(comparison: Comparison, group: Group) -> str:
    if group is comparison.best:
        return "best"
    return "tie" if group.name in comparison.tied else ""


def epochs_text(values: list[Value]) -> str:
    """Which epoch each run's value is from: ``best 3, 2, 3`` (each run's selected epoch),
    ``last 5, 5`` (last epochs), mixed runs each labelled."""
    sources = {v.source for v in values}
    if sources == {""}:
        return ""
    if len(sources) == 1:
        (source,) = sources
        if all(v.epoch is None for v in values):  # metrics.json without "epochs"
            return source
        epochs = [str(v.epoch) if v.epoch is not None else "?" for v in values]
        return f"{source} {', '.join(epochs)}"
    return ", ".join(v.label or "-" for v in values)


def mean_std(s: Stats) -> str:
    return cell(s.mean) if s.std is None else f"{cell(s.mean)} ± {cell(s.std)}"


def interval(s: Stats) -> str:
    return "—" if s.ci_low is None else f"[{cell(s.ci_low)}, {cell(s.ci_high)}]"


def _where(values: list[Value]) -> str:
    """A cell's suffix when a value is not of the selected epoch: `` (last)``."""
    sources = {v.source for v in values}
    if "last" not in sources:
        return ""
    return " (last)" if sources == {"last"} else " (some last)"


def markdown(comparison: Comparison, runs_section: bool = True) -> str:
    """``compare.md``: heading, the table (one row per group), the verdict, notes, skips,
    runs per group."""
    c = comparison
    n_runs = sum(len(g.runs) for g in c.groups)
    better = "higher" if c.mode == "max" else "lower"
    if c.keys:
        differ = "groups differ in: " + ", ".join(f"`{k}`" for k in c.keys)
    else:
        differ = "all runs share one config"
    lines = [
        f"# Compare: {c.metric} ({better} is better)",
        "",
        f"{n_runs} runs in {len(c.groups)} group{'s' if len(c.groups) != 1 else ''}; "
        f"{differ}. Grouped by the saved config without replicate keys (seed, *.seed, "
        f"*_seed), paths, hydra, task_name, tags, resume{''.join(f', {k}' for k in c.ignore)} "
        f"and per-run output locations. Ranked by {c.metric} ({c.chosen_by}) at each run's "
        f"selected epoch.",
        "",
    ]
    head = ["group", *c.keys, "n"]
    for m in c.metrics:
        head += [f"{m} mean ± std", *([f"{m} 95% CI", "epoch"] if m == c.metric else [])]
    rows = []
    for group in c.groups:
        mark = marker(c, group)
        row = [f"{group.name} ({mark})" if mark else group.name]
        row += [_config_cell(group, k) for k in c.keys] + [len(group.runs)]
        for m in c.metrics:
            row.append(mean_std(group.stats[m]) + _where(group.values[m]))
            if m == c.metric:
                row += [interval(group.stats[m]), epochs_text(group.values[m]) or "—"]
        rows.append(row)
    lines += markdown_table(head, rows)
    bounded = c.groups[0].stats[c.metric].bounds
    ci = "the t interval kept inside [0, 1], the metric's range" if bounded else "Student's t"
    lines += [
        "",
        f"Epochs: `best N` is each run's selected epoch, the one the best checkpoint keeps "
        f"({CHECKPOINTS}/{BEST_SIDECAR}); test metrics are of those weights; `last N` and (last) "
        f"mark a last-epoch value (a run that kept no best checkpoint). 95% CI of the mean "
        f"over seeds: {ci}. Test metrics are shown, never used to rank.",
    ]
    if c.verdict is not None:
        lines += ["", c.verdict.text[0].upper() + c.verdict.text[1:] + "."]
    notes = _notes(c)
    if notes:
        lines += [""] + [f"Note: {n}" for n in notes]
    if c.skipped:
        runs = "run" if len(c.skipped) == 1 else "runs"
        lines += ["", f"skipped {len(c.skipped)} {runs}:"]
        lines += [f"- {cell(show_path(p))}: {cell(why)}" for p, why in c.skipped]
    if runs_section:
        lines += ["", "## Runs", ""]
        for group in c.groups:
            seeds = ", ".join(value_text(s) for s in group.seeds)
            lines.append(f"- {group.name} (seeds {seeds}):")
            for run in group.runs:  # its tags: given at launch and by experiments-runs tag
                tags = read_tags(run.path)
                shown = f" [tags: {cell(', '.join(tags))}]" if tags else ""
                lines.append(f"  - {show_path(run.path)}{shown}")
    return "\n".join(lines) + "\n"


def _notes(c: Comparison) -> list[str]:
    notes = []
    if c.metric.startswith("test/"):
        notes.append(
            f"ranked by {c.metric}, a test metric: choosing settings on the test set makes "
            f"its numbers optimistic; rank by the validation metric (compare's default) and "
            f"report test beside it."
        )
    single = [g.name for g in c.groups if len(g.runs) == 1]
    if single:
        notes.append(f"{', '.join(single)}: one run only, no std or CI.")
    for group in c.groups:
        seeds = [value_text(s) for s in group.seeds]
        if len(set(seeds)) < len(seeds):
            notes.append(
                f"{group.name} has runs with the same seed ({', '.join(seeds)}): "
                f"they are not independent samples."
            )
    return notes


def csv_text(comparison: Comparison) -> str:
    """``compare.csv``: one row per group, full precision, empty where n=1 has no std/CI;
    ``verdict`` is ``best`` (a winner at 95%), ``tie`` (tied at the top) or empty."""
    c = comparison
    head = ["group", "verdict", *c.keys, "n", "seeds"]
    for m in c.metrics:
        head += [f"{m} mean", f"{m} std", f"{m} ci95_low", f"{m} ci95_high", f"{m} epochs"]
    head.append("runs")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(head)
    for group in c.groups:
        row: list[Any] = [group.name, marker(c, group)]
        row += [_config_cell(group, k) for k in c.keys]
        row += [len(group.runs), " ".join(value_text(s) for s in group.seeds)]
        for m in c.metrics:
            s = group.stats[m]
            row += [repr(v) if v is not None else "" for v in (s.mean, s.std, s.ci_low, s.ci_high)]
            labels = [v.label.replace(" ", ":") for v in group.values[m]]
            row.append(" ".join(labels) if any(labels) else "")
        row.append(" ".join(str(r.path.resolve()) for r in group.runs))
        writer.writerow(row)
    return buf.getvalue()


def plot_curves(comparison: Comparison, path: Path, column: str = CURVE_METRIC) -> int:
    """Write ``column`` by epoch per group (mean line, min–max band); return how many runs
    had a curve (0: nothing written)."""
    c = comparison
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    handles, n_curves = [], 0
    for i, group in enumerate(c.groups):
        curves = [cv for cv in (read_curve(r.path, column) for r in group.runs) if cv]
        n_curves += len(curves)
        if not curves:
            continue
        epochs = sorted(set().union(*curves))
        at = [[cv[e] for cv in curves if e in cv] for e in epochs]
        color = f"C{i % 10}"
        mark = marker(c, group)
        label = group.name + (f" ({mark})" if mark else "")
        if c.keys:
            label += ": " + ", ".join(f"{k}={_config_cell(group, k)}" for k in c.keys)
        label = label if len(label) <= 70 else label[:67] + "..."
        (line,) = ax.plot(
            epochs,
            [math.fsum(v) / len(v) for v in at],
            color=color,
            lw=2.2 if mark else 1.3,
            marker="o" if len(epochs) <= 30 else None,
            ms=3,
            label=f"{label} (n={len(group.runs)})",
        )
        ax.fill_between(
            epochs, [min(v) for v in at], [max(v) for v in at], color=color, alpha=0.15, lw=0
        )
        handles.append(line)
    if not handles:
        return 0
    ax.set(xlabel="epoch", ylabel=column)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.set_title(f"{column} by epoch: mean per group, band = min–max over its runs", fontsize=10)
    more = len(handles) - MAX_LEGEND
    ax.legend(
        handles=handles[:MAX_LEGEND],
        fontsize=7,
        title=f"+{more} more groups" if more > 0 else None,
        title_fontsize=7,
    )
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    return n_curves


def write_report(
    comparison: Comparison, out: str | Path, tex: bool = False, confirmation: Any = None
) -> list[str]:
    """Write compare.md, compare.csv and compare.png (and compare.tex with ``tex``) into
    ``out``; return lines to print. ``confirmation`` (``analysis.confirm.Confirmation``)
    adds its section to compare.md."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"out={out} is a file, not a folder")
    md = markdown(comparison)
    if confirmation is not None:
        md += "\n" + confirmation.markdown(comparison)
    texts = {"compare.md": md, "compare.csv": csv_text(comparison)}
    if tex:
        texts["compare.tex"] = latex(comparison)
    for name, text in texts.items():
        atomic_write(out / name, lambda f, text=text: f.write(text.encode()))
    wrote = [str(out / name) for name in texts]
    column = comparison.metric if comparison.metric.startswith("val/") else CURVE_METRIC
    n_runs = sum(len(g.runs) for g in comparison.groups)
    png = out / "compare.png"
    n_curves = plot_curves(comparison, png, column)
    if n_curves:
        wrote.append(str(png))
        return [f"wrote {', '.join(wrote)} ({column} curves of {n_curves} of {n_runs} runs)"]
    png.unlink(missing_ok=True)  # an older plot would not belong to this table
    return [f"wrote {', '.join(wrote)}; no compare.png: no run has {column} in csv/metrics.csv"]
