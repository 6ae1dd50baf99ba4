"""Never lose a run: checkpoint on SIGTERM/SIGINT (through Lightning's own signal path) and
exit with the signal's code, stop on a non-finite loss, carry RNG states for exact resume."""

from __future__ import annotations

import logging
import math
import random
import signal
import threading
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from experiments.errors import UserError
from experiments.runs.layout import LAST_CKPT, RunDir

log = logging.getLogger(__name__)


class Diverged(UserError):
    """The training loss was not finite (NaN or inf): the run cannot go on as it is."""

    def __init__(self, message: str, step: int) -> None:
        super().__init__(message)
        self.step = step


class RunInterrupted(Exception):
    """Training stopped on a signal after saving a checkpoint; exit with ``128 + signum``."""

    def __init__(self, signum: int, checkpoint: Path | None, epoch: int, step: int) -> None:
        name = signal.Signals(signum).name
        super().__init__(
            f"stopped by {name} in epoch {epoch}, at step {step}; checkpoint: {checkpoint}"
        )
        self.signum = signum


class FaultTolerance(L.Callback):
    """Make a run survive signals and divergence, and resume exactly.

    Signals take Lightning's own path: on SIGTERM its handler marks the trainer, and at the
    next step boundary Lightning raises ``SIGTERMException`` and calls every callback's
    ``on_exception``, where this callback saves ``last.ckpt`` (atomically, with the step
    finished). SIGINT is routed into the same path, so both end in a checkpoint and the
    entry point exits 143 / 130 (a second SIGINT interrupts at once).

    A NaN/inf training loss stops the run, naming the step; the check reads each step's
    flag one step later (no host-device sync per step), and at once before any checkpoint
    is written, before validation and at the epoch's last step, so no checkpoint is ever
    written from a non-finite state. Every checkpoint carries the torch / numpy /
    python / CUDA RNG states, restored just before the first training step of a resumed
    run; the position in the epoch's data order is the train loader's own state, which
    Lightning saves and restores (``ResumableLoader`` and ``StoreLoader`` in
    ``experiments.data.loaders``).

    Args:
        dirpath: folder of ``last.ckpt``; None means ``<default_root_dir>/checkpoints``.
        check_finite_loss: stop on a non-finite training loss.
        explode_factor: warn in one line naming a lower learning rate (the run goes on) when
            the first ``val/loss`` exceeds this many times the first training loss: most likely
            a divergence (e.g. SGD at lr 0.1 on a small folder of one's own images); 0: never.
    """

    def __init__(
        self, dirpath: str | None = None, check_finite_loss: bool = True, explode_factor: float = 10
    ) -> None:
        self.dirpath = Path(dirpath) if dirpath else None
        self.check_finite_loss = check_finite_loss
        self.explode_factor = float(explode_factor)
        self.first_loss: float | None = None
        self.signum: int | None = None
        self._rng_to_restore: dict[str, Any] | None = None
        self._pending: _FiniteFlag | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = RunDir(trainer.default_root_dir).checkpoints

    def _sigint(self, signum, frame) -> None:
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt  # pressed twice: stop now
        self.signum = signal.SIGINT
        log.warning("received SIGINT: saving a checkpoint after this step, then stopping")
        lightning_handler = signal.getsignal(signal.SIGTERM)
        if callable(lightning_handler):
            lightning_handler(signum, frame)  # marks the trainer as Lightning does for SIGTERM

    def on_train_start(self, trainer, pl_module) -> None:
        # Lightning registered its SIGTERM handler just before (and restores the original
        # SIGINT handler at teardown); only the main thread may set handlers
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._sigint)
        # after the sanity check and data set-up: the next draw is the first training step's
        if self._rng_to_restore is not None:
            set_rng_states(self._rng_to_restore)
            self._rng_to_restore = None

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        self.signum = self.signum or signal.SIGTERM
        pending = self._take_non_finite()
        if pending is not None:
            log.error("not saving on %s: the loss of step %d is %s",
                      signal.Signals(self.signum).name, pending.step, pending.value())  # fmt: skip
            return
        if trainer.state.fn == "fit":  # a signal during test: the fit's checkpoint stands
            trainer.save_checkpoint(self.dirpath / LAST_CKPT)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not (isinstance(outputs, dict) and "loss" in outputs):
            return
        if self.first_loss is None and trainer.global_step <= 1 and self.explode_factor > 0:
            self.first_loss = float(outputs["loss"].detach())  # one sync, the first step only
        if not self.check_finite_loss:
            return
        self._raise_if_not_finite()  # the previous step's flag: long computed by now
        self._pending = _FiniteFlag(
            outputs["loss"], trainer.global_step, trainer.current_epoch, batch_idx
        )
        if batch_idx + 1 >= trainer.num_training_batches:
            self._raise_if_not_finite()  # the epoch's last step: before epoch-end checkpoints

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.state.fn == "fit":
            self._raise_if_not_finite()  # validation (and the .pt written after it)

    def on_validation_end(self, trainer, pl_module) -> None:
        val_loss = trainer.callback_metrics.get("val/loss")
        if trainer.sanity_checking or trainer.current_epoch != 0 or val_loss is None:
            return
        value = float(val_loss)
        if self.first_loss is not None and 0 < self.explode_factor * self.first_loss < value:
            try:
                lr = float(trainer.optimizers[0].param_groups[0]["lr"])
            except (IndexError, KeyError, AttributeError, TypeError):
                lr = None
            lower = f"optimizer.lr={lr / 10:g} (it is {lr:g})" if lr else "a lower optimizer.lr"
            log.warning(
                "val/loss is %.4g after the first epoch, %.0fx the first training loss (%.4g): "
                "the run is likely diverging; try %s",
                value, value / self.first_loss, self.first_loss, lower,
            )  # fmt: skip

    def _take_non_finite(self) -> _FiniteFlag | None:
        """The pending step's flag when its loss was not finite; the flag is consumed."""
        pending, self._pending = self._pending, None
        return pending if pending is not None and not pending.finite() else None

    def _raise_if_not_finite(self) -> None:
        """Raise for a non-finite loss of the step whose flag is pending (if any)."""
        pending = self._take_non_finite()
        if pending is not None:
            raise Diverged(
                f"training loss is {pending.value()} at step {pending.step} (epoch "
                f"{pending.epoch + 1}, batch {pending.batch_idx + 1}): lower optimizer.lr, set "
                f"trainer.gradient_clip_val, or check the data; checkpoints are kept "
                f"from before this step",
                pending.step,
            )

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        self._raise_if_not_finite()  # before the file is written
        checkpoint["rng_states"] = rng_states()

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        self._rng_to_restore = checkpoint.get("rng_states")


class _FiniteFlag:
    """Whether one step's loss is finite, computed on the device and copied to the host
    without waiting (on CUDA: into pinned memory, behind an event); read later."""

    def __init__(self, loss: torch.Tensor, step: int, epoch: int, batch_idx: int) -> None:
        self.loss = loss.detach()
        self.step, self.epoch, self.batch_idx = step, epoch, batch_idx
        self.event = None
        if self.loss.device.type == "cpu" and self.loss.numel() == 1:
            self.flag = math.isfinite(self.loss.item())  # no device to wait for: ~1 µs
            return
        flag = torch.isfinite(self.loss).all()
        if flag.is_cuda:
            self.flag = torch.empty((), dtype=torch.bool, pin_memory=True)
            self.flag.copy_(flag, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.flag = flag

    def finite(self) -> bool:
        if self.event is not None:
            self.event.synchronize()  # that step's work only; done long ago in a lagged read
        return bool(self.flag)

    def value(self) -> float:
        return float(self.loss)


def rng_states() -> dict[str, Any]:
    """RNG states as plain tensors/ints (loadable with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, py_state, gauss = random.getstate()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": pos,
            "has_gauss": has_gauss,
            "cached": cached,
        },
        "python": {
            "version": version,
            "state": torch.tensor(py_state, dtype=torch.int64),
            "gauss": gauss,
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    n = states["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"])
    )
    p = states["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["state"].tolist()), p["gauss"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
