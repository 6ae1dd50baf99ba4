"""Lightning callbacks, one per file."""

from experiments.callbacks.fault_tolerance import FaultTolerance
from experiments.callbacks.profiling import Profiling
from experiments.callbacks.progress import TerseProgressBar
from experiments.callbacks.state_dict_checkpoint import StateDictCheckpoint
from experiments.callbacks.time_to_target import TimeToTarget
from experiments.callbacks.torch_compile import TorchCompile
from experiments.callbacks.trial_reporter import TrialReporter
from experiments.callbacks.validation_accuracy import ValidationAccuracy
from experiments.callbacks.weight_averaging import WeightAveraging

__all__ = [
    "FaultTolerance",
    "Profiling",
    "StateDictCheckpoint",
    "TerseProgressBar",
    "TimeToTarget",
    "TorchCompile",
    "TrialReporter",
    "ValidationAccuracy",
    "WeightAveraging",
]
