"""Finding run folders and reading them for comparison: metrics.json, the grouping config
(the saved config minus replicate keys such as seeds and per-run locations; the rule is in
``experiments.analysis.comparison``'s docstring), and each metric's value at the run's
selected epoch."""

from __future__ import annotations

import csv
import glob
import hashlib
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
from experiments.recorded import shown
from experiments.recorded.dotted import dotted_leaves
from experiments.runs.files import parse_yaml, read_json, read_text
from experiments.runs.layout import (
    HYDRA,
    METRICS,
    SAVED_CONFIG,
    RunDir,
    SweepDir,
    read_sidecar,
    run_folders,
    sidecar_epoch,
)
from experiments.runs.notes import launch_tags
from experiments.tracking.importance import is_replicate

IGNORED_SECTIONS = ("seed", "paths", "hydra", "task_name", "tags", "resume")
LOCATION_SUFFIXES = (
    "stats_file", "dirpath", "save_dir", "default_root_dir", "output_dir", "log_dir"
)  # fmt: skip
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
    last = whole(run.metrics.get("epochs"))
    if metric.startswith("val/") and epoch is not None:
        if run.best.get("monitor") == metric and number(run.best.get("value")) is not None:
            return Value(float(run.best["value"]), "best", epoch)
        at = run.curve(metric).get(epoch - 1)  # Lightning's csv counts epochs from 0
        if at is not None and math.isfinite(at):
            return Value(at, "best", epoch)
    if metric not in run.metrics:
        return f"{METRICS} has no {metric}"
    if number(value) is None:  # the value from the file, repr'd (control characters escaped), cut
        return f"{metric} is {shown(value, 60)} in {METRICS}, not a finite number"
    if not metric.startswith(PER_EPOCH):
        return Value(float(value), "", None)
    if metric.startswith("test/") and epoch is not None:
        return Value(float(value), "best", epoch)
    return Value(float(value), "last", last)


def read_curve(run_dir: Path, column: str = "val/acc") -> dict[int, float]:
    """``{epoch: value}`` of ``column`` (``read_curves``); ``{}`` when there is none."""
    return read_curves(run_dir, [column]).get(column, {})


def read_curves(run_dir: Path, columns: Iterable[str]) -> dict[str, dict[int, float]]:
    """``{column: {epoch: value}}`` from ``<run>/csv/metrics.csv`` (Lightning's 0-based epochs;
    an epoch's last row wins; only finite values). A line still being written (no newline
    yet) is left out, and so is everything from a row that cannot be read; a file, header
    or column that cannot be read is no curve."""
    try:  # a file handed to us: size-limited, UTF-8
        text = read_text(RunDir(run_dir).csv_metrics)
        reader = csv.reader(io.StringIO(text[: text.rfind("\n") + 1], newline=""))
        header = next(reader)
        at = {c: header.index(c) for c in columns if c in header}
        ep = header.index("epoch")
    except (UserError, StopIteration, ValueError, csv.Error):
        return {}
    curves: dict[str, dict[int, float]] = {c: {} for c in at}
    try:
        for row in reader:
            if len(row) != len(header) or not row[ep]:
                continue
            epoch = int(float(row[ep]))  # an epoch of "inf" overflows int()
            for column, i in at.items():
                try:
                    value = float(row[i])
                except ValueError:
                    continue  # an empty cell: that column was not logged on this row
                if math.isfinite(value):
                    curves[column][epoch] = value
    except (csv.Error, ValueError, OverflowError):
        pass  # keep what was read before the bad row
    return {c: points for c, points in curves.items() if points}


def group_config(
    config: dict[str, Any], run_dirs: Iterable[str] = (), ignore: Iterable[str] = ()
) -> dict[str, Any]:
    """The part of a saved config that defines a run's group, flattened to dotted keys.

    Args:
        config: the run's ``.hydra/config.yaml`` as loaded (unresolved).
        run_dirs: the run's own folder as path strings; values containing one are left out.
        ignore: more dotted keys to leave out (each with everything under it).

    Returns:
        ``{"optimizer.lr": 0.01, ...}`` less the keys the grouping rule leaves out.
    """
    dirs = tuple(d for d in run_dirs if len(d) > 1)
    ignored = set(IGNORED_SECTIONS) | {k.strip() for k in ignore if k.strip()}

    def skip(dotted: str, key: str, value: Any) -> bool:
        if dotted in ignored or key.endswith(LOCATION_SUFFIXES) or is_replicate(dotted):
            return True
        return isinstance(value, str) and (
            any(i in value for i in LOCATION_INTERPOLATIONS)
            # the path d itself or a path under it (not d + "0")
            or any(re.search(re.escape(d) + r"(?![^/\\])", value) for d in dirs)
        )

    return dict(dotted_leaves(config, skip))


def replicates(config: dict[str, Any]) -> dict[str, Any]:
    """The keys of a saved config that only replicate a run (``importance.is_replicate``)."""
    leaves = dotted_leaves(config, lambda dotted, key, value: dotted in ("paths", "hydra"))
    return {dotted: value for dotted, value in leaves if is_replicate(dotted)}


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
        else:
            targets = sorted(glob.glob(arg, recursive=True)) if GLOB_CHARS & set(arg) else []
        if not targets:
            missing.append(arg)
        for target in map(Path, targets):
            if target.is_file():  # a run's metrics.json or config.yaml stands for its folder;
                # anything else (e.g. a sweep's summary.csv from a shell glob) for no run
                runs = [RunDir.folder_of(target)] if RunDir.is_run_file(target) else []
            else:
                runs = [folder for folder, _ in run_folders(target)]
            for run in runs:
                found.setdefault(os.path.realpath(run), run)
    if missing:
        hint = ", ".join(a for a in missing if "=" in a)
        if hint:
            hint = f" ({hint}: not an option; the options are metric=, mode=, out=, ignore=)"
        raise UserError(f"no such file or folder: {', '.join(missing)}{hint}")
    return list(found.values())


@dataclass(frozen=True)
class SavedConfig:
    """A run's ``.hydra/config.yaml`` as compare and the notebook use it."""

    config: dict[str, Any]  # the grouping config (``group_config``)
    replicates: dict[str, Any]  # ``replicates``
    optimized: tuple[str | None, str | None]  # optimized_metric and _mode (None: not a string)
    tags: list[str]  # given at launch
    id: str  # a hash of the text less its seed line: one per distinct config


class Configs:
    """Reads runs' saved configs, parsing each distinct text once: the runs of a sweep share
    a few texts (less their ``seed:`` line), and parsing YAML is most of the time of a large
    comparison. A text naming the run's own folder is parsed for that run alone."""

    def __init__(self, ignore: Iterable[str] = ()) -> None:
        self.ignore = tuple(ignore)  # more keys to leave out of the grouping config
        self._by_text: dict[str, SavedConfig] = {}

    def read(self, run: RunDir, dirs: list[str]) -> tuple[Any, SavedConfig]:
        """The value of the text's top-level ``seed:`` line (None without one) and the config;
        ``dirs``: the run's folder as path strings (``group_config``'s ``run_dirs``).

        Raises:
            UserError: the file cannot be read or holds no mapping (one line).
            RecursionError: it is nested deeper than flattening goes.
        """
        text = read_text(run.saved_config)
        line = _SEED_LINE.search(text)
        key = text[: line.start()] + text[line.end() :] if line else text
        cacheable = not any(d in text for d in dirs)
        found = self._by_text.get(key) if cacheable else None
        if found is None:
            config = parse_yaml(text, str(run.saved_config))
            if not isinstance(config, dict):
                raise UserError(f"{HYDRA}/{SAVED_CONFIG} does not hold a mapping of config keys")
            flat = group_config(config, dirs, self.ignore)
            for value in flat.values():
                identity(value)  # a value that cannot be told apart from others: an error
            named = (config.get("optimized_metric"), config.get("optimized_mode"))
            optimized = tuple(v if isinstance(v, str) else None for v in named)
            digest = hashlib.sha1((key if cacheable else text).encode()).hexdigest()[:16]
            found = SavedConfig(flat, replicates(config), optimized, launch_tags(config), digest)
            if cacheable:
                self._by_text[key] = found
        return (_scalar(line.group(1)) if line else None), found


def read_run(
    path: Path, metric: str | None = None, ignore: Iterable[str] = (), cache: Configs | None = None
) -> Run | str:
    """The run in ``path``, or the reason it cannot be compared (one line). With ``metric``,
    a run without a finite value of it (``select``) is such a reason too.

    Its files are data handed to us: they are read through ``experiments.runs.files`` (size
    limit, UTF-8, no YAML alias bombs), and whatever is wrong with one of them (corrupt,
    nested too deeply, the wrong shape) is this run's reason, never an exception that
    stops the comparison of the others. ``cache``: the ``Configs`` (of the same ``ignore``)
    the runs of one comparison share.
    """
    try:
        result = _read_run(path, metric, cache or Configs(ignore))
    except UserError as err:
        result = without_folder(one_line(err), path)
    except RecursionError:  # a config nested deeper than flattening goes
        result = f"{HYDRA}/{SAVED_CONFIG} is nested too deeply to compare"
    return result if isinstance(result, Run) else printable(result)


def printable(text: str) -> str:
    """``text`` on one line: control characters from a file (a newline, an escape
    sequence) shown escaped, so a file cannot add lines or colours to our output."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _read_run(path: Path, metric: str | None, configs: Configs) -> Run | str:
    run = RunDir(path)
    if not run.metrics.is_file():
        failure = job_failure(path)
        if failure.startswith("the job"):
            return f"no {METRICS}: {failure}"
        return failure or f"no {METRICS} (unfinished or failed run)"
    metrics = read_json(run.metrics)
    if not isinstance(metrics, dict):
        return f"{METRICS} does not hold a JSON object"
    if metric is not None and metric not in metrics and not metric.startswith("val/"):
        return f"{METRICS} has no {metric}"
    if not run.saved_config.is_file():
        return f"no {HYDRA}/{SAVED_CONFIG}"
    dirs = [str(path), str(path.resolve())]
    if isinstance(metrics.get("run_dir"), str):
        dirs.append(metrics["run_dir"])
    best = read_sidecar(run.best_json) if run.best_json.exists() else {}  # corrupt: a reason
    seed, saved = configs.read(run, dirs)
    if "seed" not in metrics and seed is not None:
        metrics["seed"] = seed
    others = {k: v for k, v in saved.replicates.items() if k != "seed"}
    found = Run(path, metrics, saved.config, {"seed": metrics.get("seed"), **others},
                saved.optimized, best)  # fmt: skip
    why = select(found, metric) if metric is not None else None
    return why if isinstance(why, str) else found


def without_folder(reason: str, path: Path) -> str:
    """``<run>/metrics.json: not valid JSON ...`` as ``metrics.json: not valid JSON ...``:
    the run's folder is already named in front of the reason."""
    for folder in (str(path), str(path.resolve())):
        if reason.startswith(folder + os.sep):
            return reason[len(folder) + 1 :]
    return reason


def _scalar(text: str) -> Any:
    """The value of a ``seed:`` line: a YAML scalar, else the text."""
    try:
        value = parse_yaml(text, "seed")
    except UserError:
        return text.strip()
    return value if value is None or isinstance(value, str | int | float) else text.strip()


def job_failure(path: Path) -> str:
    """Why a run has no metrics.json when its sweep recorded the job as failed or interrupted
    (``the job failed (<the error's last line>)``) or its job.json is corrupt; else ''."""
    try:
        job = read_json(SweepDir.job_file(path), None)
    except UserError as err:
        return f"no {METRICS}, and {without_folder(one_line(err), path)}"
    if isinstance(job, dict) and job.get("status") in ("failed", "interrupted"):
        error = job.get("error")
        # a traceback recorded whole: its last line is the exception
        why = one_line(Exception(error), last=True) if isinstance(error, str) else None
        return f"the job {job['status']} ({why or 'no error recorded'})"
    return ""


def number(value: Any) -> float | None:
    """A value from a file as a finite number, else None (a bool is no number)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


def whole(value: Any) -> int | None:
    """``number`` as an int (an epoch count), else None."""
    n = number(value)
    return int(n) if n is not None else None


def value_text(value: Any) -> str:
    """A config value as written on a command line: ``0.01``, ``true``, ``null``, ``[1, 2]``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return json.dumps(value, default=str)
    return str(value)


def skipped_line(skipped: list[tuple[Path, str]]) -> str:
    runs = "run" if len(skipped) == 1 else "runs"
    return f"skipped {len(skipped)} {runs}: " + "; ".join(
        f"{show_path(p)}: {why}" for p, why in skipped
    )


def show_path(path: Path) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return printable(str(path))
    return printable(str(path) if rel.startswith("..") else rel)
