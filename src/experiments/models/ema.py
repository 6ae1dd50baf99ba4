"""An exponential moving average of a net's weights (validated, tested and exported in
place of the raw weights when ``model.ema_decay`` is set)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from experiments.errors import UserError


def ema_copy(net: nn.Module, decay: float | None) -> nn.Module | None:
    if decay is None:
        return None
    if not 0.0 < float(decay) < 1.0:
        raise UserError(f"model.ema_decay={decay} must be in (0, 1), e.g. 0.999; null turns it off")

    ema = copy.deepcopy(net)
    ema.requires_grad_(False)  # updated from the net's weights, never by the optimizer
    return ema


@torch.no_grad()
def update_ema(ema: nn.Module, net: nn.Module, decay: float, step: int) -> None:
    """One EMA step towards ``net``'s weights. The decay warms up as (1 + t) / (10 + t): a
    short run's average is not dominated by its random start (with a fixed 0.998, 8% of a
    1266-step average was the initial weights); t is the optimizer step, which a resumed
    run restores exactly."""
    decay = min(decay, (1 + step) / (10 + step))
    averaged = [*ema.parameters(), *ema.buffers()]
    current = [*net.parameters(), *net.buffers()]
    for avg, cur in zip(averaged, current, strict=True):
        if avg.dtype.is_floating_point:
            avg.lerp_(cur.detach(), 1.0 - decay)
        else:  # BatchNorm's num_batches_tracked
            avg.copy_(cur)
