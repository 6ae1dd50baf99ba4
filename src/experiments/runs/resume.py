"""Resuming a run, all of it in one place.

A run continues in its own folder from its newest loadable full checkpoint when:
- ``resume=<run_dir>``: the run's saved overrides are re-applied (``resume_overrides``),
  with changes to its data or model refused;
- ``resume=auto``: the newest unfinished run of the task (``find_resumable``);
- SLURM re-ran the job after a pre-emption or time-out (``requeued``): the run whose
  ``env.json`` records this SLURM job id (``find_run_of_slurm_job``);
and then ``checkpoint_to_resume`` picks the file (``last.ckpt``, its ``.prev`` when the
newest is torn, or a newer Lightning ``hpc_ckpt_N.ckpt``) and refuses what cannot be
resumed (a finished run without more epochs, a fresh run over old checkpoints).

The command-line part runs before Hydra and imports no torch.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from omegaconf import DictConfig

from experiments.console import process_rank
from experiments.errors import UserError, one_line
from experiments.runs.files import read_json_object, read_yaml
from experiments.runs.layout import METRICS, PREVIOUS_SUFFIX, RunDir, read_sidecar
from experiments.runs.lock import check_free

log = logging.getLogger(__name__)

# groups whose change would not fit the checkpoint
FROZEN_GROUPS = ("data", "model", "experiment")


def runs_root(cfg: DictConfig) -> Path:
    """Where the single runs of ``cfg.task_name`` go (``outputs/<task>/runs``)."""
    return Path(str(cfg.paths.log_dir)) / str(cfg.task_name) / "runs"


def requeued() -> bool:
    """True in a SLURM job that SLURM has restarted (requeue after pre-emption or time-out)."""
    return (
        bool(os.environ.get("SLURM_JOB_ID"))
        and int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0
    )


def find_resumable(runs_dir: Path) -> Path | None:
    """The newest run under ``runs_dir`` with a checkpoint and no ``metrics.json``."""
    candidates = [d for d in runs_dir.glob("*") if RunDir(d).resumable() and not RunDir(d).finished]
    return max(candidates, key=lambda d: d.stat().st_mtime, default=None)


def find_run_of_slurm_job(cfg: DictConfig, job_id: str) -> Path | None:
    """The unfinished run whose env.json records SLURM job ``job_id``."""
    env_files = sorted(
        (RunDir(d).env for d in runs_root(cfg).glob("*") if RunDir(d).env.is_file()),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for env_file in env_files:
        try:
            recorded = read_json_object(env_file).get("slurm_job_id")
        except UserError as err:  # another run's corrupt file: not this job's run
            log.warning("requeue: skipping %s", one_line(err))
            continue
        if recorded == job_id and not RunDir(env_file.parent).finished:
            return env_file.parent
    return None


def resume_target(cfg: DictConfig, multirun: bool) -> str | None:
    """``cfg.resume``, or the run this SLURM job started when SLURM requeued it."""
    resume = cfg.get("resume")
    if not resume and not multirun and requeued():
        found = find_run_of_slurm_job(cfg, os.environ["SLURM_JOB_ID"])
        if found is not None:
            return str(found)
    return str(resume) if resume else None


def resume_overrides(cfg: DictConfig, resume: str, overrides: list[str]) -> list[str]:
    """The run's saved overrides + the new ones (data/model changes refused) + its dir.

    Raises:
        UserError: no such run, no checkpoint in it, or an override it cannot take.
    """
    if resume == "auto":
        found = find_resumable(runs_root(cfg))
        if found is None:
            raise UserError(
                f"resume=auto: no unfinished run with a checkpoint under {runs_root(cfg)}"
            )
        run = RunDir(found.resolve())
    else:
        run = RunDir(Path(resume).resolve())
    if not run.saved_overrides.is_file():
        raise UserError(f"resume={resume}: {run.saved_overrides} not found (is this a run dir?)")
    if not run.resumable():
        raise UserError(f"resume={resume}: no checkpoint in {run.checkpoints}")

    # the run's files are data: a corrupt one is one line before Hydra rewrites .hydra/ in it
    before = saved_overrides(run.saved_overrides)
    for sidecar in run.sidecars():
        read_sidecar(sidecar)
    if process_rank() == 0:  # the other ranks of a DDP run share rank 0's lock
        check_free(run.path)  # before Hydra rewrites .hydra/ in a folder another trains in
    drop = ("resume=", "hydra.run.dir=")
    # where the run went is its own folder now, whatever the first command said
    kept = [o for o in before if not o.lstrip("+").startswith((*drop, "paths.output_dir="))]
    mine = [o for o in overrides if not o.startswith(drop) and o not in kept]
    for override in mine:
        key = override.lstrip("+~").split("=")[0]
        if re.split(r"[./]", key)[0] in FROZEN_GROUPS:
            raise UserError(
                f"resume: {key} cannot change when resuming (the checkpoint was trained with "
                f"the run's own data and model); start a new run instead"
            )
    return kept + mine + [f"resume={run.path}", f"hydra.run.dir={run.path}"]


def saved_overrides(path: Path) -> list[str]:
    """A run's ``.hydra/overrides.yaml`` as a list of strings, read as data (what each entry
    may do is ``experiments.recorded.replay``'s check).

    Raises:
        UserError: one line naming the file: missing, corrupt, an alias bomb, not a list
            of strings.
    """
    entries = read_yaml(path, kind=list)
    for number, entry in enumerate(entries, 1):
        if not isinstance(entry, str):
            raise UserError(
                f"{path}: entry {number} is a {type(entry).__name__}, expected a key=value "
                f"string (refused before anything runs); restore the file from the run's "
                f"command, or start a new run"
            )
    return entries


def checkpoint_to_resume(cfg: DictConfig, run_dir: Path) -> Path | None:
    """The full checkpoint to continue from, or None for a fresh run.

    A fresh run refuses a run dir that already holds checkpoints (it would silently start
    an unfinished run over from step 0); a resume refuses a finished run unless
    ``trainer.max_epochs`` was raised.
    """
    # lazy: the pre-Hydra check imports this module, and a checkpoint loads through torch
    from experiments.runs.checkpoint_io import (
        first_loadable,
        newest_valid_checkpoint,
        remove_stale_temp_files,
    )

    run = RunDir(run_dir)
    if run.checkpoints.is_dir():
        remove_stale_temp_files(run.checkpoints)
    # a SLURM job requeued after pre-emption/time-out runs again in its own job dir
    # (submitit keeps it): continue from the checkpoint instead of refusing
    if not cfg.get("resume") and not (run.has_checkpoint() and requeued()):
        if run.has_checkpoint():
            raise UserError(
                f"{run_dir} already holds checkpoints of a run; continue it with "
                f"resume={run_dir} or choose another hydra.run.dir"
            )
        return None
    found = newest_valid_checkpoint(run.checkpoints)
    hpc = first_loadable(run.hpc_checkpoints())  # Lightning's SIGUSR1 (SLURM requeue) one
    if hpc is not None and (found is None or hpc[0].stat().st_mtime > found[0].stat().st_mtime):
        found = hpc
    if found is None:
        raise UserError(f"resume: no loadable checkpoint in {run.checkpoints}")
    path, checkpoint = found
    if path.name.endswith(PREVIOUS_SUFFIX):
        log.warning("resume: the newest checkpoint is unreadable; falling back to %s", path)
    epochs_done = int(checkpoint.get("epoch", 0)) + 1
    max_epochs = cfg.trainer.get("max_epochs")
    if run.finished and max_epochs is not None and 0 <= max_epochs <= epochs_done:
        raise UserError(
            f"{run_dir} already finished {epochs_done} epochs ({METRICS}); raise "
            f"trainer.max_epochs to train on, or start a new run"
        )
    step = checkpoint.get("global_step", 0)
    log.info("resuming %s from %s (in epoch %d, at step %d)", run_dir, path.name, epochs_done, step)
    if run.finished:
        run.metrics.rename(run.previous_metrics)
    return path
