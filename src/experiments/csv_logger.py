"""Moved to ``experiments.tracking.csv``; kept so that run configs written before the move
(``_target_: experiments.csv_logger.CSVLogger``) still load in eval and predict."""

from experiments.tracking.csv import CSVLogger

__all__ = ["CSVLogger"]
