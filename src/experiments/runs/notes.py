"""Tags and a note kept with a run (``RunDir.notes``, written by ``experiments-runs tag`` /
``note``), read here for every place that shows them: the lab notebook, compare, the sweep
summary and the model card. Launch tags (``tags=[a,b]``, in the saved config) count too."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from experiments.errors import UserError
from experiments.runs.files import read_json_object, read_yaml
from experiments.runs.layout import RunDir


def notes_file(run_dir: str | os.PathLike) -> Path:
    """Where a run's tags and note live: ``<run>/notes.json``."""
    return RunDir(Path(run_dir)).notes


def read_notes(run_dir: str | os.PathLike) -> dict[str, Any]:
    """``{"tags": [...], "untagged": [...], "note": str}`` of a run (empty when it has none).

    Raises:
        UserError: the file is corrupt or holds fields of the wrong type (one line naming it).
    """
    path = notes_file(run_dir)
    data = read_json_object(path)
    found = {k: data.get(k, empty) for k, empty in (("tags", []), ("untagged", []), ("note", ""))}
    for key in ("tags", "untagged"):
        if not isinstance(found[key], list) or not all(isinstance(t, str) for t in found[key]):
            raise UserError(f"{path}: {key} must be a list of strings; fix or delete the file")
    if not isinstance(found["note"], str):
        raise UserError(f"{path}: note must be a string; fix or delete the file")
    return found


def launch_tags(config: Any) -> list[str]:
    """The ``tags`` of a saved config (``tags=[a,b]`` at launch); strings only, in order."""
    tags = config.get("tags") if isinstance(config, dict) else None
    tags = [tags] if isinstance(tags, str) else tags if isinstance(tags, list) else []
    return [str(t) for t in tags if isinstance(t, str | int | float)]


def merge_tags(launched: list[str], notes: dict[str, Any]) -> list[str]:
    """Launch tags, then added ones, less the removed ones; each once, in that order."""
    removed = set(notes.get("untagged", []))
    return list(dict.fromkeys(t for t in [*launched, *notes.get("tags", [])] if t not in removed))


def read_tags(run_dir: str | os.PathLike, config: dict | None = None) -> list[str]:
    """A run's tags (``merge_tags``): launch tags from its saved config (``config`` where the
    caller has read it already: not read again), then those added with ``experiments-runs
    tag``. A missing or unreadable file counts as no tags (a warning is the caller's business:
    this is for showing tags beside other things, e.g. in compare or the model card)."""
    run = RunDir(Path(run_dir))
    if config is None:
        try:
            config = read_yaml(run.saved_config, {})
        except UserError:
            config = {}
    try:
        notes = read_notes(run.path)
    except UserError:
        notes = {}
    return merge_tags(launch_tags(config), notes)
