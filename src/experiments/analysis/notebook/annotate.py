"""Tags and a note kept with the run: a small JSON file in the run folder, written atomically
(``runs.files.write_json``), so a copied or moved run keeps them and no database is needed.

Tags given at launch (``tags=[a,b]``, saved in ``.hydra/config.yaml``) count too; removing one
of those records it in the file (the saved config is never rewritten: it is what the run ran).
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from experiments.errors import UserError, one_line
from experiments.runs.files import write_json
from experiments.runs.layout import HYDRA, METRICS, RunDir
from experiments.runs.notes import notes_file, read_notes, read_tags

TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
MAX_NOTE_CHARS = 20_000


def require_run(run_dir: str | os.PathLike) -> RunDir:
    """``run_dir`` as a RunDir when it is a run folder (it holds ``metrics.json`` or
    ``.hydra``); anything else is refused before a file is written there.

    Raises:
        UserError: a missing path, a file, or a folder that is not a run (a sweep, outputs).
    """
    path = Path(run_dir)
    if not path.is_dir():
        what = "no such folder" if not path.exists() else "a file, not a run folder"
        raise UserError(f"{path}: {what}; give a run folder (it holds {HYDRA}/ or {METRICS})")
    try:
        names = {e.name for e in os.scandir(path)}
    except OSError as err:
        raise UserError(f"{path}: cannot list it ({err.strerror})") from None
    if not RunDir.looks_like_run(names):
        raise UserError(
            f"{path}: not a run folder (no {HYDRA}/ and no {METRICS} in it); tags and notes "
            f"go on one run, e.g. a sweep's <sweep>/0"
        )
    return RunDir(path)


def check_tag(tag: str) -> str:
    if not TAG.fullmatch(tag):
        raise UserError(
            f"tag {tag!r}: use 1-64 letters, digits and _ . + - (starting with a letter or digit)"
        )
    return tag


def _write(run: RunDir, notes: dict[str, Any]) -> None:
    notes = {**notes, "updated": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        write_json(notes_file(run.path), notes)
    except OSError as err:
        raise UserError(f"{notes_file(run.path)}: cannot write it ({one_line(err)})") from None


def tag(run_dir: str | os.PathLike, add: list[str] = (), remove: list[str] = ()) -> list[str]:
    """Add and remove tags of a run; returns its tags after the change.

    Raises:
        UserError: not a run folder, a malformed tag, or a corrupt notes file.
    """
    run = require_run(run_dir)
    add, remove = [check_tag(t) for t in add], [check_tag(t) for t in remove]
    notes = read_notes(run.path)  # a tag both added and removed ends removed
    notes["tags"] = [t for t in dict.fromkeys(notes["tags"] + add) if t not in remove]
    notes["untagged"] = [
        t for t in dict.fromkeys(notes["untagged"] + remove) if t in remove or t not in add
    ]
    _write(run, notes)
    return read_tags(run.path)


def note(run_dir: str | os.PathLike, text: str) -> str:
    """Set a run's note (an empty text clears it); returns the note written.

    Raises:
        UserError: not a run folder, a note too long, or a corrupt notes file.
    """
    run = require_run(run_dir)
    if len(text) > MAX_NOTE_CHARS:
        raise UserError(f"the note has {len(text)} characters; at most {MAX_NOTE_CHARS}")
    _write(run, {**read_notes(run.path), "note": text})
    return text
