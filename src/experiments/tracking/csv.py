"""Lightning's CSVLogger, made safe to append to: a resumed run (or a process forked for
``trainer.test``) adds rows to the existing ``metrics.csv``; the history is never lost."""

from __future__ import annotations

import csv

from lightning.pytorch.loggers import CSVLogger as _LightningCSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment


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


class CSVLogger(_LightningCSVLogger):
    """``lightning.pytorch.loggers.CSVLogger`` that appends to an existing metrics.csv."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment
