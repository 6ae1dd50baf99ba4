"""Never lose a run: checkpoint on SIGTERM/SIGINT and exit with the signal's code, stop on a
non-finite loss, and carry RNG states and the data position for bit-exact resume."""

from __future__ import annotations

import logging
import random
import signal
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from experiments.errors import UserError

log = logging.getLogger(__name__)

HANDLED = (signal.SIGTERM, signal.SIGINT)


class RunInterrupted(Exception):
    """Training stopped on a signal after saving a checkpoint; exit with ``128 + signum``."""

    def __init__(self, signum: int, checkpoint: Path | None, epoch: int, step: int) -> None:
        name = signal.Signals(signum).name
        super().__init__(
            f"stopped by {name} at epoch {epoch}, step {step}; checkpoint: {checkpoint}"
        )
        self.signum = signum
        self.checkpoint = checkpoint


class FaultTolerance(L.Callback):
    """Make a run survive signals and divergence, and resume exactly.

    - SIGTERM / SIGINT: the handler only records the signal; after the current training
      step the callback saves a full checkpoint (``last.ckpt``, atomically) and raises
      ``RunInterrupted``, which the entry point turns into exit code 143 / 130. A second
      SIGINT interrupts at once.
    - A NaN/inf training loss stops the run within the step it appears, naming the step;
      no checkpoint is written from that state.
    - Every checkpoint carries the torch/numpy/python/CUDA RNG states and the position
      in the epoch's data order; on resume they are restored just before the first
      training step, and the DataModule is told how many batches of the current epoch
      were already trained on (``skip_batches``).

    Args:
        dirpath: folder of ``last.ckpt``; None means ``<default_root_dir>/checkpoints``.
        check_finite_loss: stop on a non-finite training loss.
    """

    def __init__(self, dirpath: str | None = None, check_finite_loss: bool = True) -> None:
        self.dirpath = Path(dirpath) if dirpath else None
        self.check_finite_loss = check_finite_loss
        self.signum: int | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._rng_to_restore: dict[str, Any] | None = None

    # -- signals ---------------------------------------------------------------------
    def _handler(self, signum, frame) -> None:
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # pressed twice: stop now
        self.signum = signum
        log.warning(
            "received %s: saving a checkpoint after this step, then stopping",
            signal.Signals(signum).name,
        )

    def install(self) -> None:
        """Route SIGTERM/SIGINT to this callback (main thread only; else a no-op)."""
        try:
            for signum in HANDLED:
                self._previous_handlers[signum] = signal.signal(signum, self._handler)
        except ValueError:  # not the main thread (e.g. some launchers)
            self._previous_handlers.clear()

    def uninstall(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = Path(trainer.default_root_dir) / "checkpoints"
        if not self._previous_handlers:
            self.install()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.uninstall()

    def _stop_if_signalled(self, trainer) -> None:
        if self.signum is None:
            return
        path = self.dirpath / "last.ckpt"
        trainer.save_checkpoint(path)
        raise RunInterrupted(self.signum, path, trainer.current_epoch, trainer.global_step)

    # -- per step ------------------------------------------------------------------------
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.check_finite_loss and isinstance(outputs, dict) and "loss" in outputs:
            loss = outputs["loss"]
            if not bool(torch.isfinite(loss).all()):  # one host sync per step; cheap on CPU
                raise UserError(
                    f"training loss is {float(loss)} at step {trainer.global_step} (epoch "
                    f"{trainer.current_epoch}, batch {batch_idx}): lower optimizer.lr, set "
                    f"trainer.gradient_clip_val, or check the data; checkpoints are kept "
                    f"from before this step"
                )
        self._stop_if_signalled(trainer)

    # -- exact resume ------------------------------------------------------------------
    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        progress = trainer.fit_loop.epoch_loop.batch_progress.current
        checkpoint["rng_states"] = rng_states()
        # batches of the current epoch already trained on (0 at an epoch's end)
        done = progress.processed if progress.processed < trainer.num_training_batches else 0
        checkpoint["data_position"] = {"epoch": trainer.current_epoch, "batches": int(done)}

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        self._rng_to_restore = checkpoint.get("rng_states")
        position = checkpoint.get("data_position")
        datamodule = trainer.datamodule
        if position and position["batches"] and trainer.world_size > 1:
            # DistributedSampler shards the whole epoch again: exact only at epoch boundaries
            log.warning(
                "resuming mid-epoch under DDP: epoch %d is re-shuffled from its start "
                "(%d batches were already done)",
                position["epoch"],
                position["batches"],
            )
        elif position and position["batches"] and hasattr(datamodule, "skip_batches"):
            datamodule.skip_batches(position["epoch"], position["batches"])
            # Lightning warns that a plain DataLoader cannot resume mid-epoch; ours skips the
            # batches already trained on, so that one message is wrong here
            warnings.filterwarnings(
                "ignore",
                message="You're resuming from a checkpoint that ended before the epoch ended",
            )
            log.info(
                "resuming mid-epoch: epoch %d from batch %d", position["epoch"], position["batches"]
            )

    def on_train_start(self, trainer, pl_module) -> None:
        # after the sanity check and data set-up: the next draw is the first training step's
        if self._rng_to_restore is not None:
            set_rng_states(self._rng_to_restore)
            self._rng_to_restore = None


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
