"""Finding run folders and reading them for comparison: metrics.json, the grouping config
(the saved config minus replicate keys such as seeds and per-run locations; the rule is in
``experiments.analysis.comparison``'s docstring), and each metric's value at the run's
selected epoch."""

from __future__ import annotations

import csv
import glob
import io
import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.errors import UserError, one_line
from experiments.recorded.dotted import dotted_leaves
from experiments.runs.files import parse_yaml, read_json, read_text
from experiments.runs.layout import (
    METRICS,
    RunDir,
    SweepDir,
    read_sidecar,
    run_folders,
    sidecar_epoch,
)
from experiments.tracking.importance import is_replicate

IGNORED_SECTIONS = ("seed", "paths", "hydra", "task_name", "tags", "resume")


LOCATION_SUFFIXES = (
    "stats_file",
    "dirpath",
    "save_dir",
    "default_root_dir",
    "output_dir",
    "log_dir",
)


LOCATION_INTERPOLATIONS = ("${paths.", "${hydra:")


GLOB_CHARS = frozenset("*?[")


_SEED_LINE = re.compile(r"^seed:([^\n]*)\n?", re.M)  # the top-level seed key, as Hydra saves it


@dataclass
class Run:
    path: Path
    metrics: dict[str, Any]
    config: dict[str, Any]  # the grouping config: dotted key -> value as saved
    # the keys that only replicate a run (seed, data.split_seed, ...): dotted key -> value
    replicates: dict[str, Any] = field(default_factory=dict)
    # the saved config's optimized_metric and optimized_mode (None where not a string)
    optimized: tuple[str | None, str | None] = (None, None)
    best: dict[str, Any] = field(default_factory=dict)  # checkpoints/best.json ({}: none)
    _curves: dict[str, dict[int, float]] = field(default_factory=dict, repr=False)

    @property
    def seed(self) -> Any:
        return self.replicates.get("seed", self.metrics.get("seed"))

    @property
    def replicate(self) -> tuple:
        """What tells this run apart from the other runs of its config: its replicate keys'
        values (runs of two groups with the same one ran the same seeds: a pair)."""
        return tuple(sorted((k, identity(v)) for k, v in self.replicates.items()))

    @property
    def selected_epoch(self) -> int | None:
        """The 1-based epoch the best checkpoint keeps (best.json's), None for a run without one."""
        try:
            return sidecar_epoch(self.best) if self.best else None
        except (TypeError, ValueError, OverflowError):
            return None

    def curve(self, column: str) -> dict[int, float]:
        if column not in self._curves:
            self._curves[column] = read_curve(self.path, column)
        return self._curves[column]


@dataclass(frozen=True)
class Value:
    """A metric of a run and the epoch it is from: ``best`` (the selected epoch, the one
    best checkpoint keeps; for test metrics: its weights), ``last`` (the last epoch), or
    ``""`` for a number that is not per epoch (wall_time_s)."""

    value: float
    source: str
    epoch: int | None

    @property
    def label(self) -> str:
        if not self.source:
            return ""
        return self.source if self.epoch is None else f"{self.source} {self.epoch}"


PER_EPOCH = ("val/", "test/", "train/")


def select(run: Run, metric: str) -> Value | str:
    """``metric`` of ``run`` at its selected epoch, or why it has none (one line).

    A validation metric is best.json's value when the best checkpoint was chosen by it, else the
    ``csv/metrics.csv`` row of the selected epoch; test metrics are of the best weights
    (training tests them); without best.json (no checkpoints kept) the value in
    metrics.json is the last epoch's, and labelled so.
    """
    value = run.metrics.get(metric)
    epoch = run.selected_epoch
    last = run.metrics.get("epochs") if is_number(run.metrics.get("epochs")) else None
    last = int(last) if last is not None else None
    if metric.startswith("val/") and epoch is not None:
        if run.best.get("monitor") == metric and is_number(run.best.get("value")):
            return Value(float(run.best["value"]), "best", epoch)
        at = run.curve(metric).get(epoch - 1)  # Lightning's csv counts epochs from 0
        if at is not None and math.isfinite(at):
            return Value(at, "best", epoch)
    if metric not in run.metrics:
        return f"{METRICS} has no {metric}"
    if not is_number(value):
        return f"{metric} is {_short(value)} in {METRICS}, not a finite number"
    if not metric.startswith(PER_EPOCH):
        return Value(float(value), "", None)
    if metric.startswith("test/") and epoch is not None:
        return Value(float(value), "best", epoch)
    return Value(float(value), "last", last)


def read_curve(run_dir: Path, column: str = "val/acc") -> dict[int, float]:
    """``{epoch: value}`` of ``column`` from ``<run>/csv/metrics.csv`` (the last row of an
    epoch wins; Lightning's 0-based epochs); ``{}`` when the file, the column or a value
    cannot be read."""
    curve: dict[int, float] = {}
    path = RunDir(run_dir).csv_metrics
    try:  # a file handed to us: size-limited, UTF-8; an epoch of "inf" overflows int()
        reader = csv.reader(io.StringIO(read_text(path), newline=""))
        header = next(reader)
        col, ep = header.index(column), header.index("epoch")
        for row in reader:
            if len(row) > max(col, ep) and row[col] and row[ep]:
                curve[int(float(row[ep]))] = float(row[col])
    except (UserError, ValueError, OverflowError, StopIteration, csv.Error):
        return {}
    return curve


def group_config(
    config: dict[str, Any], run_dirs: Iterable[str] = (), ignore: Iterable[str] = ()
) -> dict[str, Any]:
    """The part of a saved config that defines a run's group, flattened to dotted keys.

    Args:
        config: the run's ``.hydra/config.yaml`` as loaded (unresolved).
        run_dirs: the run's own folder as path strings; values containing one are left out.
        ignore: more dotted keys to leave out (each with everything under it).

    Returns:
        ``{"optimizer.lr": 0.01, ...}`` without the keys of the module's grouping rule and
        without replicate keys (``seed``, ``*.seed``, ``*_seed``: see ``replicates``).
    """
    dirs = tuple(d for d in run_dirs if len(d) > 1)
    ignored = set(IGNORED_SECTIONS) | {k.strip() for k in ignore if k.strip()}

    def skip(dotted: str, key: str, value: Any) -> bool:
        if dotted in ignored or key.endswith(LOCATION_SUFFIXES) or is_replicate(dotted):
            return True
        return isinstance(value, str) and (
            any(i in value for i in LOCATION_INTERPOLATIONS)
            or any(_names_folder(value, d) for d in dirs)
        )

    return dict(dotted_leaves(config, skip))


def replicates(config: dict[str, Any]) -> dict[str, Any]:
    """The keys of a saved config that only replicate a run (the one rule:
    ``experiments.tracking.importance.is_replicate``), as ``{dotted key: value}``."""
    found = {}

    def skip(dotted: str, key: str, value: Any) -> bool:
        if is_replicate(dotted) and not (isinstance(value, dict) and value):
            found[dotted] = value
            return True
        return dotted in ("paths", "hydra")

    for _ in dotted_leaves(config, skip):
        pass
    return found


def _names_folder(value: str, folder: str) -> bool:
    """``value`` holds the path ``folder`` itself or a path under it (not ``folder`` + "0")."""
    start = value.find(folder)
    while start >= 0:
        end = start + len(folder)
        if end == len(value) or value[end] in "/\\":
            return True
        start = value.find(folder, start + 1)
    return False


def identity(value: Any) -> Any:
    """A hashable stand-in for a config value: equal only for the same type and value."""
    if type(value) is str:
        return value
    if isinstance(value, list | dict):
        try:
            return ("json", json.dumps(value, sort_keys=True, default=str))
        except TypeError:  # keys of mixed types (YAML allows `1:` beside `a:`) do not sort
            return ("repr", repr(value))
    return (type(value).__name__, repr(value))


def find_runs(paths: Sequence[str]) -> list[Path]:
    """The run folders under ``paths``, each once, in order of the paths then by name.

    Raises:
        UserError: a path that does not exist and matches no file as a glob pattern.
    """
    found: dict[str, Path] = {}
    missing = []
    for arg in paths:
        if os.path.lexists(arg):
            targets = [arg]
        elif GLOB_CHARS & set(arg):
            targets = sorted(glob.glob(arg, recursive=True))
        else:
            targets = []
        if not targets:
            missing.append(arg)
        for target in targets:
            for run in _runs_under(Path(target)):
                found.setdefault(os.path.realpath(run), run)
    if missing:
        options = [a for a in missing if "=" in a]
        hint = (
            f" ({', '.join(options)}: not an option; the options are metric=, mode=, out=, ignore=)"
            if options
            else ""
        )
        raise UserError(f"no such file or folder: {', '.join(missing)}{hint}")
    return list(found.values())


def _runs_under(path: Path) -> list[Path]:
    if path.is_file():  # a run's metrics.json or config.yaml stands for its folder
        # anything else (e.g. a sweep's summary.csv from a shell glob) stands for no run
        return [RunDir.folder_of(path)] if RunDir.is_run_file(path) else []
    return [folder for folder, _ in run_folders(path)]


def read_run(
    path: Path, metric: str | None = None, ignore: Iterable[str] = (), cache: dict | None = None
) -> Run | str:
    """The run in ``path``, or the reason it cannot be compared (one line). With ``metric``,
    a run without a finite value of it (``select``) is such a reason too.

    Its files are data handed to us: they are read through ``experiments.runs.files`` (size
    limit, UTF-8, no YAML alias bombs), and whatever is wrong with one of them (corrupt,
    nested too deeply, the wrong shape) is this run's reason, never an exception that
    stops the comparison of the others.

    ``cache`` (one dict per ``ignore``) keeps the grouping config of each config text seen,
    less its ``seed:`` line: the runs of a sweep share a few texts, and parsing YAML is most
    of the time of a large comparison. A text naming the run's own folder is not cached.
    """
    try:
        result = _read_run(path, metric, ignore, cache)
    except UserError as err:
        result = without_folder(one_line(err), path)
    except RecursionError:  # a config nested deeper than flattening goes
        result = ".hydra/config.yaml is nested too deeply to compare"
    return result if isinstance(result, Run) else printable(result)


def printable(text: str) -> str:
    """``text`` on one line: control characters from a file (a newline, an escape
    sequence) shown escaped, so a file cannot add lines or colours to our output."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _read_run(
    path: Path, metric: str | None, ignore: Iterable[str], cache: dict | None
) -> Run | str:
    run = RunDir(path)
    if not run.metrics.is_file():
        return _unfinished_reason(path)
    metrics = read_json(run.metrics)
    if not isinstance(metrics, dict):
        return f"{METRICS} does not hold a JSON object"
    if metric is not None and metric not in metrics and not metric.startswith("val/"):
        return f"{METRICS} has no {metric}"
    if not run.saved_config.is_file():
        return "no .hydra/config.yaml"
    raw = read_text(run.saved_config)
    seed_line = _SEED_LINE.search(raw)
    if "seed" not in metrics and seed_line:
        metrics["seed"] = _scalar(seed_line.group(1))
    dirs = [str(path), str(path.resolve())]
    if isinstance(metrics.get("run_dir"), str):
        dirs.append(metrics["run_dir"])
    best = read_sidecar(run.best_json) if run.best_json.exists() else {}  # corrupt: a reason
    key = None
    if cache is not None and not any(d in raw for d in dirs):
        key = raw[: seed_line.start()] + raw[seed_line.end() :] if seed_line else raw
    if key is not None and key in cache:
        flat, others, optimized = cache[key]
    else:
        config = parse_yaml(raw, str(run.saved_config))
        if not isinstance(config, dict):
            return ".hydra/config.yaml does not hold a mapping of config keys"
        flat = group_config(config, dirs, ignore)
        for value in flat.values():
            identity(value)  # a value that cannot be told apart from others: this run's reason
        others = {k: v for k, v in replicates(config).items() if k != "seed"}
        optimized = tuple(
            v if isinstance(v, str) else None
            for v in (config.get("optimized_metric"), config.get("optimized_mode"))
        )
        if key is not None:
            cache[key] = flat, others, optimized
    found = Run(path, metrics, flat, {"seed": metrics.get("seed"), **others}, optimized, best)
    if metric is not None:
        value = select(found, metric)
        if isinstance(value, str):
            return value
    return found


def without_folder(reason: str, path: Path) -> str:
    """``<run>/metrics.json: not valid JSON ...`` as ``metrics.json: not valid JSON ...``:
    the run's folder is already named in front of the reason."""
    for folder in (str(path), str(path.resolve())):
        if reason.startswith(folder + os.sep):
            return reason[len(folder) + 1 :]
    return reason


def _short(value: Any, limit: int = 60) -> str:
    """A value from a file, for a one-line reason: repr'd (control characters escaped), cut."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _scalar(text: str) -> Any:
    try:
        value = parse_yaml(text, "seed")
    except UserError:
        return text.strip()
    return value if value is None or isinstance(value, str | int | float) else text.strip()


def _unfinished_reason(path: Path) -> str:
    try:  # a sweep job that failed says why in job.json (see tracking.sweep_summary)
        job = read_json(SweepDir.job_file(path), None)
    except UserError as err:
        return f"no {METRICS}, and {without_folder(one_line(err), path)}"
    if isinstance(job, dict) and job.get("status") == "failed":
        error = job.get("error")
        # a traceback recorded whole: its last line is the exception
        why = one_line(Exception(error), last=True) if isinstance(error, str) else None
        return f"no {METRICS}: the job failed ({why or 'no error recorded'})"
    return f"no {METRICS} (unfinished or failed run)"


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def skipped_line(skipped: list[tuple[Path, str]]) -> str:
    runs = "run" if len(skipped) == 1 else "runs"
    return f"skipped {len(skipped)} {runs}: " + "; ".join(
        f"{show_path(p)}: {why}" for p, why in skipped
    )


# ---------------------------------------------------------------- report


def show_path(path: Path) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return printable(str(path))
    return printable(str(path) if rel.startswith("..") else rel)
