"""Weights-only state_dict files: written atomically and loaded so that a loaded file never
runs code. ``.safetensors`` (``best.safetensors``, ``last.safetensors``: the format the field
adopted for weights that are only tensors, with no pickle at all) is what runs write; a
``.pt`` of an older run is loaded with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from experiments.errors import UserError, one_line
from experiments.runs.files import atomic_write, write_text

COMPILE_PREFIX = "_orig_mod."
SAFETENSORS = ".safetensors"


def save_state_dict(state_dict: dict, path: str | os.PathLike) -> Path:
    """Save a state_dict atomically, with ``_orig_mod.`` (torch.compile) stripped: as
    safetensors when ``path`` ends in ``.safetensors``, else with ``torch.save``."""
    clean = strip_compile_prefix(state_dict)
    if str(path).endswith(SAFETENSORS):
        # contiguous, unshared CPU copies: safetensors refuses views and shared storage
        tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in clean.items()}
        return write_text(path, save(tensors))
    return atomic_write(path, lambda f: torch.save(clean, f))


def strip_compile_prefix(state_dict: dict) -> dict:
    """Drop the ``_orig_mod.`` that ``torch.compile(module)`` puts in front of every key."""
    return {k.replace(COMPILE_PREFIX, ""): v for k, v in state_dict.items()}


def safe_load(path: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """``torch.load(weights_only=True)``: tensors and plain containers, never code.

    Raises:
        UserError: one line naming the file when it is missing, empty, truncated or
            carries pickled objects (which are refused, never run).
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint not found: {path}")
    if path.stat().st_size == 0:
        raise UserError(f"checkpoint {path} is empty (0 bytes)")
    if path.suffix == SAFETENSORS:
        device = str(map_location) if isinstance(map_location, str) else "cpu"
        try:
            return load_file(path, device=device)
        except (SafetensorError, OSError, ValueError, RuntimeError) as err:
            reason = one_line(err)
    else:
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except Exception as err:  # truncated zip, pickle refused by the weights-only unpickler
            reason = one_line(err)
            if "weights_only" in str(err) or "Unsupported" in str(err):
                reason = "it holds pickled objects that are not plain data (refused, not run)"
    raise UserError(f"checkpoint {path} cannot be loaded: {reason[:200]}")


def read_state_dict(path: str | os.PathLike, map_location: Any = "cpu") -> dict:
    """Load a weights-only state_dict file safely (see ``safe_load``)."""
    obj = safe_load(path, map_location)
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()
    ):
        raise UserError(f"checkpoint {path} is not a state_dict (a dict of name -> tensor)")
    return strip_compile_prefix(obj)


def load_state_dict_file(net, path: str | os.PathLike, map_location: Any = "cpu") -> None:
    """Load ``path`` into ``net`` (safely, see ``read_state_dict``); keys must match exactly."""
    state_dict = read_state_dict(path, map_location)
    own = set(net.state_dict())
    missing, unexpected = sorted(own - set(state_dict)), sorted(set(state_dict) - own)
    if missing or unexpected:
        raise UserError(
            f"checkpoint {path} does not fit this network: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    try:
        net.load_state_dict(state_dict)
    except RuntimeError as err:  # shape mismatch
        raise UserError(
            f"checkpoint {path} does not fit this network: {one_line(err, last=True)}"
        ) from None
