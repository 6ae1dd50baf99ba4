"""A sweep dir belongs to one sweep. The first ``-m`` command into a dir writes its manifest
(``sweep.json``: the fixed overrides, the search space, a hash of the composed config) and
holds the dir's lock while it runs. The same command again resumes the sweep: finished jobs
are kept, unfinished ones continue from their checkpoints, failed ones are retried
(``sweep.retry_failed``). A different sweep into the dir is refused, before anything is
written; a changed search space too, unless ``sweep.force=true`` on a sweeper that numbers
new trials after the old ones (Optuna). Imports no torch.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from experiments.errors import UserError
from experiments.runs.files import write_json
from experiments.runs.layout import RunDir

log = logging.getLogger(__name__)

MANIFEST = "sweep.json"
JOB_FILE = "job.json"
# keys that do not change what a sweep's jobs compute: where it runs, how many trials, ours
NOT_IDENTITY = ("hydra.", "hydra/", "sweep.", "+sweep.", "print_config=")
# sweepers whose re-run numbers new trials after the existing jobs (so no job dir is reused
# for other settings): the only ones sweep.force may change the space of
APPENDING_SWEEPERS = ("hydra_plugins.experiments_optuna.",)

_held: list = []  # the lock of the sweep this process runs, held until it exits
# job dirs this process found finished (or failed, not retried) by an earlier run: their
# job.json stays as that run wrote it
KEPT: set[str] = set()


@dataclass
class Manifest:
    """What identifies a sweep: its fixed overrides, its search space, its composed config."""

    fixed: list[str]
    space: list[str]
    config_hash: str
    sweeper: str = ""
    command: list[str] = field(default_factory=list)

    def same_sweep(self, other: Manifest) -> bool:
        return self.fixed == other.fixed and self.config_hash == other.config_hash


def manifest(
    overrides: list[str], sweeps: set[str], params: dict, config_yaml: str, sweeper: str
) -> Manifest:
    """The manifest of a ``-m`` command: ``overrides`` are its task overrides (``sweeps``
    those with several values), ``params`` the sweeper's own search space."""
    fixed = sorted(o for o in overrides if o not in sweeps and not o.startswith(NOT_IDENTITY))
    space = sorted(sweeps) + sorted(f"{k}={v}" for k, v in (params or {}).items())
    digest = hashlib.sha256(config_yaml.encode()).hexdigest()[:16]
    return Manifest(fixed, space, digest, sweeper, list(overrides))


def claim(sweep_dir: Path, mine: Manifest, force: bool) -> bool:
    """Take ``sweep_dir`` for this sweep; True when it resumes one that ran there before.

    Raises:
        UserError: another live process runs a sweep there; the dir holds a different sweep;
            the search space changed (without ``force``, or on a grid sweeper).
    """
    from experiments.runs.lock import RunLock

    sweep_dir = Path(sweep_dir)
    path = sweep_dir / MANIFEST
    theirs = _read(path) if path.is_file() else None
    if theirs is None and sweep_dir.is_dir() and any(sweep_dir.glob(f"*/{JOB_FILE}")):
        raise UserError(
            f"hydra.sweep.dir={sweep_dir} holds jobs of a sweep with no {MANIFEST} (made "
            f"before sweeps had one); choose another hydra.sweep.dir"
        )
    if theirs is not None and not theirs.same_sweep(mine):
        raise UserError(
            f"hydra.sweep.dir={sweep_dir} holds another sweep ({' '.join(theirs.command)}); "
            f"run that command to continue it, or choose another hydra.sweep.dir"
        )
    if theirs is not None and theirs.space != mine.space:
        appending = mine.sweeper.startswith(APPENDING_SWEEPERS)
        if not (force and appending):
            way = "sweep.force=true to add trials over the new space, " if appending else ""
            raise UserError(
                f"hydra.sweep.dir={sweep_dir}: the search space changed (was "
                f"{' '.join(theirs.space)}; now {' '.join(mine.space)}); use the old space to "
                f"resume, {way}or choose another hydra.sweep.dir"
            )
        log.warning("sweep.force=true: the search space of %s changed; adding trials", sweep_dir)
    lock = RunLock(sweep_dir).acquire()  # refuses a dir another live sweep runs in
    _held.append(lock)
    if theirs is None or theirs.space != mine.space:
        write_json(path, asdict(mine))
    return theirs is not None


def _read(path: Path) -> Manifest:
    try:
        data = json.loads(path.read_text())
        known = {k: data[k] for k in ("fixed", "space", "config_hash")}
        return Manifest(**known, sweeper=data.get("sweeper", ""), command=data.get("command", []))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"{path} is unreadable ({err}); choose another hydra.sweep.dir") from None


def previous_job(job_dir: Path) -> dict[str, Any] | None:
    """What an earlier run of this sweep left in ``job_dir``: its ``job.json`` (status,
    error), or None when it never ended there."""
    found = _read_json(Path(job_dir) / JOB_FILE)
    return found if isinstance(found, dict) else None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def plan_job(job_dir: Path, retry_failed: bool) -> tuple[str, Any]:
    """``("keep", metrics)`` for a job that finished before, ``("failed", job)`` for one
    that failed before and is not retried, ``("resume", job_dir)`` for one with a
    checkpoint, ``("run", None)`` otherwise."""
    run = RunDir(job_dir)
    before = previous_job(job_dir)
    metrics = _read_json(run.metrics)  # None when missing or unreadable: not finished
    if isinstance(metrics, dict) and (before is None or before.get("status") == "ok"):
        return "keep", metrics
    if before is not None and before.get("status") == "failed" and not retry_failed:
        return "failed", before
    if run.has_checkpoint():
        return "resume", run.path
    return "run", None


def earlier_sweep_job(cfg) -> dict | None:
    """A sweep job run again (the same sweep re-run into its dir): the metrics of one that
    finished before (kept, not trained again), None to train, after pointing ``resume`` at
    the job's own checkpoint when it has one. ``cfg``: the job's composed config."""
    from omegaconf import OmegaConf, open_dict

    job_dir = Path(cfg.paths.output_dir)
    retry_failed = bool(OmegaConf.select(cfg, "sweep.retry_failed", default=True))
    action, found = plan_job(job_dir, retry_failed)
    if action == "keep":
        KEPT.add(str(job_dir))
        log.info("job %s finished in an earlier run of this sweep: kept", job_dir.name,
                 extra={"sweep_line": True})  # fmt: skip
        return found
    if action == "failed":
        KEPT.add(str(job_dir))
        raise UserError(
            f"job {job_dir.name} failed in an earlier run of this sweep ({found.get('error')}); "
            f"sweep.retry_failed=false keeps it failed"
        )
    if action == "resume":
        log.info("job %s continues from its checkpoint (earlier run of the sweep)", job_dir.name,
                 extra={"sweep_line": True})  # fmt: skip
        with open_dict(cfg):
            cfg.resume = str(found)
    return None
