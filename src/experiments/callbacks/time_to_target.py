"""``target='val/acc>=0.99'``: the wall seconds until a run first reaches a target, from the
process's launch and from its first training step, in ``metrics.json`` (and so in the
sweep summary and compare, with an interval over seeds)."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import lightning as L

from experiments.runs.sweep import OPS, parse_target

log = logging.getLogger(__name__)

FROM_LAUNCH = "time_to_target/from_launch_s"
FROM_FIRST_STEP = "time_to_target/from_first_step_s"
REACHED = "time_to_target/reached"
EPOCH = "time_to_target/epoch"
_process_start_taken = False


def process_start() -> float | None:
    """When this process started (``time.time()`` scale), from ``/proc`` on Linux; None
    elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class TimeToTarget(L.Callback):
    """Watch a validation metric against a target and record when it is first reached.

    From launch: from the process's start for its first run (imports and start-up
    included), from the run's own start for the next jobs of a sweep in the same process.
    A resumed run adds the seconds its earlier part took; the time between is not counted.

    Args:
        target: ``<stage/metric><op><number>``, e.g. ``val/acc>=0.99`` or ``val/mae<=40``;
            None records nothing.
    """

    def __init__(self, target: str | None = None) -> None:
        global _process_start_taken
        self.target = parse_target(target, "target") if target else None
        started = None if _process_start_taken else process_start()
        _process_start_taken = True
        self.launched = started if started is not None else time.time()
        self.first_step: float | None = None
        self.earlier = {"launch": 0.0, "first_step": 0.0}  # seconds of a resumed run's past
        self.reached: dict[str, float] | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.first_step is None:
            self.first_step = time.time()

    def on_validation_end(self, trainer, pl_module) -> None:
        # here, not at on_validation_epoch_end: Lightning updates callback_metrics with this
        # validation's values only after the epoch-end hooks (there it still holds the last)
        if self.target is None or trainer.sanity_checking or self.reached is not None:
            return
        metric, op, value = self.target
        got = trainer.callback_metrics.get(metric)
        if got is not None and OPS[op](float(got), value):
            now = time.time()
            self.reached = {
                FROM_LAUNCH: self.earlier["launch"] + now - self.launched,
                FROM_FIRST_STEP: self.earlier["first_step"] + now - (self.first_step or now),
                EPOCH: float(trainer.current_epoch + 1),
            }
            log.info(
                "target %s%s%g reached at epoch %d: %.1f s from launch, %.1f s from the "
                "first step", metric, op, value, trainer.current_epoch + 1,
                self.reached[FROM_LAUNCH], self.reached[FROM_FIRST_STEP],
            )  # fmt: skip

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        # logged here (a hook that may log, after the epoch's validation) so metrics.json and
        # the loggers get it
        if self.target is None:
            return
        for key, number in {**(self.reached or {}), REACHED: float(bool(self.reached))}.items():
            pl_module.log(key, number, on_step=False, on_epoch=True, sync_dist=False)

    def state_dict(self) -> dict[str, Any]:
        now = time.time()
        return {
            "reached": self.reached,
            "launch": self.earlier["launch"] + now - self.launched,
            "first_step": self.earlier["first_step"] + now - (self.first_step or now),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reached = state.get("reached")
        self.earlier = {"launch": float(state["launch"]), "first_step": float(state["first_step"])}
