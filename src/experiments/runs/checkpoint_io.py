"""Full Lightning checkpoints (weights, optimizer, loops, RNG) that survive kills and never
run code when loaded."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import CheckpointIO

from experiments.errors import UserError
from experiments.runs.files import atomic_write
from experiments.runs.layout import LAST_CKPT, PREVIOUS_SUFFIX
from experiments.runs.weights import safe_load

log = logging.getLogger(__name__)


def _all_finite(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return not obj.is_floating_point() or bool(torch.isfinite(obj).all())
    if isinstance(obj, dict):
        return all(_all_finite(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return all(_all_finite(v) for v in obj)
    return True


class AtomicCheckpointIO(CheckpointIO):
    """Save with temp file + fsync + rename in the target folder; load with weights_only.

    Lightning's default writes through a temporary file in TMPDIR and moves it, without
    fsync: a kill can leave a torn ``last.ckpt``. Here the previous file is first kept as
    ``<name>.prev`` so that a crash at any instant leaves at least one whole checkpoint,
    and a checkpoint whose weights are not finite is refused (the good one stays).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        path = Path(path)
        if not _all_finite(checkpoint.get("state_dict", {})):
            log.error("not saving %s: the weights hold NaN/inf (the previous file is kept)", path)
            return
        if path.is_file():
            os.replace(path, path.with_name(path.name + PREVIOUS_SUFFIX))
        atomic_write(path, lambda f: torch.save(checkpoint, f))

    def load_checkpoint(self, path, map_location=None, weights_only: bool | None = None):
        # also used by the fork/spawn launchers for their own hand-off files: any layout
        return load_full_checkpoint(path, map_location, require_state_dict=False)

    def remove_checkpoint(self, path) -> None:
        Path(path).unlink(missing_ok=True)


def load_full_checkpoint(
    path, map_location: Any = "cpu", require_state_dict: bool = True
) -> dict[str, Any]:
    """Load a full checkpoint safely (``experiments.runs.weights.safe_load``), one-line errors."""
    path = Path(path)
    checkpoint = safe_load(path, map_location)
    if not isinstance(checkpoint, dict) or (require_state_dict and "state_dict" not in checkpoint):
        raise UserError(f"checkpoint {path} is not a Lightning checkpoint (no state_dict)")
    return checkpoint


def first_loadable(candidates: Iterable[Path]) -> tuple[Path, dict] | None:
    """The first of ``candidates`` (newest first) that loads, with its content; a broken file
    is reported and skipped, so a resume falls back to the one before."""
    for candidate in candidates:
        if not candidate.is_file():
            continue
        try:
            return candidate, load_full_checkpoint(candidate)
        except UserError as err:
            log.warning("%s; trying the previous checkpoint", err)
    return None


def newest_valid_checkpoint(folder: Path) -> tuple[Path, dict] | None:
    """The newest loadable of ``last.ckpt`` and its ``.prev`` in ``folder`` (a run's
    ``RunDir.checkpoints``)."""
    last = Path(folder) / LAST_CKPT
    return first_loadable([last, last.with_name(last.name + PREVIOUS_SUFFIX)])


def remove_stale_temp_files(folder: Path) -> None:
    """Delete ``.*.tmp`` files left in ``folder`` by a write that was killed half-way."""
    stale = list(Path(folder).glob(".*.tmp"))
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    if stale:
        log.info("removed %d stale temporary file(s) from %s", len(stale), folder)
