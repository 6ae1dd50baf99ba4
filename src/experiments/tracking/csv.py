"""The CSV logger the configs build (``logger=csv``): Lightning's, made safe to append to, so
a resumed run (or a process forked for ``trainer.test``) adds rows to the existing
``metrics.csv`` and the history is never lost. It overrides Lightning internals, so it
lives in ``experiments.compat.lightning``."""

from experiments.compat.lightning import AppendingCSVLogger as CSVLogger

__all__ = ["CSVLogger"]
