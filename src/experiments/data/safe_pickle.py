"""Data files that come as Python pickles (CIFAR's batches, MNIST's ``.pkl.gz``) read as data:
arrays, lists, dicts, strings, bytes and numbers only. A pickle can name any importable
callable and have it called while loading; here every such name is refused except numpy's
array reconstruction, so a crafted file is reported, never run."""

from __future__ import annotations

import io
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from experiments.errors import UserError, one_line

# what a pickled numpy array (and Python 2's bytes) needs, and nothing else
ALLOWED = frozenset(
    {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }
)


class DataUnpickler(pickle.Unpickler):
    """An unpickler that builds only plain data and numpy arrays (``ALLOWED``)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError(f"it names {module}.{name}")
        with warnings.catch_warnings():  # numpy 2 warns about its numpy.core alias
            warnings.simplefilter("ignore", DeprecationWarning)
            return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it uses persistent ids")


def loads(data: bytes, where: str | os.PathLike, encoding: str = "latin1") -> Any:
    """Unpickle ``data`` (from ``where``, named in errors) as plain data; object arrays refused.

    Raises:
        UserError: one line naming ``where`` when it holds anything but plain data.
    """
    try:
        obj = DataUnpickler(io.BytesIO(data), encoding=encoding).load()
    except Exception as err:  # refused names, truncated or not a pickle at all
        raise UserError(
            f"{where}: refused: not a plain data pickle ({one_line(err)[:120]}); it was read, "
            f"not run: replace it with the original file"
        ) from None
    _no_object_arrays(obj, where)
    return obj


def load(path: str | os.PathLike, encoding: str = "latin1") -> Any:
    """``loads`` of the file at ``path``."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror or err}") from None
    return loads(data, path, encoding)


def _no_object_arrays(obj: Any, where) -> None:
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, np.ndarray) and item.dtype.hasobject:
            raise UserError(f"{where}: refused: it holds an array of Python objects, not numbers")
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
