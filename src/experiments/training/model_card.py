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
from collections import Counter
from pathlib import Path
from typing import Any

from experiments.errors import UserError, printable_line
from experiments.runs.files import read_json_object, read_yaml, write_text
from experiments.runs.layout import (
    ENV,
    METRICS,
    RunDir,
    checkpoint_label,
    own_role,
    read_sidecar,
    recorded_epoch,
)
from experiments.runs.notes import read_tags
from experiments.secrets import redact_argv

SPLITS = ("train", "val", "test")
# a classifier's test table; a run with none of them shows every test/* value it has
CLASSIFIER_KEYS = ("test/acc", "test/balanced_acc", "test/macro_f1", "test/ece")
# Markdown punctuation that could start markup inline or end a table cell; "<" and "&" are
# HTML-escaped first, so no raw HTML and no autolink survives
_MARKUP = re.compile(r"([\\`*_\[\]|~#!])")
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


def md_text(value: Any, limit: int = 200) -> str:
    """``value`` as inline Markdown text that renders as exactly that text: control
    characters and newlines become spaces, HTML is escaped, Markdown punctuation is
    backslash-escaped (``|`` too, so a table cell cannot be split), at most ``limit`` chars."""
    text = printable_line(value, limit)
    return _MARKUP.sub(r"\\\1", html.escape(text, quote=False))


def md_code(value: Any, limit: int = 500) -> str:
    """``value`` as an inline code span: a fence longer than any run of backticks inside,
    so the span cannot be closed early (a code span's content is never HTML)."""
    text = printable_line(value, limit)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _num(value: Any, spec: str = ".4f") -> str:
    """A number from a run file, formatted; anything else in its place shows as ``?``."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        try:
            return format(value, spec)
        except ValueError:  # e.g. a float where a count ("d") was expected
            return format(value, "g")
    return "nan" if isinstance(value, float) else "?"


def _label(name: Any, epoch: Any) -> str:
    """``checkpoint_label`` for the card: a name that is not ours came from a file."""
    return checkpoint_label(name if own_role(name) else md_code(name), epoch)


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
    """Samples per class of each split, ``{"train": {"coat": 90, ...}, ...}``; ``{}`` for
    data without classes (a task of your own)."""
    names = list(getattr(datamodule, "class_names", None) or [])
    if not names:
        return {}
    counts = {}
    for split in SPLITS:
        subset = getattr(datamodule, f"{split}_set", None)
        targets = getattr(getattr(subset, "dataset", subset), "targets", None)
        if subset is None or targets is None:
            continue
        indices = getattr(subset, "indices", range(len(subset)))
        found = Counter(names[int(targets[i])] for i in indices)
        counts[split] = {name: found[name] for name in names}
    return counts


def write_model_card(run_dir: str | Path, counts: dict | None = None) -> Path:
    """Write ``<run>/model_card.md`` whole from the run's files (``counts``: ``split_counts``,
    kept in the run's ``data_counts.json`` so later writers have them too).

    Every number names its checkpoint (the best or last weights with its epoch), split and
    sample count; written whole each time, it never mixes an old card with a new file.
    """
    layout = RunDir(run_dir)
    counts_file = layout.data_counts
    if counts:
        write_text(counts_file, json.dumps(counts, indent=1))
    counts = counts or _read_counts(counts_file)
    n = {split: sum(row.values()) for split, row in counts.items()}
    cfg = read_yaml(layout.saved_config, missing=None)
    cfg = cfg if isinstance(cfg, dict) else {}
    metrics = read_json_object(layout.metrics)
    best, last = read_sidecar(layout.best_json), read_sidecar(layout.last_json)
    lines = [f"# Model card: {md_text(layout.path.name)}", ""]
    lines += _data(cfg, counts)
    lines += _output(cfg, best or last, metrics)
    lines += _recipe(cfg, layout, metrics)
    lines += _checkpoints(layout, best, last, n.get("val"))
    lines += _results(layout, metrics, best, last, n.get("test"))
    lines += _calibration(layout, read_json_object(layout.calibration), best, last)
    lines += _export(layout, read_json_object(layout.export_report))
    lines += [
        "## Reproduce",
        "",
        f"Run the command above from the same commit (`{ENV}` records the commit, the diff",
        "when the tree was dirty, and the library versions).",
        "",
    ]
    return write_text(layout.model_card, "\n".join(lines))


def _data(cfg: dict, counts: dict) -> list[str]:
    data = cfg.get("data") if isinstance(cfg.get("data"), dict) else {}
    lines = ["## Data", ""]
    # a data module of your own has neither: it is named by its target
    where = _select(cfg, "data.csv_file") or data.get("dataset") or data.get("_target_")
    image_dir = _select(cfg, "data.image_dir")
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


# the task of a saved config without a model.net (a classifier's), by its module's target
TASKS = {
    "experiments.models.regression.RegressionModule": "regression",
    "experiments.models.segmentation.SegmentationModule": "segmentation",
}


def _names(values: Any, limit: int = 20) -> str:
    values = values if isinstance(values, list) else []
    shown = ", ".join(md_text(v, 80) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def _output(cfg: dict, sidecar: dict, metrics: dict) -> list[str]:
    """What one prediction of this model is, for its task: what ``experiments.predict``
    writes and how to read it."""
    target = _select(cfg, "model._target_")
    task = "classification" if _select(cfg, "model.net._target_") else TASKS.get(target, "own")
    classes = sidecar.get("class_names")
    lines = ["## Output", ""]
    if task == "classification":
        lines.append(
            "- one class per image, with its softmax probability (`experiments.predict` writes "
            "file,predicted,probability)"
            + (f"; {len(classes)} classes: {_names(classes)}" if isinstance(classes, list) else "")
        )
    elif task == "regression":
        target = sidecar.get("target") if isinstance(sidecar.get("target"), dict) else {}
        column = target.get("column")
        what = f"the column {md_code(column)}" if column else "the data's target"
        if not column and _select(cfg, "data.csv_file") is None:
            what = "disease progression a year on (scikit-learn's diabetes set)"
        lines.append(
            f"- one number per row: {what}, in its own units (the standardization the model "
            f"trains in is undone); `experiments.predict` reads a CSV and writes row,predicted"
        )
        if "mean" in target:
            lines.append(
                f"- the target on the train split: mean {_num(target.get('mean'), '.4g')}, "
                f"standard deviation {_num(target.get('std'), '.4g')} (an MAE is read "
                f"against the latter)"
            )
        features = sidecar.get("feature_names")
        if isinstance(features, list):
            lines.append(f"- from {len(features)} feature columns: {_names(features)}")
    elif task == "segmentation":
        named = (
            f"{len(classes)} classes, index: name: "
            + ", ".join(f"{i}: {md_text(n, 80)}" for i, n in enumerate(classes[:50]))
            if isinstance(classes, list)
            else "classes as the data numbers them"
        )
        lines.append(
            f"- one class per pixel, {named}; `experiments.predict` writes a PNG mask of "
            f"these indices per image, at the image's size"
        )
        if "test/miou" in metrics:
            lines.append(
                f"- test mIoU {_num(metrics['test/miou'])} (intersection over union per image "
                f"and class present, averaged), Dice {_num(metrics.get('test/dice'))}"
            )
    else:
        lines.append(
            f"- what the module's own code returns ({md_code(target)}"
            "): predict and export do not know it; eval tests it with its own test_step"
        )
    return lines + [""]


def _recipe(cfg: dict, layout: RunDir, metrics: dict) -> list[str]:
    env = read_json_object(layout.env)
    command = env.get("command")
    command = [str(a) for a in command] if isinstance(command, list) else []
    args = redact_argv([a for a in command[1:] if not a.endswith(".py")])
    # a module of your own has no model.net: it is named by its own target
    net = _select(cfg, "model.net._target_") or _select(cfg, "model._target_", "?")
    name = _select(cfg, "model.net.name")
    lines = ["## Recipe", ""]
    lines.append(f"- net: {md_code(name or net)}" + (f" ({md_code(net)})" if name else ""))
    lines.append(f"- command: {md_code(' '.join(['python -m experiments.train', *args]))}")
    tags = read_tags(layout.path, cfg)  # the config read above
    if tags:
        lines.append(f"- tags: {', '.join(md_code(t) for t in tags)} (as of this card's writing)")
    if isinstance(metrics.get("loss"), str):
        lines.append(f"- loss: {md_code(metrics['loss'])}")
    if isinstance(metrics.get("loss_note"), str):
        lines.append(f"- note on the loss: {md_text(metrics['loss_note'], 500)}")
    lines.append(
        f"- commit: {md_code(env.get('git_commit'))}"
        + (" (with uncommitted changes)" if env.get("git_dirty") else "")
    )
    versions = ", ".join(
        f"{k} {md_text(env[k], 40)}" for k in ("torch", "lightning", "hydra") if env.get(k)
    )
    return lines + [f"- versions: {versions}", ""]


def _n(count: Any) -> str:
    return f"n={count}" if isinstance(count, int) and not isinstance(count, bool) else "n=?"


def _checkpoints(layout: RunDir, best: dict, last: dict, n_val: int | None) -> list[str]:
    """Which epoch the best weights hold and why, the warnings about the split that chose it,
    and the last epoch's value of the same metric, labelled as the last one."""
    if not best and not last:
        return []
    lines = ["## Checkpoints", ""]

    def holds(weights: Path, sidecar: dict) -> str:
        return (
            f"{_label(weights.name, recorded_epoch(sidecar))}, "
            f"{md_text(sidecar.get('monitor', '?'))} = {_num(sidecar.get('value'))} on the "
            f"validation split ({_n(n_val)})"
        )

    if best:
        lines.append(
            f"- selected: {holds(layout.best_weights, best)}; eval, predict, calibrate and "
            f"export use it unless given ckpt="
        )
        if best.get("reason") is not None:
            lines.append(f"- why this epoch: {md_text(best['reason'], 300)}")
        warnings = best.get("warnings")
        for warning in warnings if isinstance(warnings, list) else []:
            lines.append(f"- warning: {md_text(warning, 300)}")
    if last:
        lines.append(
            f"- last epoch: {holds(layout.last_weights, last)} (the last epoch's value, not "
            f"the selected one)"
        )
    return lines + [""]


def evaluations(layout: RunDir) -> dict[str, dict]:
    """``experiments.eval``'s results by checkpoint name, from ``eval_metrics.json`` (its
    ``evaluations``; a file from before they were kept is the one checkpoint it names)."""
    saved = read_json_object(layout.eval_metrics)
    kept = saved.get("evaluations")
    if isinstance(kept, dict):
        return {str(k): v for k, v in kept.items() if isinstance(v, dict)}
    if not saved:
        return {}
    name = saved.get("ckpt_name") or layout.checkpoint_name(saved.get("ckpt"))
    return {str(name): saved}


def _results(
    layout: RunDir, metrics: dict, best: dict, last: dict, n_test: int | None
) -> list[str]:
    """One section per checkpoint tested: the selected one first (training's own test of
    best weights, or eval's of the same epoch), then each other one eval tested."""
    evaluated = evaluations(layout)
    sections = []
    now = {"best": recorded_epoch(best), "last": recorded_epoch(last)}
    best_name = layout.best_weights.name
    from_eval = evaluated.pop(best_name, None)
    if from_eval is not None and from_eval.get("ckpt_epoch") not in (None, now["best"]):
        evaluated[best_name] = from_eval  # an older best weights file: shown apart
        from_eval = None
    if from_eval is not None:
        sections.append((_label(best_name, now["best"]), from_eval, _eval_source(from_eval)))
    elif any(str(k).startswith("test/") for k in metrics):
        # training tests the best weights when it saved them, else the final weights
        label = _label(best_name, now["best"]) if best else "the final weights (no checkpoint)"
        sections.append((label, metrics, f"the test at the end of training ({METRICS})"))
    for name, record in evaluated.items():
        epoch, holds = record.get("ckpt_epoch"), now.get(own_role(name) or "")
        if isinstance(epoch, int) and holds is not None and epoch != holds:  # replaced since
            label = f"{name} as it was at epoch {_num(epoch, 'd')} (it now holds epoch {holds})"
        else:
            label = _label(name, epoch)
        sections.append((label, record, _eval_source(record)))
    if not sections:
        return ["## Test results", "", "No test split was evaluated.", ""]
    lines = []
    for label, record, source in sections:
        samples = record.get("samples")
        n = samples.get("test") if isinstance(samples, dict) else None
        n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else n_test
        lines += _test_table(label, record, n, source)
    return lines


def _eval_source(record: dict) -> str:
    overrides = record.get("overrides")
    shown = " ".join(str(o) for o in overrides) if isinstance(overrides, list) else ""
    return "experiments.eval" + (f" with {md_code(shown)}" if shown else "")


def _test_table(label: str, metrics: dict, n: int | None, source: str) -> list[str]:
    lines = [f"## Test results: {label}", "", f"Test split, {_n(n)}; from {source}.", ""]
    missing = metrics.get("test/missing_classes")
    if isinstance(missing, int | float) and missing > 0:
        lines += [
            f"The test split lacks {_num(missing, '.0f')} of the classes: its balanced "
            f"accuracy and macro-F1 average only the classes it has.",
            "",
        ]
    lines += ["| metric | value | 95% interval |", "|---|---|---|"]
    for key in CLASSIFIER_KEYS:
        if key in metrics:
            interval = _interval(metrics[key], n) if key == "test/acc" else ""
            lines.append(f"| {key} | {_num(metrics[key])} | {interval} |")
    if not any(k in metrics for k in CLASSIFIER_KEYS):  # another task: its own test/* names
        for key, value in metrics.items():
            if str(key).startswith("test/") and isinstance(value, int | float):
                lines.append(f"| {md_text(key)} | {_num(value)} | |")
    if "test/ece_calibrated" in metrics:
        lines.append(f"| test/ece after calibration | {_num(metrics['test/ece_calibrated'])} | |")
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


def _calibration(layout: RunDir, saved: dict, best: dict, last: dict) -> list[str]:
    lines = ["## Calibration", ""]
    if not saved:
        return lines + ["Not temperature-scaled: run `experiments-calibrate run_dir=<run>`.", ""]
    name = saved.get("ckpt")
    name = name if own_role(name) else layout.checkpoint_name(name)
    label = _label(name, saved.get("ckpt_epoch"))
    t, reason = saved.get("temperature"), saved.get("reason")
    lines.append(f"- for {label}, fitted on the validation split")
    if reason is None:  # written before calibrate kept T = 1 when it should
        lines.append(
            f"- T = {_num(t, '.4g')}, fitted before T was bounded and checked: run "
            f"`experiments-calibrate` again"
        )
    elif saved.get("applied") and t != 1:
        lines.append(f"- T = {_num(t, '.4g')} applied: {md_text(reason, 400)}")
    else:
        lines.append(f"- T = 1 kept (not temperature-scaled): {md_text(reason, 400)}")
    bounds = saved.get("range")
    if isinstance(bounds, list) and len(bounds) == 2:
        lines.append(
            f"- T is fitted within [{_num(bounds[0], 'g')}, {_num(bounds[1], 'g')}]; a validation "
            f"split under {_num(saved.get('min_samples'), 'd')} samples or "
            f"{_num(saved.get('min_per_class'), 'd')} of a class keeps T = 1"
        )
    warnings = saved.get("warnings")
    for warning in warnings if isinstance(warnings, list) else []:
        lines.append(f"- warning: {md_text(warning, 400)}")
    now = {"best": recorded_epoch(best), "last": recorded_epoch(last)}.get(own_role(name))
    fitted_at = saved.get("ckpt_epoch")
    if now is not None and isinstance(fitted_at, int) and fitted_at != now:
        lines.append(
            f"- {name} now holds epoch {now}: this calibration is for epoch {fitted_at} and is "
            f"not applied; run `experiments-calibrate` again"
        )
    lines += [
        "",
        "| split | NLL before -> after | ECE (15 bins) before -> after |",
        "|---|---|---|",
    ]
    for split in ("val", "test"):
        if f"{split}/nll_before" in saved or f"{split}/ece_before" in saved:
            nll, ece = _change(saved, f"{split}/nll"), _change(saved, f"{split}/ece")
            lines.append(f"| {split} ({_n(saved.get(f'{split}/n'))}) | {nll} | {ece} |")
    return lines + [""]


def _change(saved: dict, key: str) -> str:
    return f"{_num(saved.get(f'{key}_before'))} -> {_num(saved.get(f'{key}_after'))}"


def _export(layout: RunDir, report: dict) -> list[str]:
    if not report:
        return []
    lines = ["## Export", ""]
    for fmt, check in report.items():
        if not isinstance(check, dict):
            continue
        pixels = "pixel_agreement" in check  # a segmentation run: logits per pixel
        name = check.get("ckpt_name") or layout.checkpoint_name(check.get("ckpt"))
        split = check.get("split", "?" if pixels else "test")
        lines.append(
            f"- {md_text(fmt)}: {md_code(check.get('file'))} from "
            f"{_label(name, check.get('ckpt_epoch'))}{', logits per pixel' if pixels else ''}; "
            f"max |difference| from PyTorch {_num(check.get('max_abs_diff'), '.2e')} on the "
            f"first batch of the {split if split in SPLITS else '?'} split "
            f"(n={_num(check.get('batch'), 'd')}); "
            + (
                f"the same class as PyTorch on {_num(check.get('pixel_agreement'), '.4%')} of "
                f"pixels, pixel accuracy {_num(check.get('pixel_acc_exported'))} (PyTorch "
                f"{_num(check.get('pixel_acc_torch'))})"
                if pixels
                else f"accuracy on it {_num(check.get('acc_exported'))} (PyTorch "
                f"{_num(check.get('acc_torch'))})"
            )
        )
    return lines + [""]
