"""Atomic file writes: a kill at any instant leaves the previous file whole."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import yaml

from experiments.errors import UserError, find_in_chain


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


def write_text(path: str | os.PathLike, text: str | bytes) -> Path:
    """Write ``text`` (as UTF-8) or bytes, atomically."""
    data = text.encode() if isinstance(text, str) else text
    return atomic_write(path, lambda f: f.write(data))


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """Write ``data`` as indented JSON, atomically."""
    return write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


# what a file handed to us may hold: a run dir's JSON and YAML are small; anything larger is
# not ours (a 2 KB YAML alias bomb is caught by the node budget, not the size)
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_YAML_NODES = 200_000
_MISSING: Any = object()


def read_text(path: str | os.PathLike, max_bytes: int = MAX_FILE_BYTES) -> str:
    """A text file we were handed, as UTF-8 (a BOM allowed), at most ``max_bytes``.

    Raises:
        UserError: naming the file and the problem (missing, a folder, too large, unreadable,
            not UTF-8).
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except IsADirectoryError:
        raise UserError(f"{path}: a folder where a file was expected") from None
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror or type(err).__name__})") from None
    if len(raw) > max_bytes:
        raise UserError(f"{path}: larger than {max_bytes} bytes, not a file we wrote (refused)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text (byte {err.start}); save it as UTF-8") from None


def read_json(path: str | os.PathLike, missing: Any = _MISSING, *, kind: type | None = None) -> Any:
    """A JSON file we were handed (a run dir's file is data, never trusted), parsed.

    Args:
        missing: what to return when the file does not exist; without it a missing file
            is an error. A file that exists but is corrupt is always an error, never a default.
        kind: ``dict`` or ``list`` to require that the document is one.

    Raises:
        UserError: one line naming the file and the problem.
    """
    path = Path(path)
    if missing is not _MISSING and not path.exists() and not path.is_symlink():
        return missing
    text = read_text(path)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        problem = str(err).splitlines()[0] if isinstance(err, ValueError) else "nested too deeply"
        raise UserError(f"{path}: not valid JSON ({problem}); restore or delete the file") from None
    if kind is not None and not isinstance(data, kind):
        raise UserError(
            f"{path}: holds a JSON {type(data).__name__}, expected a JSON "
            f"{'object' if kind is dict else kind.__name__}"
        )
    return data


def read_json_object(path: str | os.PathLike, missing: Any = _MISSING) -> dict[str, Any]:
    """A JSON file that must hold an object, as a dict; ``missing`` (default ``{}``) when the
    file does not exist. A corrupt file is a UserError naming it, never a quiet ``{}``."""
    return read_json(path, {} if missing is _MISSING else missing, kind=dict)


def parse_yaml(text: str, where: str, max_nodes: int = MAX_YAML_NODES) -> Any:
    """YAML text as plain Python data (safe: tags cannot build objects), refusing documents
    whose aliases would expand to more than ``max_nodes`` nodes (a "billion laughs" bomb).

    Raises:
        UserError: naming ``where`` and the problem.
    """
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        root = yaml.compose(text, Loader=loader)
        if root is not None and _expanded_nodes(root, max_nodes) > max_nodes:
            raise UserError(
                f"{where}: its aliases expand to more than {max_nodes} values (refused)"
            )
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"{where}: not valid YAML ({first})") from None
    except (RecursionError, ValueError, TypeError, OverflowError) as err:
        raise UserError(f"{where}: not valid YAML ({type(err).__name__})") from None


def _expanded_nodes(root: Any, budget: int) -> int:
    """How many nodes the document has with every alias expanded, counting up to just past
    ``budget`` (iterative, so a deep or self-referencing document cannot recurse forever)."""
    count, stack = 0, [root]
    while stack and count <= budget:
        node = stack.pop()
        count += 1
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack.extend((key, value))
    return count


def read_yaml(path: str | os.PathLike, missing: Any = _MISSING, *, kind: type | None = None) -> Any:
    """A YAML file we were handed, as plain data (see ``parse_yaml``); ``missing`` as in
    ``read_json``; ``kind`` (``dict``/``list``) requires the document to be one.

    Raises:
        UserError: one line naming the file and the problem.
    """
    path = Path(path)
    if missing is not _MISSING and not path.exists() and not path.is_symlink():
        return missing
    data = parse_yaml(read_text(path), str(path))
    if kind is not None and not isinstance(data, kind):
        expected = "a mapping of keys" if kind is dict else f"a {kind.__name__}"
        raise UserError(f"{path}: holds {type(data).__name__}, expected {expected}")
    return data


def check_writable(folder: str | os.PathLike, key: str) -> None:
    """Make ``folder`` (and its parents) and write a byte in it, so that a place results
    cannot go (a read-only file system, a file in the way, a full disk) is one line before
    anything runs, not a traceback later.

    Raises:
        UserError: naming ``key``, the path and the cause.
    """
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


WRITE_PROBLEMS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EEXIST: "a file is in the way",  # a file where a folder should be
    errno.ENOTDIR: "a file is in the way",
}


def write_problem(err: OSError) -> str:
    """What an OSError from writing means, in a few words, with the path it names."""
    what = WRITE_PROBLEMS.get(err.errno, err.strerror or type(err).__name__)
    return f"{what}: {err.filename}" if err.filename else what


def write_error(err: BaseException, run_dir) -> UserError | None:
    """A write that failed while training (a full disk, a file system turned read-only) as
    the one line to act on: the newest checkpoint written whole is still there."""
    os_error = find_in_chain(err, lambda e: isinstance(e, OSError) and e.errno in WRITE_PROBLEMS)
    if os_error is None:
        return None
    return UserError(
        f"cannot write the run's files ({write_problem(os_error)}); its last checkpoint is "
        f"intact: free space or fix the folder, then continue with: python -m experiments.train "
        f"resume={run_dir}"
    )
