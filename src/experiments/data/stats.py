"""Per-channel mean / std of a training split: computed once, recorded in the run dir, and
read back by every later process of that run (resume, eval, predict)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset

from experiments.errors import UserError

log = logging.getLogger(__name__)

AUTO = "auto"


def channel_stats(dataset: Dataset, max_samples: int = 10_000) -> tuple[list[float], list[float]]:
    """Mean and std per channel over up to ``max_samples`` samples spread evenly over
    ``dataset`` (whose samples are ``(C, H, W)`` float tensors before normalization)."""
    n = len(dataset)
    picks = torch.linspace(0, n - 1, steps=min(n, max_samples)).round().long().unique().tolist()
    total = total_sq = None
    count = 0
    for i in picks:
        x = torch.as_tensor(dataset[i][0], dtype=torch.float64).flatten(1)  # (C, H*W)
        s, sq = x.sum(dim=1), (x * x).sum(dim=1)
        total = s if total is None else total + s
        total_sq = sq if total_sq is None else total_sq + sq
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
        if path is not None and path.is_file():
            saved = json.loads(path.read_text())
            return list(saved["mean"]), list(saved["std"])
        if train_split is None:
            raise UserError(f"data.mean=auto: no statistics file {path} to read them from")
        mean, std = channel_stats(train_split)
        log.info("data statistics of the training split: mean %s, std %s", mean, std)
        if path is not None:
            from experiments.runs.files import write_json

            write_json(path, {"mean": mean, "std": std, "computed_from": "train split"})
        return mean, std
    mean, std = [float(v) for v in mean], [float(v) for v in std]
    if len(mean) != len(std) or not mean or min(std) <= 0:
        raise UserError(f"data.mean={mean} / data.std={std}: one value per channel, std > 0")
    return mean, std


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``(x - mean) / std`` per channel of a ``(B, C, H, W)`` batch, on its device."""
    m = torch.as_tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return (x - m) / s
