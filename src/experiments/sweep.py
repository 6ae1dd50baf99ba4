"""Moved to ``experiments.tracking.sweep_summary``; kept for Hydra configs written before the
move (``_target_: experiments.sweep.SweepSummary``)."""

from experiments.tracking.sweep_summary import SweepSummary

__all__ = ["SweepSummary"]
