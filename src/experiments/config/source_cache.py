"""What reading sources found, kept between processes: a config check reads Lightning's
and torch's sources (the Trainer's module alone is 70 ms to parse), the same files every
start. Each entry lists the files it was read from, with a digest of their content;
one whose files changed is read again. The cache is plain JSON in the user's cache
folder; anything in it that is not what this module wrote is ignored, never trusted."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

MISSING = object()
_VERSION = 1
_recording: list[set[str]] = []
_state: dict[str, Any] = {"entries": None, "dirty": False}


def cache_file() -> Path:
    root = os.environ.get("EXPERIMENTS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "experiments"
    )
    return Path(root) / "signatures.json"


def touched(path: str) -> None:
    """A source file was read: every entry being computed depends on it."""
    for files in _recording:
        files.add(path)


@contextmanager
def recording():
    files: set[str] = set()
    _recording.append(files)
    try:
        yield files
    finally:
        _recording.remove(files)


def get(key: str) -> Any:
    entry = _entries().get(_scoped(key))
    if not isinstance(entry, dict) or not isinstance(entry.get("files"), dict):
        return MISSING
    for path, stamp in entry["files"].items():
        if _stamp(path) != stamp:
            return MISSING
    return entry.get("value")


def put(key: str, value: Any, files: set[str]) -> None:
    stamps = {p: _stamp(p) for p in files}
    if any(s is None for s in stamps.values()):
        return
    _entries()[_scoped(key)] = {"files": stamps, "value": value}
    _state["dirty"] = True


def save() -> None:
    """Write what was added (atomically; a cache that cannot be written is no error)."""
    if not _state["dirty"]:
        return
    from experiments.runs.files import write_json

    try:
        cache_file().parent.mkdir(parents=True, exist_ok=True)
        write_json(cache_file(), {"version": _VERSION, "entries": _entries()})
        _state["dirty"] = False
    except OSError:
        pass


def _entries() -> dict:
    if _state["entries"] is None:
        try:
            data = json.loads(cache_file().read_text())
            ok = isinstance(data, dict) and data.get("version") == _VERSION
            entries = data.get("entries") if ok else None
        except (OSError, ValueError):
            entries = None
        _state["entries"] = entries if isinstance(entries, dict) else {}
    return _state["entries"]


def _scoped(key: str) -> str:
    return f"{sys.prefix}|{key}"  # two environments may hold other versions of one module


@cache  # a source does not change while a process checks a config
def _stamp(path: str) -> str | None:
    """The file's content digest: reading and hashing a source costs a hundredth of
    parsing it, and, unlike a modification time, cannot miss an edit."""
    try:
        return hashlib.blake2b(Path(path).read_bytes(), digest_size=12).hexdigest()
    except OSError:
        return None
