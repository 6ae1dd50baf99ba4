"""A run's (or sweep's) ``manifest.json``: every artifact's sha256 and size, written last and
atomically, so that an edit made after the fact -- a swapped checkpoint, an edited
``metrics.json``, a replaced ``model.onnx`` -- is found in seconds, without re-training.

What is listed: every regular file under the folder, except the manifest itself, logs that
grow after the run (``*.log``), tracker folders that their own tools rewrite (``wandb/``,
``mlruns/``, ``csv/``, ``tensorboard/``), lock files and our own temp files. A symlink is
never followed: it is listed as a link, by its target text.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from experiments.errors import UserError
from experiments.runs.files import read_json_object, write_json

MANIFEST = "manifest.json"
VERSION = 1
SKIPPED_DIRS = frozenset({"wandb", "mlruns", "csv", "tensorboard", "__pycache__", "profile"})
SKIPPED_NAMES = frozenset({MANIFEST, ".lock"})
CHUNK = 1 << 20


def _listed(path: Path) -> bool:
    name = path.name
    return not (
        name in SKIPPED_NAMES or name.endswith((".log", ".tmp")) or name.startswith(".write-check.")
    )


def artifacts(folder: Path) -> Iterable[Path]:
    """The files a manifest of ``folder`` lists, relative to it, in a stable order."""
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("fold_"))
        for name in sorted(files):
            path = Path(root) / name
            if _listed(path):
                yield path.relative_to(folder)


def digest(path: Path) -> dict:
    """``{"sha256", "size"}`` of a file (a symlink: of its target text, never followed)."""
    if path.is_symlink():
        text = os.readlink(path).encode()
        return {"sha256": hashlib.sha256(text).hexdigest(), "size": len(text), "link": True}
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return {"sha256": sha.hexdigest(), "size": size}


def write_manifest(folder: str | os.PathLike) -> Path:
    """Hash every artifact of ``folder`` into ``<folder>/manifest.json`` (atomically; last)."""
    folder = Path(folder)
    files = {str(rel): digest(folder / rel) for rel in artifacts(folder)}
    return write_json(
        folder / MANIFEST,
        {"version": VERSION, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": files},
    )


@dataclass
class Integrity:
    """What checking a folder against its manifest found."""

    folder: Path
    has_manifest: bool
    checked: int = 0
    modified: list[str] = field(default_factory=list)  # size or sha256 differs
    missing: list[str] = field(default_factory=list)  # listed, no longer there
    unlisted: list[str] = field(default_factory=list)  # there, not listed (added later)

    @property
    def intact(self) -> bool:
        return self.has_manifest and not (self.modified or self.missing)

    def lines(self) -> list[str]:
        """One line per finding, naming the file."""
        if not self.has_manifest:
            return [
                f"{self.folder}: no {MANIFEST} (a run written before manifests, or one that "
                f"never finished): nothing to check its files against"
            ]
        out = [f"{self.folder / f}: modified after the run (sha256 differs)" for f in self.modified]
        out += [f"{self.folder / f}: listed in {MANIFEST} but missing" for f in self.missing]
        out += [
            f"{self.folder / f}: added after the run (not in {MANIFEST})" for f in self.unlisted
        ]
        return out


def _entries(folder: Path) -> dict[str, dict] | None:
    path = folder / MANIFEST
    if not path.exists():
        return None
    data = read_json_object(path)
    files = data.get("files")
    if data.get("version") != VERSION or not isinstance(files, dict):
        raise UserError(f"{path}: not a manifest this version writes (refused)")
    for name, entry in files.items():
        ok = isinstance(entry, dict) and isinstance(entry.get("sha256"), str)
        if not ok or not isinstance(entry.get("size"), int) or ".." in Path(name).parts:
            raise UserError(f"{path}: a malformed entry for {name!r} (refused)")
    return files


def check_integrity(folder: str | os.PathLike, only: Iterable[str] | None = None) -> Integrity:
    """Compare ``folder``'s files with its manifest (all listed files, or ``only`` these
    relative paths). Sizes are compared first, so an unchanged run checks in seconds.

    Raises:
        UserError: a corrupt or malformed manifest (one line naming it).
    """
    folder = Path(folder)
    entries = _entries(folder)
    result = Integrity(folder, entries is not None)
    if entries is None:
        return result
    names = sorted(entries) if only is None else [str(n) for n in only]
    for name in names:
        path = folder / name
        entry = entries.get(name)
        if entry is None:
            if path.exists() or path.is_symlink():
                result.unlisted.append(name)
            continue
        if not (path.exists() or path.is_symlink()):
            result.missing.append(name)
            continue
        result.checked += 1
        now = digest(path)
        if now["size"] != entry["size"] or now["sha256"] != entry["sha256"]:
            result.modified.append(name)
    if only is None:
        listed = set(entries)
        result.unlisted = [str(rel) for rel in artifacts(folder) if str(rel) not in listed]
    return result


def require_intact(
    folder: str | os.PathLike, files: Iterable[str | os.PathLike], trust_modified: bool = False
) -> None:
    """Refuse to use files of a run that differ from its manifest (or were added after it).

    A run without a manifest (an older one) passes: there is nothing to check against.
    Files outside ``folder`` are not the run's and are not checked.

    Raises:
        UserError: naming the first file whose hash does not match, and the way out
            (``trust_modified=true``); the commands exit 1 on it, as tampering.
    """
    if trust_modified:
        return
    folder = Path(folder).resolve()
    rel = []
    for f in files:
        path = Path(f).resolve() if Path(f).is_absolute() else (folder / f).resolve()
        if path.is_relative_to(folder):
            rel.append(str(path.relative_to(folder)))
    result = check_integrity(folder, rel)
    if result.has_manifest and (result.modified or result.missing or result.unlisted):
        raise TamperedError(
            f"{result.lines()[0]}; refusing to use it (experiments-verify {folder} integrity=true "
            f"lists every difference; trust_modified=true uses it anyway)"
        )


class TamperedError(UserError):
    """A run's file differs from its manifest: the commands exit 1 (tampering), not 2."""
