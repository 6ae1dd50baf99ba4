"""Stand-ins for the faults of tests/test_sweep_faults.py and tests/test_remedies.py,
importable by Hydra ``_target_`` paths from a run's own process (a sweep worker included)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback

from experiments.errors import UserError


class CpuAllocatorFailsAbove(Callback):
    """For a training batch larger than ``max_batch``, asks the CPU allocator for 1 PiB:
    more than any address space, so the real ``DefaultCPUAllocator: can't allocate memory``
    RuntimeError is raised (what a too-large batch on a CPU ends in), not a fake one."""

    def __init__(self, max_batch: int) -> None:
        self.max_batch = max_batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch[0].shape[0] > self.max_batch:
            torch.empty(2**50, dtype=torch.uint8)


class RefuseValue(Callback):
    """A callback whose ``value`` may not be ``refused``: a one-line user error that only
    the grid job with that value meets, as it builds its callbacks."""

    def __init__(self, value: int, refused: int) -> None:
        if value == refused:
            raise UserError(f"callbacks.refuse.value={value} is not valid: expected not {refused}")


class Started(Callback):
    """Marks that training started (``<folder>/started-<pid>``, holding the pid of this
    process's parent), then makes each step take ``step_s`` seconds: a job that is still
    training long after the test has seen it start."""

    def __init__(self, folder: str, step_s: float = 0.5) -> None:
        self.folder, self.step_s = folder, step_s

    def on_train_start(self, trainer, pl_module) -> None:
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        marker = Path(self.folder, f"started-{os.getpid()}")
        marker.with_suffix(".tmp").write_text(str(os.getppid()))
        marker.with_suffix(".tmp").rename(marker)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.step_s)
