"""Per-channel mean / std of a training split: computed once, recorded in the run dir, and
read back by every later process of that run (resume, eval, predict)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset

from experiments.errors import UserError, one_line
from experiments.runs.files import read_json_object, write_json

log = logging.getLogger(__name__)

AUTO = "auto"


def channel_stats(dataset: Dataset, max_samples: int = 10_000) -> tuple[list[float], list[float]]:
    """Mean and std per channel over up to ``max_samples`` samples spread evenly over
    ``dataset`` (whose samples are ``(C, H, W)`` float tensors before normalization)."""
    n = len(dataset)
    picks = torch.linspace(0, n - 1, steps=min(n, max_samples)).round().long().unique().tolist()
    total = total_sq = count = 0
    for i in picks:
        x = torch.as_tensor(dataset[i][0], dtype=torch.float64).flatten(1)  # (C, H*W)
        total, total_sq = total + x.sum(dim=1), total_sq + (x * x).sum(dim=1)
        count += x.shape[1]
    mean = total / count
    std = (total_sq / count - mean * mean).clamp_min(1e-12).sqrt()
    return [round(float(v), 6) for v in mean], [round(float(v), 6) for v in std]


def resolve_stats(
    mean: Sequence[float] | str | None,
    std: Sequence[float] | str | None,
    stats_file: str | Path | None,
    train_split: Dataset | None,
) -> tuple[list[float], list[float]] | None:
    """The ``(mean, std)`` to normalize with, or None for no normalization.

    ``auto`` takes them from ``stats_file`` when it exists, else computes them from
    ``train_split`` and writes the file, so they are computed once per run.

    Raises:
        UserError: only one of mean / std given, lengths differ, a zero std, or ``auto``
            with neither a stats file nor a training split to compute from.
    """
    if mean is None and std is None:
        return None
    if (mean == AUTO) != (std == AUTO) or mean is None or std is None:
        raise UserError(
            f"data.mean={mean!r} and data.std={std!r}: give both as lists, both auto, or both null"
        )
    if mean == AUTO:
        path = Path(stats_file) if stats_file else None
        if path is not None and (path.exists() or path.is_symlink()):
            return read_stats(path)
        if train_split is None:
            raise UserError(f"data.mean=auto: no statistics file {path} to read them from")
        mean, std = channel_stats(train_split)
        log.info("data statistics of the training split: mean %s, std %s", mean, std)
        if path is not None:
            write_json(path, {"mean": mean, "std": std, "computed_from": "train split"})
        return mean, std
    mean, std = [float(v) for v in mean], [float(v) for v in std]
    if len(mean) != len(std) or not mean or min(std) <= 0:
        raise UserError(f"data.mean={mean} / data.std={std}: one value per channel, std > 0")
    return mean, std


def read_stats(path: Path) -> tuple[list[float], list[float]]:
    """The ``(mean, std)`` recorded in ``path`` (a run's ``data_stats.json``), checked: one
    finite number per channel in each, std > 0.

    Raises:
        UserError: one line naming the file, the problem and the way out (deleting it makes
            a run compute the statistics again from its training split).
    """
    fix = "delete it to compute them again from the training split"
    try:
        saved = read_json_object(path, missing=None)
    except UserError as err:
        raise UserError(f"{one_line(err)} (data statistics: {fix})") from None
    mean, std = saved.get("mean"), saved.get("std")

    def numbers(value) -> bool:
        return (
            isinstance(value, list)
            and 0 < len(value) <= 16
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
            and all(math.isfinite(v) for v in value)
        )

    if not (numbers(mean) and numbers(std) and len(mean) == len(std) and min(std) > 0):
        raise UserError(
            f'{path}: data statistics must be {{"mean": [...], "std": [...]}} with one '
            f"finite number per channel and std > 0; {fix}"
        )
    return [float(v) for v in mean], [float(v) for v in std]


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``(x - mean) / std`` per channel of a ``(B, C, H, W)`` batch, on its device."""
    m = torch.as_tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return (x - m) / s
