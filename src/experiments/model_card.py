"""``model_card.md``: what a trained model is, from what its run folder records -- the
data, the recipe and the exact command, test metrics with 95% intervals, per-class
numbers, calibration and the export check. Written when a run finishes; eval, calibrate
and export write it again with what they add. Reads only the run's own text files."""

from __future__ import annotations

import json
import math
from pathlib import Path

from omegaconf import OmegaConf

from experiments.runs.files import atomic_write, read_json_object
from experiments.runs.layout import RunDir

SPLITS = ("train", "val", "test")


def calibration_temperature(layout: RunDir) -> float | None:
    """The temperature ``experiments.calibrate`` saved with the run, or None."""
    saved = read_json_object(layout.calibration)
    value = saved.get("temperature")
    return float(value) if isinstance(value, int | float) and value > 0 else None


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
    counts = counts or read_json_object(counts_file)
    cfg = OmegaConf.load(layout.saved_config) if layout.saved_config.is_file() else None
    metrics, evaluated = read_json_object(layout.metrics), read_json_object(layout.eval_metrics)
    lines = [f"# Model card: {layout.path.name}", ""]
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
    data = cfg.get("data", {}) if cfg is not None else {}
    lines = ["## Data", ""]
    where = data.get("csv_file") or data.get("dataset")
    lines.append(
        f"- source: `{where}`"
        + (f", images under `{data.get('image_dir')}`" if data.get("image_dir") else "")
    )
    if counts:
        names = list(next(iter(counts.values())))
        lines.append(f"- {len(names)} classes: {', '.join(names)}")
        lines += ["", "| class | " + " | ".join(counts) + " |", "|---|" + "---|" * len(counts)]
        for name in names:
            lines.append(f"| {name} | " + " | ".join(str(counts[s][name]) for s in counts) + " |")
        totals = " | ".join(f"**{sum(counts[s].values())}**" for s in counts)
        lines.append(f"| all | {totals} |")
    return lines + [""]


def _recipe(cfg, layout: RunDir) -> list[str]:
    env = read_json_object(layout.env)
    command = env.get("command") or []
    args = [a for a in command[1:] if not a.endswith(".py")] if command else []
    net = OmegaConf.select(cfg, "model.net._target_", default="?") if cfg is not None else "?"
    name = OmegaConf.select(cfg, "model.net.name", default=None) if cfg is not None else None
    lines = ["## Recipe", ""]
    lines.append(f"- net: `{name or net}`" + (f" (`{net}`)" if name else ""))
    lines.append(f"- command: `python -m experiments.train {' '.join(args)}`")
    lines.append(
        f"- commit: `{env.get('git_commit')}`"
        + (" (with uncommitted changes)" if env.get("git_dirty") else "")
    )
    versions = ", ".join(f"{k} {env[k]}" for k in ("torch", "lightning", "hydra") if env.get(k))
    return lines + [f"- versions: {versions}", ""]


def _results(metrics: dict, test_counts: dict | None) -> list[str]:
    if "test/acc" not in metrics:
        return ["## Test results", "", "No test split was evaluated.", ""]
    n = sum(test_counts.values()) if test_counts else None
    lines = ["## Test results", "", "| metric | value | 95% interval |", "|---|---|---|"]
    for key in ("test/acc", "test/balanced_acc", "test/macro_f1", "test/ece"):
        if key in metrics:
            interval = _interval(metrics[key], n) if key == "test/acc" else ""
            lines.append(f"| {key} | {metrics[key]:.4f} | {interval} |")
    recall = {k.split("/", 2)[2]: v for k, v in metrics.items() if k.startswith("test/recall/")}
    if recall:
        lines += ["", "| class | precision | recall |", "|---|---|---|"]
        for name, value in recall.items():
            precision = metrics.get(f"test/precision/{name}", float("nan"))
            lines.append(f"| {name} | {precision:.4f} | {value:.4f} |")
    return lines + [""]


def _interval(p: float, n: int | None) -> str:
    """Wilson's 95% interval of a proportion p over n samples."""
    if not n:
        return ""
    z = 1.96
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return f"[{centre - half:.4f}, {centre + half:.4f}] (n={n})"


def _calibration(saved: dict, evaluated: dict) -> list[str]:
    lines = ["## Calibration", ""]
    if not saved:
        ece = evaluated.get("test/ece")
        note = f"test ECE {ece:.4f} (15 bins). " if ece is not None else ""
        return lines + [
            f"{note}Not temperature-scaled: run `experiments-calibrate run_dir=<run>`.",
            "",
        ]
    lines.append(
        f"Temperature scaling, T = {saved['temperature']:.3f} (fitted on the validation split):"
    )
    lines += ["", "| split | ECE before | ECE after |", "|---|---|---|"]
    for split in ("val", "test"):
        if f"{split}/ece_before" in saved:
            before, after = saved[f"{split}/ece_before"], saved[f"{split}/ece_after"]
            lines.append(f"| {split} | {before:.4f} | {after:.4f} |")
    return lines + [""]


def _export(report: dict) -> list[str]:
    if not report:
        return []
    lines = ["## Export", ""]
    for fmt, check in report.items():
        if isinstance(check, dict):
            lines.append(
                f"- {fmt}: `{check.get('file')}`, max |difference| from PyTorch "
                f"{check.get('max_abs_diff'):.2e} on {check.get('batch')} test images; accuracy "
                f"{check.get('acc_exported'):.4f} (PyTorch {check.get('acc_torch'):.4f})"
            )
    return lines + [""]
