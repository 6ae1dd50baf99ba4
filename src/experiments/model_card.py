"""``model_card.md``: what a trained model is, from what its run folder records -- the
data, the recipe and the exact command, test metrics with 95% intervals, per-class
numbers, calibration and the export check. Written when a run finishes; eval, calibrate
and export write it again with what they add. Reads only the run's own text files, as data
(its saved config is never resolved or instantiated), and writes every value that came from
the user (class names, file names, the command, anything in those files) escaped, so that a
class named ``<script>`` or ``| x |`` shows as text and cannot break a table or inject HTML
when the Markdown is rendered."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any

from experiments.errors import UserError
from experiments.runs.files import atomic_write, read_json_object, read_yaml
from experiments.runs.layout import RunDir

SPLITS = ("train", "val", "test")
# Markdown punctuation that could start markup inline or end a table cell; "<" and "&" are
# HTML-escaped first, so no raw HTML and no autolink survives
_MARKUP = re.compile(r"([\\`*_\[\]|~#!])")
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


def md_text(value: Any, limit: int = 200) -> str:
    """``value`` as inline Markdown text that renders as exactly that text: control
    characters and newlines become spaces, HTML is escaped, Markdown punctuation is
    backslash-escaped (``|`` too, so a table cell cannot be split), at most ``limit`` chars."""
    text = _printable(value, limit)
    return _MARKUP.sub(r"\\\1", html.escape(text, quote=False))


def md_code(value: Any, limit: int = 500) -> str:
    """``value`` as an inline code span: a fence longer than any run of backticks inside,
    so the span cannot be closed early (a code span's content is never HTML)."""
    text = _printable(value, limit)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _printable(value: Any, limit: int) -> str:
    text = "".join(ch if ch.isprintable() else " " for ch in str(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _num(value: Any, spec: str = ".4f") -> str:
    """A number from a run file, formatted; anything else in its place shows as ``?``."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        try:
            return format(value, spec)
        except ValueError:  # e.g. a float where a count ("d") was expected
            return format(value, "g")
    return "nan" if isinstance(value, float) else "?"


def calibration_temperature(layout: RunDir) -> float | None:
    """The temperature ``experiments.calibrate`` saved with the run, or None."""
    saved = read_json_object(layout.calibration)
    value = saved.get("temperature")
    return float(value) if isinstance(value, int | float) and value > 0 else None


def _select(cfg: dict, dotted: str, default: Any = None) -> Any:
    """``cfg[a][b]...`` of the saved config read as plain data; a value that is exactly a
    ``${key}`` reference to another plain key is followed (a few hops), and nothing else is
    resolved (no resolvers: ``${oc.env:...}`` stays text and reads no environment)."""
    value: Any = cfg
    for hop in range(5):
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        match = _INTERPOLATION.fullmatch(value) if isinstance(value, str) else None
        if match is None or hop == 4:
            break
        dotted, value = match.group(1), cfg
    return default if value is None else value


def _read_counts(path: Path) -> dict[str, dict[str, int]]:
    """``data_counts.json`` checked to be ``{split: {class name: count}}``."""
    counts = read_json_object(path)
    for split, row in counts.items():
        good = isinstance(row, dict) and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in row.values()
        )
        if split not in SPLITS or not good:
            raise UserError(
                f"{path}: expected {{split: {{class: count}}}} for splits {', '.join(SPLITS)}; "
                f"delete it (the next eval writes it again)"
            )
    return counts


def split_counts(datamodule) -> dict[str, dict[str, int]]:
    """Samples per class of each split, ``{"train": {"coat": 90, ...}, ...}``."""
    names = list(datamodule.class_names)
    counts = {}
    for split in SPLITS:
        subset = getattr(datamodule, f"{split}_set", None)
        targets = getattr(getattr(subset, "dataset", subset), "targets", None)
        if subset is None or targets is None:
            continue
        indices = getattr(subset, "indices", range(len(subset)))
        row = dict.fromkeys(names, 0)
        for i in indices:
            row[names[int(targets[i])]] += 1
        counts[split] = row
    return counts


def write_model_card(run_dir: str | Path, counts: dict | None = None) -> Path:
    """Write ``<run>/model_card.md`` from the run's files (``counts``: ``split_counts``,
    kept in the run's ``data_counts.json`` so later writers have them too)."""
    layout = RunDir(run_dir)
    counts_file = layout.path / "data_counts.json"
    if counts:
        atomic_write(counts_file, lambda f: f.write(json.dumps(counts, indent=1).encode()))
    counts = counts or _read_counts(counts_file)
    cfg = read_yaml(layout.saved_config, missing=None)
    cfg = cfg if isinstance(cfg, dict) else None
    metrics, evaluated = read_json_object(layout.metrics), read_json_object(layout.eval_metrics)
    lines = [f"# Model card: {md_text(layout.path.name)}", ""]
    lines += _data(cfg, counts)
    lines += _recipe(cfg, layout)
    lines += _results({**metrics, **evaluated}, counts.get("test"))
    lines += _calibration(read_json_object(layout.calibration), evaluated)
    lines += _export(read_json_object(layout.export_report))
    lines += [
        "## Reproduce",
        "",
        "Run the command above from the same commit (`env.json` records the commit, the diff",
        "when the tree was dirty, and the library versions).",
        "",
    ]
    return atomic_write(layout.model_card, lambda f: f.write("\n".join(lines).encode()))


def _data(cfg, counts: dict) -> list[str]:
    data = cfg.get("data") if cfg is not None else None
    data = data if isinstance(data, dict) else {}
    lines = ["## Data", ""]
    where = _select(cfg or {}, "data.csv_file") or data.get("dataset")
    image_dir = _select(cfg or {}, "data.image_dir")
    lines.append(
        f"- source: {md_code(where)}"
        + (f", images under {md_code(image_dir)}" if image_dir else "")
    )
    if counts:
        names = list(next(iter(counts.values())))
        lines.append(f"- {len(names)} classes: {', '.join(md_text(n) for n in names)}")
        for split, row in counts.items():
            absent = [n for n in names if not row.get(n)]
            if absent and sum(row.values()):
                shown = ", ".join(md_text(n) for n in absent[:10])
                lines.append(
                    f"- the {split} split has no sample of {len(absent)} classes ({shown}"
                    f"{', ...' if len(absent) > 10 else ''}): its macro metrics average only "
                    f"the classes it has"
                )
        lines += ["", "| class | " + " | ".join(counts) + " |", "|---|" + "---|" * len(counts)]
        for name in names:
            cells = " | ".join(str(counts[s].get(name, 0)) for s in counts)
            lines.append(f"| {md_text(name)} | {cells} |")
        totals = " | ".join(f"**{sum(counts[s].values())}**" for s in counts)
        lines.append(f"| all | {totals} |")
    return lines + [""]


def _recipe(cfg, layout: RunDir) -> list[str]:
    from experiments.secrets import redact_argv

    env = read_json_object(layout.env)
    command = env.get("command")
    command = [str(a) for a in command] if isinstance(command, list) else []
    args = redact_argv([a for a in command[1:] if not a.endswith(".py")])
    net = _select(cfg or {}, "model.net._target_", "?")
    name = _select(cfg or {}, "model.net.name")
    lines = ["## Recipe", ""]
    lines.append(f"- net: {md_code(name or net)}" + (f" ({md_code(net)})" if name else ""))
    lines.append(f"- command: {md_code(' '.join(['python -m experiments.train', *args]))}")
    lines.append(
        f"- commit: {md_code(env.get('git_commit'))}"
        + (" (with uncommitted changes)" if env.get("git_dirty") else "")
    )
    versions = ", ".join(
        f"{k} {md_text(env[k], 40)}" for k in ("torch", "lightning", "hydra") if env.get(k)
    )
    return lines + [f"- versions: {versions}", ""]


def _results(metrics: dict, test_counts: dict | None) -> list[str]:
    if "test/acc" not in metrics:
        return ["## Test results", "", "No test split was evaluated.", ""]
    n = sum(test_counts.values()) if test_counts else None
    lines = ["## Test results", ""]
    missing = metrics.get("test/missing_classes")
    if isinstance(missing, int | float) and missing > 0:
        lines += [
            f"The test split lacks {_num(missing, '.0f')} of the classes: its balanced "
            f"accuracy and macro-F1 average only the classes it has.",
            "",
        ]
    lines += ["| metric | value | 95% interval |", "|---|---|---|"]
    for key in ("test/acc", "test/balanced_acc", "test/macro_f1", "test/ece"):
        if key in metrics:
            interval = _interval(metrics[key], n) if key == "test/acc" else ""
            lines.append(f"| {key} | {_num(metrics[key])} | {interval} |")
    recall = {k.split("/", 2)[2]: v for k, v in metrics.items() if k.startswith("test/recall/")}
    if recall:
        lines += ["", "| class | precision | recall |", "|---|---|---|"]
        for name, value in recall.items():
            precision = metrics.get(f"test/precision/{name}", float("nan"))
            lines.append(f"| {md_text(name)} | {_num(precision)} | {_num(value)} |")
    return lines + [""]


def _interval(p: float, n: int | None) -> str:
    """Wilson's 95% interval of a proportion p over n samples."""
    if not n or not isinstance(p, int | float) or not 0 <= p <= 1:
        return ""
    z = 1.96
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return f"[{centre - half:.4f}, {centre + half:.4f}] (n={n})"


def _calibration(saved: dict, evaluated: dict) -> list[str]:
    lines = ["## Calibration", ""]
    if not saved:
        ece = evaluated.get("test/ece")
        note = f"test ECE {_num(ece)} (15 bins). " if ece is not None else ""
        return lines + [
            f"{note}Not temperature-scaled: run `experiments-calibrate run_dir=<run>`.",
            "",
        ]
    lines.append(
        f"Temperature scaling, T = {_num(saved.get('temperature'), '.3f')} (fitted on the "
        f"validation split):"
    )
    lines += ["", "| split | ECE before | ECE after |", "|---|---|---|"]
    for split in ("val", "test"):
        if f"{split}/ece_before" in saved:
            before, after = saved[f"{split}/ece_before"], saved.get(f"{split}/ece_after")
            lines.append(f"| {split} | {_num(before)} | {_num(after)} |")
    return lines + [""]


def _export(report: dict) -> list[str]:
    if not report:
        return []
    lines = ["## Export", ""]
    for fmt, check in report.items():
        if isinstance(check, dict):
            lines.append(
                f"- {md_text(fmt)}: {md_code(check.get('file'))}, max |difference| from "
                f"PyTorch {_num(check.get('max_abs_diff'), '.2e')} on "
                f"{_num(check.get('batch'), 'd')} test images; accuracy "
                f"{_num(check.get('acc_exported'))} (PyTorch {_num(check.get('acc_torch'))})"
            )
    return lines + [""]
