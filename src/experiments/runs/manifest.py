"""A run's (or sweep's) ``manifest.json``: every artifact's sha256 and size, written last and
atomically, so that an edit made after the fact -- a swapped checkpoint, an edited
``metrics.json``, a replaced ``model.onnx`` -- is found in seconds, without re-training.

What is listed: every regular file under the folder, except the manifest itself, logs that
grow after the run (``*.log``), tracker folders that their own tools rewrite (``wandb/``,
``mlruns/``, ``csv/``, ``tensorboard/``), lock files and our own temp files. A symlink is
never followed: it is listed as a link, by its target text. A subfolder with a manifest of
its own (a sweep's job, a cross-validation fold) is checked against its own, not listed in
the parent's (``check_tree`` walks them all).

The commands that add files to a finished run (eval, calibrate, export, predict) open it
through ``SavedRun``, which checks the manifest first, and ``refresh`` it after they write:
only what changed since that check is re-hashed, so a file that was already modified keeps
its old entry and is never blessed.

What it does not defend against: someone who can write the folder can also write a new
manifest that matches their edits. It shows an accident or an edit made after the fact;
authenticity needs a signature over the manifest, kept elsewhere.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from experiments.errors import UserError
from experiments.runs.files import read_json_object, write_json
from experiments.runs.layout import FOLD_PREFIX, JOB_FILE, MANIFEST, NOTES

log = logging.getLogger(__name__)

VERSION = 1
SKIPPED_DIRS = frozenset({"wandb", "mlruns", "csv", "tensorboard", "__pycache__", "profile"})
SKIPPED_NAMES = frozenset({MANIFEST, NOTES})  # notes: a user's annotation, added later
CHUNK = 1 << 20


def artifacts(folder: Path) -> Iterable[Path]:
    """The files a manifest of ``folder`` lists (see above), relative to it, in a stable order.
    A job's ``job.json`` is in the sweep's manifest, not the job's: the sweep writes that
    record after the job's manifest."""
    folder = Path(folder)
    for root, dirs, files in os.walk(folder, followlinks=False):
        here = Path(root)
        own = [d for d in dirs if (here / d / MANIFEST).exists()]
        skip = (*SKIPPED_DIRS, *own)
        dirs[:] = sorted(d for d in dirs if d not in skip and not d.startswith(FOLD_PREFIX))
        skipped = {*SKIPPED_NAMES, JOB_FILE} if here == folder else SKIPPED_NAMES
        listed = [here / n for n in files if n not in skipped and not _temporary(n)]
        listed += [here / d / JOB_FILE for d in own if (here / d / JOB_FILE).is_file()]
        for path in sorted(listed):
            yield path.relative_to(folder)


def _temporary(name: str) -> bool:
    return name.endswith((".log", ".tmp", ".lock", "-journal")) or name.startswith(".write-check.")


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
    return _write(folder, {str(rel): digest(folder / rel) for rel in artifacts(folder)})


def _write(folder: Path, files: dict[str, dict]) -> Path:
    return write_json(
        folder / MANIFEST,
        {
            "version": VERSION,
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "files": dict(sorted(files.items())),
        },
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
    seen: dict[str, dict] = field(default_factory=dict)  # every file's digest when checked

    @property
    def intact(self) -> bool:
        return self.has_manifest and not (self.modified or self.missing or self.unlisted)

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
        elif not (path.exists() or path.is_symlink()):
            result.missing.append(name)
        else:
            result.checked += 1
            now = result.seen[name] = digest(path)
            if not _same(now, entry):
                result.modified.append(name)
    if only is None:
        listed = set(entries)
        result.unlisted = [str(rel) for rel in artifacts(folder) if str(rel) not in listed]
        result.seen.update({name: digest(folder / name) for name in result.unlisted})
    return result


def _same(a: dict, b: dict) -> bool:
    return a["size"] == b["size"] and a["sha256"] == b["sha256"]


def check_tree(folder: str | os.PathLike) -> list[Integrity]:
    """``check_integrity`` of ``folder`` and of every subfolder with a manifest of its own
    (a sweep's jobs, cross-validation folds), the folder first."""
    folder = Path(folder)
    found = [check_integrity(folder)]
    for root, dirs, _ in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for d in dirs:
            if (Path(root) / d / MANIFEST).is_file():
                found.append(check_integrity(Path(root) / d))
    return found


def refresh(folder: str | os.PathLike, before: Integrity) -> Path | None:
    """Update ``folder``'s manifest after a command wrote into it (see above): a file that
    changed, appeared or went since ``before`` (the check made when the command opened the
    run) gets a new entry; every other entry stays. A folder without a manifest (an older run)
    gets none: a new one would vouch for files nobody compared. Returns the manifest, or None.
    """
    folder = Path(folder)
    entries = _entries(folder)
    if entries is None or not before.has_manifest:
        return None
    files = dict(entries)
    now = {str(rel): digest(folder / rel) for rel in artifacts(folder)}
    for name, current in now.items():
        then = before.seen.get(name)
        if then is None or not _same(current, then):  # written by the command
            files[name] = current
    for name in set(before.seen) - set(now):  # removed by the command
        files.pop(name, None)
    return _write(folder, files)


def require_intact(
    folder: str | os.PathLike, files: Iterable[str | os.PathLike] = (), trust_modified=False
) -> Integrity:
    """Check a run before a command uses it; refuse one that was modified after the fact.

    Any listed file that differs from the manifest refuses the run (the commands write a
    model card from all of its files, and a run with an edited file is not the run that was
    trained); ``files`` -- the ones the command reads, e.g. its checkpoint -- are refused
    when missing or added after the run too (a ``best.pt`` dropped beside the run's
    ``best.safetensors``). A run without a manifest (an older one) passes: there is nothing
    to check against. Files outside ``folder`` are not the run's and are not checked.

    Returns:
        What was found (hand it to ``refresh`` after writing into the run).

    Raises:
        TamperedError: naming the first file that does not match, how many more, and the
            way out (``trust_modified=true``); the commands exit 1 on it, as tampering.
    """
    folder = Path(folder)
    result = check_integrity(folder)
    root = folder.resolve()
    paths = [(root / f).resolve() for f in files]  # an absolute f stays itself
    used = {str(p.relative_to(root)) for p in paths if p.is_relative_to(root)}
    bad = [*result.modified, *(f for f in result.missing + result.unlisted if f in used)]
    if not bad:
        return result
    lines = [line for line in result.lines() if any(str(folder / b) in line for b in bad)]
    if trust_modified:
        for line in lines:
            log.warning("%s (used anyway: trust_modified=true)", line)
        return result
    more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
    raise TamperedError(
        f"{lines[0]}{more}; refusing to use the run (experiments-verify {folder} "
        f"integrity=true lists every difference; trust_modified=true uses it anyway)"
    )


class TamperedError(UserError):
    """A run's file differs from its manifest: the commands exit 1 (tampering), not 2."""

    exit_code = 1
