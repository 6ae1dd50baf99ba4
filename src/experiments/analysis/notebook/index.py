"""Every run folder under an outputs folder, read once into a flat record and cached.

A record holds what the notebook shows and queries: status (finished, running, failed,
broken) and why, kind (a single run, a sweep's job, a cross-validated run), tags and note,
start time and duration, the overrides and the group choices (``data=digits``), the grouping
config (compare's rule: ``analysis.readings.group_config``), the metrics at the run's selected
epoch and a few learning curves.

The cache (``<outputs>/.runs-index.json``) keys each record by the ``(mtime, size)`` of every
file it was read from: a folder whose files changed is read again, the others are not
opened. A running run is read afresh each time and never cached (its files are still being
written, and whether its process lives is not in any file). Config texts shared by many runs
(a sweep's jobs differ in a few lines) are parsed once per distinct text.

Every file here is data handed to us: it is read through ``experiments.runs.files``; what is
wrong with one (corrupt, missing, the wrong shape) is that run's ``reason``, never an
exception that stops the listing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.analysis.readings import (
    Configs,
    Run,
    job_failure,
    number,
    printable,
    read_curves,
    select,
    whole,
    without_folder,
)
from experiments.errors import UserError, one_line
from experiments.runs.files import parse_yaml, read_json, read_text, read_yaml, write_text
from experiments.runs.layout import FOLD_PREFIX, METRICS, RunDir, SweepDir, run_folders
from experiments.runs.notes import merge_tags, read_notes
from experiments.runs.orphans import alive

log = logging.getLogger(__name__)

# the cache beside the runs (a dot file: compare and the manifest walk past it)
INDEX_FILE = ".runs-index.json"
INDEX_VERSION = 1
MAX_INDEX_BYTES = 256 * 1024 * 1024
STATUSES = ("finished", "running", "failed", "broken")
KINDS = ("run", "job", "cv")
SHAPES = {(status, kind) for status in STATUSES for kind in KINDS}
# metrics.json numbers that are not stage/name metrics but belong in the table
PLAIN_METRICS = ("wall_time_s", "params", "epochs")
CURVES = ("val/acc", "val/loss", "train/loss")  # + each run's optimized metric
MAX_CURVE_POINTS = 400
_CHOICES = re.compile(r"^(?P<indent> +)choices:\n(?P<body>(?:(?P=indent) +[^\n]*\n)*)", re.M)


def is_metric(name: str) -> bool:
    """A metric the index keeps: ``stage/name`` (not per class: ``val/recall/3``; not a
    cross-validation spread: ``*_std``), or one of ``PLAIN_METRICS``."""
    if name in PLAIN_METRICS:
        return True
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.endswith("_std")


_RUN = RunDir(Path("/run"))
# the files a record is read from (their mtime and size key the cache), relative to any run
# folder, as text: building 9 Path objects per folder would cost more than its 9 stats
_RELATIVE = [os.path.relpath(p, _RUN.path) for p in (
    _RUN.metrics, _RUN.saved_config, _RUN.saved_overrides, _RUN.hydra_runtime, _RUN.best_json,
    _RUN.csv_metrics, SweepDir.job_file(_RUN.path), _RUN.notes, _RUN.lock_file,
)]  # fmt: skip


def signature(folder: Path) -> list:
    """``[mtime_ns, size]`` (None: absent) of each of the run's files (``_RELATIVE``)."""
    sig, base = [], str(folder)
    for rel in _RELATIVE:
        try:
            st = os.stat(os.path.join(base, rel))
            sig.append([st.st_mtime_ns, st.st_size])
        except OSError:
            sig.append(None)
    return sig


class Reader:
    """Reads run folders into records (the module docstring says what a record holds)."""

    def __init__(self) -> None:
        self.configs: dict[str, dict] = {}  # id -> {"config", "replicates", "optimized", "tags"}
        self._texts = Configs()
        self._choices: dict[str, dict] = {}

    def read(self, folder: Path, names: set[str], rel: str) -> dict[str, Any]:
        run = RunDir(folder)
        record: dict[str, Any] = {
            "name": rel, "kind": _kind(folder, names), "status": "finished", "reason": "",
            "tags": [], "note": "", "start": None, "duration_s": None, "overrides": [],
            "choices": {}, "config_id": None, "seed": None, "metrics": {}, "epoch": None,
            "curves": {},
        }  # fmt: skip
        reasons: list[str] = []
        running = _holder(run)
        if running:
            record["status"] = "running"
            reasons.append(running)
        record["start"] = _mtime(run.saved_overrides) or _mtime(run.saved_config)
        config = self._config(run, record, reasons, running)
        self._metrics(run, record, reasons, running)
        try:
            notes = read_notes(folder)
        except UserError as err:
            notes = {}
            reasons.append(without_folder(one_line(err), folder))
        launched = config["tags"] if config else []
        record["tags"], record["note"] = merge_tags(launched, notes), notes.get("note", "")
        try:
            overrides = read_yaml(run.saved_overrides, [], kind=list)
            record["overrides"] = [str(o) for o in overrides if isinstance(o, str | int | float)]
        except UserError as err:
            reasons.append(without_folder(one_line(err), folder))
        record["choices"] = self._group_choices(run, reasons)
        if record["start"] is not None and record["status"] == "running":
            record["duration_s"] = round(time.time() - record["start"], 3)
        record["reason"] = printable("; ".join(reasons))
        return record

    def _config(self, run: RunDir, record: dict, reasons: list[str], running: str) -> dict | None:
        if not run.saved_config.is_file():
            if not running:
                record["status"] = "broken"
            reasons.append("no .hydra/config.yaml")
            return None
        try:
            seed, saved = self._texts.read(run, [str(run.path), str(run.path.resolve())])
        except (UserError, RecursionError) as err:
            why = "nested too deeply" if isinstance(err, RecursionError) else one_line(err)
            if running:  # Hydra may be writing it this instant: read it next time
                reasons.append(f"config being written ({without_folder(why, run.path)})")
            else:
                record["status"] = "broken"
                reasons.append(without_folder(why, run.path))
            return None
        record["config_id"] = saved.id
        found = self.configs.setdefault(saved.id, {
            "config": _plain(saved.config), "replicates": _plain(saved.replicates),
            "optimized": list(saved.optimized), "tags": saved.tags,
        })  # fmt: skip
        record["seed"] = _plain(seed) if seed is not None else found["replicates"].get("seed")
        return found

    def _metrics(self, run: RunDir, record: dict, reasons: list[str], running: str) -> None:
        wanted = [*CURVES]
        config = self.configs.get(record["config_id"] or "")
        if config and config["optimized"][0] and config["optimized"][0] not in wanted:
            wanted.insert(0, config["optimized"][0])
        curves = read_curves(run.path, wanted)  # a running run's too: how far it got
        record["curves"] = {c: _points(points) for c, points in curves.items()}
        if not run.metrics.is_file():
            if not running:
                failed = job_failure(run.path)
                record["status"] = "failed" if failed else "broken"
                reasons.append(failed or _unfinished(run))
            return
        try:
            metrics = read_json(run.metrics, kind=dict)
            best = read_json(run.best_json, {}, kind=dict)
        except UserError as err:
            record["status"] = "broken"
            reasons.append(without_folder(one_line(err), run.path))
            return
        if record["status"] == "running":  # a finished run whose lock was not let go yet
            record["status"] = "finished"
            reasons.clear()
        selected = {k: number(v) for k, v in metrics.items() if is_metric(k)}
        at_best = best.get("metrics") if isinstance(best.get("metrics"), dict) else None
        found = Run(run.path, metrics, {}, best=best)
        if at_best is not None:  # the selected epoch's validation metrics, as best.json has them
            selected.update({k: number(v) for k, v in at_best.items() if is_metric(k)})
        elif best:  # an older run: compare's reading (best.json's value, else the csv row)
            for k in [k for k in selected if k.startswith("val/")]:
                value = select(found, k)
                selected[k] = None if isinstance(value, str) else value.value
        record["metrics"] = {k: v for k, v in selected.items() if v is not None}
        record["epoch"] = found.selected_epoch if best else whole(metrics.get("epochs"))
        record["duration_s"] = number(metrics.get("wall_time_s"))

    def _group_choices(self, run: RunDir, reasons: list[str]) -> dict[str, str]:
        path = run.hydra_runtime
        try:
            text = read_text(path)
        except UserError:
            return {}  # an older or hand-made run without it: no choices to show
        block = _CHOICES.search(text)
        if block is None:
            return {}
        body = block.group("body")
        if body not in self._choices:
            try:
                data = parse_yaml(body, f"{path} (runtime.choices)")
            except UserError as err:
                reasons.append(without_folder(one_line(err), run.path))
                data = {}
            data = data if isinstance(data, dict) else {}
            self._choices[body] = {
                str(k): str(v)
                for k, v in data.items()
                if "/" not in str(k)
                and isinstance(v, str | int | float)
                and k not in ("hydra", "paths")
            }
        return dict(self._choices[body])


def _points(curve: dict[int, float]) -> list[list[float]]:
    """``[[epoch, value], ...]``, 1-based; a long run's every k-th epoch and its last."""
    pairs = sorted(curve.items())
    if len(pairs) > MAX_CURVE_POINTS:
        step = math.ceil(len(pairs) / MAX_CURVE_POINTS)
        pairs = pairs[::step] + ([pairs[-1]] if (len(pairs) - 1) % step else [])
    return [[e + 1, round(v, 6)] for e, v in pairs]  # Lightning counts epochs from 0


def _kind(folder: Path, names: set[str]) -> str:
    if any(n.startswith(FOLD_PREFIX) and n[len(FOLD_PREFIX) :].isdigit() for n in names):
        return "cv"
    if SweepDir.job_file(folder).name in names or SweepDir(folder.parent).sweep_file.is_file():
        return "job"
    return "run"


def _holder(run: RunDir) -> str:
    """Why the run counts as running (a live process holds its lock), else ''. Only read:
    taking the lock, even shared and at once let go, could refuse a trainer starting now."""
    try:
        with open(run.lock_file, "rb") as f:
            raw = f.read(4096)
    except OSError:
        return ""
    if not raw.strip():
        return ""  # let go (the trainer empties it when it ends)
    try:
        holder = json.loads(raw)
    except ValueError:
        holder = None
    if not isinstance(holder, dict):
        return "its lock is held (holder unreadable)"
    pid, host = holder.get("pid"), holder.get("host")
    if host == socket.gethostname() and isinstance(pid, int) and not alive(pid):
        return ""  # the process that held it is gone: killed, not running
    since = holder.get("started")
    return printable(f"training: pid {pid} on {host}, since {since}")[:200]


def _unfinished(run: RunDir) -> str:
    if run.resumable():
        return (
            f"no {METRICS} and no process training it: stopped before the end (continue: "
            f"python -m experiments.train resume={run.path})"
        )
    return f"no {METRICS} and no process training it (stopped before its first checkpoint)"


def _mtime(path: Path) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _plain(value: Any) -> Any:
    """A config value as JSON can hold it (YAML dates and odd keys as text)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


@dataclass
class Index:
    """The records of every run under ``root`` (one dict per run folder, in walk order: see
    the module docstring), the configs they share by ``config_id`` and how many folders were
    ``read`` from disk this time (the rest came from the cache)."""

    root: Path
    records: list[dict]
    configs: dict[str, dict]  # config_id -> {"config", "replicates", "optimized", "tags"}
    read: int

    def config(self, record: dict) -> dict:
        return self.configs.get(record.get("config_id") or "", {}) or {}


def build(root: str | os.PathLike, cache: bool = True) -> Index:
    """Index every run folder under ``root``, reusing the cache where no file changed.

    Args:
        root: an outputs folder (or any folder above runs), a sweep folder or one run folder.
        cache: read and write ``<root>/.runs-index.json`` (never inside a run folder).

    Raises:
        UserError: ``root`` is not a folder.
    """
    root = Path(root)
    if not root.is_dir():
        what = "no such folder" if not root.exists() else "not a folder"
        raise UserError(f"{root}: {what}; give an outputs folder, a sweep or a run folder")
    try:
        is_run = RunDir.looks_like_run({e.name for e in os.scandir(root)})
    except OSError as err:
        raise UserError(f"{root}: cannot list it ({err.strerror})") from None
    cache_file = root / INDEX_FILE if cache and not is_run else None
    old_entries, old_configs = _load(cache_file) if cache_file else ({}, {})
    reader = Reader()
    entries: dict[str, dict] = {}
    records, configs, read = [], {}, 0
    for folder, names in run_folders(root):
        rel = folder.relative_to(root).as_posix()
        sig = signature(folder)
        old = old_entries.get(rel)
        if old is not None and old.get("sig") == sig and _usable(old, old_configs):
            record, known = old["record"], old_configs
        else:
            record, known = reader.read(folder, names, rel), reader.configs
            read += 1
        if record["config_id"]:
            configs[record["config_id"]] = known[record["config_id"]]
        if record["status"] != "running":
            entries[rel] = {"sig": sig, "record": record}
        records.append(record)
    if cache_file is not None and (read or set(entries) != set(old_entries)):
        _save(cache_file, entries, configs)
    return Index(root, records, configs, read)


def _load(path: Path) -> tuple[dict, dict]:
    """The cache's entries and configs; anything unreadable is an empty cache (it is ours to
    rebuild, and a file in someone's outputs folder is not trusted: each entry is checked)."""
    if not path.is_file():
        return {}, {}
    try:
        data = json.loads(read_text(path, MAX_INDEX_BYTES))
    except (UserError, ValueError, RecursionError) as err:
        log.warning("%s: %s; reading every run again", path, one_line(err))
        return {}, {}
    if _shaped(data, {"entries": dict, "configs": dict}) and data.get("version") == INDEX_VERSION:
        return data["entries"], data["configs"]
    return {}, {}


_TYPES = {
    "name": str, "kind": str, "status": str, "reason": str, "tags": list, "note": str,
    "overrides": list, "choices": dict, "metrics": dict, "curves": dict,
}  # fmt: skip
_CONFIG_TYPES = {"config": dict, "optimized": list, "tags": list}


def _shaped(data: Any, types: dict[str, type]) -> bool:
    return isinstance(data, dict) and all(isinstance(data.get(k), t) for k, t in types.items())


def _usable(entry: Any, configs: dict) -> bool:
    """A cached entry has the shape ``Reader.read`` gives (else the folder is read again)."""
    record = entry.get("record") if isinstance(entry, dict) else None
    if not _shaped(record, _TYPES) or (record["status"], record["kind"]) not in SHAPES:
        return False
    if not all(isinstance(v, int | float) for v in record["metrics"].values()):
        return False
    config_id = record.get("config_id")
    found = configs.get(config_id) if isinstance(config_id, str) else None  # a list: unhashable
    return config_id is None or _shaped(found, _CONFIG_TYPES)


def _save(path: Path, entries: dict, configs: dict) -> None:
    data = {"version": INDEX_VERSION, "entries": entries, "configs": configs}
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    try:
        write_text(path, text)
    except OSError as err:  # a read-only outputs folder: the listing still works, uncached
        log.info("not caching the run index: %s", one_line(err))
