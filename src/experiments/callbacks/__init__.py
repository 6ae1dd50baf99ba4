"""Lightning callbacks, one per file."""

from experiments.callbacks.progress import TerseProgressBar

__all__ = ["TerseProgressBar"]
