"""Lightning's private API (see ``experiments.compat``)."""

from __future__ import annotations

import csv
from typing import Any

from lightning.pytorch.loggers import CSVLogger as _LightningCSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.utilities.exceptions import SIGTERMException

# the marker a fork/spawn worker's error carries to the parent when a signal stopped it
WORKER_INTERRUPTED = "WorkerInterrupted"


class WorkerInterrupted(Exception):
    """A DDP fork/spawn worker stopped on SIGTERM/SIGINT after its checkpoint was saved."""


class _SignalSafeLauncher(_MultiProcessingLauncher):
    """Lightning's fork/spawn launcher whose workers run ``on_exception`` on a signal."""

    def _wrapping_function(self, process_idx, trainer, function, *args: Any, **kwargs: Any):
        try:
            return super()._wrapping_function(process_idx, trainer, function, *args, **kwargs)
        except SIGTERMException as stop:
            if trainer is not None:
                for callback in trainer.callbacks:
                    callback.on_exception(trainer, trainer.lightning_module, stop)
            raise WorkerInterrupted(
                f"{WORKER_INTERRUPTED}: rank {process_idx} stopped by a signal"
            ) from None


def signal_safe_workers(trainer) -> None:
    """Make a fork/spawn DDP trainer's workers checkpoint on SIGTERM and fail loudly.

    Lightning raises ``SIGTERMException`` (a ``SystemExit``) in each worker at the step after
    a SIGTERM; under the fork/spawn launchers nothing in the worker calls the callbacks'
    ``on_exception`` (so no checkpoint), and torch counts a ``SystemExit`` as a clean exit
    (code 0, no result): the parent then waits forever for the result. Here the worker runs
    ``on_exception`` itself (``FaultTolerance`` saves ``last.ckpt``, all ranks together) and
    raises ``WorkerInterrupted``, an error torch reports to the parent, which fails at once.

    Private API: ``Strategy._launcher``, ``_MultiProcessingLauncher._wrapping_function``.
    """
    launcher = getattr(trainer.strategy, "_launcher", None)
    if type(launcher) is _MultiProcessingLauncher:
        launcher.__class__ = _SignalSafeLauncher


def attached_trainer(module):
    """The Trainer a LightningModule is attached to, or None (its public ``trainer``
    property raises when there is none)."""
    return module._trainer


def logger_step(trainer) -> int:
    """The step number Lightning logs ``self.log`` values at (batches that stepped the
    optimizer), so values written to loggers directly line up with them."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def epochs_processed(trainer) -> int:
    """Epochs the fit loop has started processing: unlike ``trainer.current_epoch`` already
    advanced when a run resumes from an end-of-epoch checkpoint, before Lightning calls the
    sampler's ``set_epoch``. Private API: the fit loop's ``epoch_progress`` (``_FitLoop``)."""
    return int(trainer.fit_loop.epoch_progress.current.processed)


def batches_processed(trainer) -> int:
    """Training batches of the current epoch processed so far (what a mid-epoch checkpoint
    holds). Private API: ``_TrainingEpochLoop.batch_progress``."""
    return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)


def close_experiment(logger):
    """A logger's experiment handle if it made one (a W&B run), without making one; the
    logger forgets it, so the next job of a sweep starts a new one."""
    run = getattr(logger, "_experiment", None)
    if run is not None:
        logger._experiment = None
    return run


def opened_experiment(logger):
    """A logger's experiment handle if it made one, without making one."""
    return getattr(logger, "_experiment", None)


def mlflow_run_opened(logger) -> bool:
    """Whether Lightning's ``MLFlowLogger`` has started (or attached to) its MLflow run; its
    public ``experiment`` and ``run_id`` would start one. Private API:
    ``MLFlowLogger._initialized``."""
    return bool(logger._initialized)


class _AppendingWriter(ExperimentWriter):
    def _check_log_dir_exists(self) -> None:
        # Lightning's writer deletes an existing metrics.csv here: a resume would keep only
        # the epochs trained after it. Ours keeps the file and appends.
        pass

    # Lightning's writer only knows the columns it wrote itself; a new writer on an existing
    # file rewrote it with fewer columns and crashed (csv.DictWriter: fields not in header).
    # The header is read again only when the file is not as this writer left it (every log
    # step saves: reading it each time cost a file open per save).
    _left_size: int | None = None

    def save(self) -> None:
        if not self.metrics:
            return
        fs, path = self._fs, self.metrics_file_path
        size = fs.size(path) if fs.isfile(path) else None
        if size is not None and size != self._left_size:
            with fs.open(path, "r", newline="") as f:
                header = next(csv.reader(f), [])
            self.metrics_keys = sorted(set(self.metrics_keys) | set(header))
        super().save()
        self._left_size = fs.size(path)


class AppendingCSVLogger(_LightningCSVLogger):
    """``lightning.pytorch.loggers.CSVLogger`` that appends to an existing metrics.csv: a
    resumed run (or a process forked for ``trainer.test``) adds rows; no history is lost."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment
