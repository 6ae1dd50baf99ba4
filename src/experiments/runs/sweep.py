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
import logging
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf, open_dict

from experiments.errors import UserError
from experiments.runs.files import read_json_object, write_json
from experiments.runs.layout import SWEEP_MANIFEST, RunDir, SweepDir
from experiments.runs.lock import RunLock

log = logging.getLogger(__name__)

# set in a job's process by hydra/launcher=ray: the node it runs on, and why an earlier
# attempt of it was lost (both recorded in its job.json)
NODE_ENV = "EXPERIMENTS_NODE"
LOST_ENV = "EXPERIMENTS_LOST"
# set by the Optuna sweeper (hydra.job.env_set): the trial a job runs
TRIAL_ENV = "EXPERIMENTS_OPTUNA_TRIAL"
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
    started: float = 0.0  # when this run of the sweep began (sweep.time_budget counts from it)

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
    sweep_dir = Path(sweep_dir)
    path = SweepDir(sweep_dir).sweep_file
    theirs = _read(path) if path.is_file() else None
    if theirs is None and SweepDir(sweep_dir).job_files():
        raise UserError(
            f"hydra.sweep.dir={sweep_dir} holds jobs of a sweep with no {SWEEP_MANIFEST} (made "
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
    mine.started = time.time()
    write_json(path, asdict(mine))
    return theirs is not None


def _read(path: Path) -> Manifest:
    data = read_json_object(path)
    try:
        known = {k: data[k] for k in ("fixed", "space", "config_hash")}
        return Manifest(
            **known, sweeper=data.get("sweeper", ""), command=data.get("command", []),
            started=float(data.get("started") or 0.0),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError) as err:
        raise UserError(
            f"{path}: not a sweep manifest ({type(err).__name__}: {err}); restore it or choose "
            f"another hydra.sweep.dir"
        ) from None


def previous_job(job_dir: Path) -> dict[str, Any] | None:
    """What an earlier run of this sweep left in ``job_dir``: its ``job.json`` (status,
    error), or None when it never ended there.

    Raises:
        UserError: the file is there but is not a JSON object (one line naming it).
    """
    return read_json_object(SweepDir.job_file(job_dir), missing=None)


def finished_metrics(job_dir: Path) -> dict[str, Any] | None:
    """The job's ``metrics.json`` when a run wrote it at its end (``train`` and
    cross-validation write ``run_dir`` last, in one atomic write), else None; a record of a
    run that diverged past its retries counts as finished too.

    Raises:
        UserError: the file is there but is not a JSON object (one line naming it).
    """
    metrics = read_json_object(RunDir(job_dir).metrics, missing=None)
    if metrics is None:
        return None
    return metrics if "run_dir" in metrics or metrics.get("status") == "diverged" else None


def plan_job(job_dir: Path, retry_failed: bool) -> tuple[str, Any]:
    """``("keep", metrics)`` for a job that finished before, ``("failed", job)`` for one
    that failed before and is not retried, ``("resume", job_dir)`` for one with a
    checkpoint, ``("run", None)`` otherwise.

    A finished ``metrics.json`` wins over a ``job.json`` that says otherwise: a job killed
    with its sweep (or refused while an orphan of it still trained) is recorded failed, yet
    its run may have ended since; its metrics are the truth, not the stale record.
    """
    before = previous_job(job_dir)
    metrics = finished_metrics(job_dir)
    if metrics is not None:
        return "keep", metrics
    if before is not None and before.get("status") == "failed" and not retry_failed:
        return "failed", before
    if RunDir(job_dir).has_checkpoint():
        return "resume", RunDir(job_dir).path
    return "run", None


def earlier_sweep_job(cfg) -> dict | None:
    """A sweep job run again (the same sweep re-run into its dir): the metrics of one that
    finished before (kept, not trained again), None to train, after pointing ``resume`` at
    the job's own checkpoint when it has one. ``cfg``: the job's composed config."""
    job_dir = Path(cfg.paths.output_dir)
    retry_failed = bool(OmegaConf.select(cfg, "sweep.retry_failed", default=True))
    action, found = plan_job(job_dir, retry_failed)
    if action == "keep":
        if (previous_job(job_dir) or {}).get("status") == "ok":
            KEPT.add(str(job_dir))  # else this run writes its record afresh: ok
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


# -- stop rules: checked by each job as it starts, so they hold for every launcher -----

TARGET = re.compile(
    r"^\s*([\w./-]+)\s*(>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$"
)
OPS = {">=": float.__ge__, ">": float.__gt__, "<=": float.__le__, "<": float.__lt__}


def parse_target(text: Any, key: str = "sweep.target") -> tuple[str, str, float]:
    """``"val/acc>=0.99"`` -> ``("val/acc", ">=", 0.99)``; ``key`` names it in the error.

    Raises:
        UserError: not ``<metric><op><number>``.
    """
    found = TARGET.match(str(text)) if isinstance(text, str) else None
    if found is None or "/" not in found.group(1):
        raise UserError(
            f"{key}={text!r} is not valid: expected <stage/metric><op><number> with op "
            f">=, >, <= or <, e.g. \"{key}='val/acc>=0.99'\" (quotes for Hydra and shell)"
        )
    return found.group(1), found.group(2), float(found.group(3))


def parse_budget(value: Any) -> float:
    """``sweep.time_budget`` in seconds: a number of seconds or ``HH:MM:SS``.

    Raises:
        UserError: anything else, or not positive.
    """
    seconds = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and re.fullmatch(r"\d+:\d{1,2}:\d{1,2}", value.strip()):
        h, m, s = (int(p) for p in value.strip().split(":"))
        seconds = float(h * 3600 + m * 60 + s)
    if seconds is None or seconds <= 0:
        raise UserError(
            f"sweep.time_budget={value!r} is not valid: expected seconds (e.g. 3600) or "
            f"HH:MM:SS (e.g. 01:30:00), more than 0"
        )
    return seconds


def stop_reason(cfg, sweep_dir: Path, job_num: int) -> str | None:
    """Why job ``job_num`` of the sweep in ``sweep_dir`` is not run (a stop rule of
    ``cfg.sweep`` holds), or None to run it."""
    rules = OmegaConf.select(cfg, "sweep", default=None) or {}
    max_jobs, target, budget = (rules.get(k) for k in ("max_jobs", "target", "time_budget"))
    if max_jobs is not None and job_num >= int(max_jobs):
        return f"sweep.max_jobs={max_jobs} reached"
    if budget is not None:
        started = read_json_object(SweepDir(sweep_dir).sweep_file).get("started")
        started = float(started) if isinstance(started, int | float) else 0.0
        if started and time.time() - started > parse_budget(budget):
            return f"sweep.time_budget={budget} spent"
    if target is not None:
        metric, op, value = parse_target(target)
        for job_file in SweepDir(sweep_dir).job_files():
            try:  # a job whose files are corrupt reached nothing (the summary says why)
                job = read_json_object(job_file)
                metrics = read_json_object(RunDir(job_file.parent).metrics)
            except UserError:
                continue
            if job.get("status") != "ok":
                continue
            got = RunDir(job_file.parent).best_value(metric)
            got = got if got is not None else metrics.get(metric)
            if isinstance(got, int | float) and OPS[op](float(got), value):
                return f"sweep.target={target} reached by job {job.get('num')} ({got:.4f})"
    return None
