"""A Lightning callback that times training steps; added to a run with
``+callbacks.bench_timer._target_=benchmarks.probe.StepTimer`` (and to bare Lightning)."""

from __future__ import annotations

import os
import time

import lightning as L
import torch


class StepTimer(L.Callback):
    """Wall time per training step over whole epochs, from epoch ``skip`` to the end of fit.

    The window spans everything a run does per epoch (steps, validation, epoch-end
    logging, checkpoints), so it compares like with like against a hand-written loop
    timed the same way. ``first_step_file``: write ``time.time()`` at the first training
    step there (start-up benchmark) and, with ``exit_after_first``, leave at once.
    """

    last: StepTimer | None = None  # the most recent instance (train() builds its own)

    def __init__(
        self, skip: int = 1, first_step_file: str | None = None, exit_after_first: bool = False
    ) -> None:
        self.skip = skip
        self.first_step_file = first_step_file
        self.exit_after_first = exit_after_first
        self.t0: float | None = None
        self.t1: float | None = None
        self.steps = 0
        self.seen_first = False
        StepTimer.last = self

    def _sync(self, pl_module) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self.seen_first:
            self.seen_first = True
            if self.first_step_file:
                with open(self.first_step_file, "w") as f:
                    f.write(repr(time.time()))
                if self.exit_after_first:
                    os._exit(0)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.skip:
            self._sync(pl_module)
            self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.t0 is not None:
            self.steps += 1

    def on_train_end(self, trainer, pl_module) -> None:
        self._sync(pl_module)
        self.t1 = time.perf_counter()

    @property
    def step_s(self) -> float:
        if self.t0 is None or self.t1 is None or not self.steps:
            return float("nan")
        return (self.t1 - self.t0) / self.steps
