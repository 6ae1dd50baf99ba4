"""Everything decided before a model is built: the schema (``schema``: every ``_target_``'s
keys bound to its constructor's signature, with the bounds of ``hints``), the launchers' and
the sweeper's settings (``ray``, ``slurm``, ``sweep_settings``), and the OmegaConf resolvers
the configs use, registered here on import, before Hydra composes anything.

Importing this package imports no torch or Lightning (a test asserts it): the cheap checks
of a command line answer in well under a second; ``schema.check`` imports the targets.
"""

import os
from datetime import datetime
from pathlib import Path

from omegaconf import OmegaConf

from experiments.recorded import CONF_DIR

__all__ = ["CONF_DIR"]


def sweep_group(mode, sweep_dir: str) -> str | None:
    """In a multirun: the sweep folder's name (groups its jobs in trackers); else None."""
    return Path(sweep_dir).name if str(mode).endswith("MULTIRUN") else None


def run_stamp() -> str:
    """The name of a single run's folder: the start time (microseconds keep two runs started
    in the same second apart), or ``slurm-<job>[.<step>]`` when SLURM started several tasks
    of one run (``srun`` + DDP): every rank then names the same folder, where each one's own
    clock would name a different one."""
    job = os.environ.get("SLURM_JOB_ID")
    if job and int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1:
        step = os.environ.get("SLURM_STEP_ID")
        return f"slurm-{job}" + (f".{step}" if step not in (None, "", "batch") else "")
    return datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")


OmegaConf.register_new_resolver("experiments.sweep_group", sweep_group, replace=True)
# use_cache: every interpolation of it in one process names the same folder
OmegaConf.register_new_resolver("experiments.run_stamp", run_stamp, replace=True, use_cache=True)
