"""Atomic file writes: a kill at any instant leaves the previous file whole."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from experiments.errors import UserError


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> Path:
    """Write a file through ``write(f)`` so that ``path`` is always old-and-whole or new-and-whole.

    The bytes go to a temp file in the same folder (same filesystem, so the rename is
    atomic), are flushed and fsynced, then renamed over ``path``; the folder is fsynced
    so the rename itself survives a power cut.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some filesystems do not let a folder be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """Write ``data`` as indented JSON, atomically."""
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    return atomic_write(path, lambda f: f.write(text.encode()))


def read_json_object(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON file that holds an object, as a dict; {} when it is missing, unreadable or
    holds anything else (files read back from a run dir are data, never trusted)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def check_writable(folder: str | os.PathLike, key: str) -> None:
    """Make ``folder`` (and its parents) and write a byte in it, so that a place results
    cannot go (a read-only file system, a file in the way, a full disk) is one line before
    anything runs, not a traceback later.

    Raises:
        UserError: naming ``key``, the path and the cause.
    """
    from experiments.errors import UserError

    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-check.", dir=folder)
        try:
            os.write(fd, b"x")
            os.fsync(fd)
        finally:
            os.close(fd)
            Path(probe).unlink(missing_ok=True)
    except OSError as err:
        raise UserError(
            f"{key}={folder}: cannot write there ({write_problem(err)}); choose another folder "
            f"or fix that one"
        ) from None


def write_problem(err: OSError) -> str:
    """What an OSError from writing means, in a few words, with the path it names."""
    what = {
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "disk quota exceeded",
        errno.EROFS: "read-only file system",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.EEXIST: "a file is in the way",
        errno.ENOTDIR: "a file is in the way",
    }.get(err.errno, err.strerror or type(err).__name__)
    return f"{what}: {err.filename}" if err.filename else what


WRITE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
    | {errno.EEXIST, errno.ENOTDIR}  # a file where a folder should be
)


def find_write_error(err: BaseException | None) -> OSError | None:
    """The OSError of a failed write (full disk, read-only, permissions) behind ``err``."""
    from experiments.errors import find_in_chain

    return find_in_chain(err, lambda e: isinstance(e, OSError) and e.errno in WRITE_ERRNOS)


def write_error(err: BaseException, run_dir) -> UserError | None:
    """A write that failed while training (a full disk, a file system turned read-only) as
    the one line to act on: the newest checkpoint written whole is still there."""
    from experiments.errors import UserError

    os_error = find_write_error(err)
    if os_error is None:
        return None
    return UserError(
        f"cannot write the run's files ({write_problem(os_error)}); its last checkpoint is "
        f"intact: free space or fix the folder, then continue with: python -m experiments.train "
        f"resume={run_dir}"
    )
