"""Every use of a library's private API, in one place, each pinned by a test
(``tests/test_compat.py``) that fails with a clear message when an upgrade changes it.
Checked against the version ranges in pyproject.toml."""

from __future__ import annotations

from typing import Any

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
