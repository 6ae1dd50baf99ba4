"""A progress bar that never floods a log file."""

from __future__ import annotations

import logging
import sys

from lightning.pytorch.callbacks import TQDMProgressBar

log = logging.getLogger(__name__)


class TerseProgressBar(TQDMProgressBar):
    """TQDM bar on a terminal; one summary line per epoch when stderr is not a TTY.

    A plain TQDM bar writes ~70 KB of carriage-return updates into a redirected log
    (SLURM, CI, ``nohup``) for a few short epochs; this writes one line per epoch.

    Args:
        refresh_rate: batches between bar updates on a terminal.
        monitor: the metric checkpoints are chosen by (``optimized_metric``): on the line
            whatever its name (``val/miou``, ``val/mae``), beside every loss and accuracy.
    """

    MAX_LINES = 20

    def __init__(self, refresh_rate: int = 10, monitor: str | None = None) -> None:
        self.monitor = monitor
        self.interactive = sys.stderr.isatty()
        super().__init__(refresh_rate=refresh_rate if self.interactive else 0)

    def get_metrics(self, trainer, pl_module) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        # the step loss reaches the loggers without self.log (models/metrics.log_to_loggers)
        step_loss = trainer.callback_metrics.get("train/loss_step")
        if step_loss is not None and trainer.training:
            metrics["train/loss_step"] = f"{float(step_loss):.3g}"
        return metrics

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self.interactive or not trainer.is_global_zero or trainer.sanity_checking:
            return
        shown = {
            k: float(v)
            for k, v in trainer.callback_metrics.items()
            if (k.endswith(("loss", "acc", "acc_best")) or k == self.monitor)
            and not k.endswith("_step")
            and v.numel() == 1
        }
        text = "  ".join(f"{k}={v:.4f}" for k, v in sorted(shown.items()))
        epoch, total = trainer.current_epoch + 1, trainer.max_epochs
        # at most ~MAX_LINES epoch lines on the console (every one is in train.log)
        every = max(1, -(-int(total or 1) // self.MAX_LINES))
        console = epoch % every == 0 or epoch == 1 or epoch == total
        log.info("epoch %d/%d  %s", epoch, total, text, extra={"console": console})
