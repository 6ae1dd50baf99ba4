"""Experiment tracking with Weights & Biases: online when an account is configured, offline
otherwise, never a prompt or a hang, and exactly one W&B run per job."""

from __future__ import annotations

import logging
import netrc
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from lightning.pytorch.loggers import WandbLogger

from experiments.compat.lightning import close_experiment, opened_experiment
from experiments.errors import UserError
from experiments.runs.layout import checkpoint_files

log = logging.getLogger(__name__)

MODES = ("auto", "online", "offline", "disabled")


def has_wandb_key() -> bool:
    """True when a W&B API key is configured (``WANDB_API_KEY`` or ``wandb login``'s netrc)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    path = os.environ.get("NETRC", str(Path.home() / ".netrc"))
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def resolve_mode(mode: str) -> str:
    """``auto`` -> ``WANDB_MODE`` if set, else online with a key, else offline (with a notice)."""
    if mode not in MODES:
        raise UserError(f"logger.wandb.mode={mode!r} is not valid; use one of {', '.join(MODES)}")
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_MODE") in MODES[1:]:
        return os.environ["WANDB_MODE"]
    if has_wandb_key():
        return "online"
    log.info("W&B: no API key configured, logging offline (upload later with `wandb sync`)")
    return "offline"


def wandb_logger(
    project: str = "experiments",
    entity: str | None = None,
    group: str | None = None,
    name: str | None = None,
    tags: Sequence[str] = (),
    mode: Literal["auto", "online", "offline", "disabled"] = "auto",
    save_dir: str = ".",
    job_type: str = "train",
    log_checkpoints: bool = False,
    run_id: str | None = None,
):
    """Build Lightning's ``WandbLogger`` with the mode resolved and no interactive prompts.

    Args:
        entity: W&B team or user; None uses the account's default.
        group: groups runs in the UI; in a sweep, the sweep's name (set by config).
        name: run name; in a sweep, the job's overrides. Empty or None: W&B picks one.
        mode: ``auto`` (online with a key, else offline), ``online``, ``offline``, ``disabled``.
        save_dir: parent of the ``wandb/`` folder (the run dir).
        log_checkpoints: upload the best/last weights (+ sidecars) as a model artifact at the end.
        run_id: continue this W&B run (set by ``resume=``).
    """
    # WANDB_MODE= (set but empty, common in CI templates) counts as unset: wandb itself
    # would refuse the empty value with a validation traceback
    for key in [k for k, v in os.environ.items() if k.startswith("WANDB_") and not v.strip()]:
        del os.environ[key]
    import wandb  # lazy: every run imports this module (finish_loggers); only W&B runs pay

    mode = resolve_mode(mode)
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    logger = WandbLogger(
        project=project,
        entity=entity,
        group=group or None,
        name=name or None,
        tags=list(tags),
        save_dir=save_dir,
        log_model=False,  # checkpoints go up as our own state_dict artifact, if asked
        job_type=job_type,
        mode=mode,
        id=run_id,
        resume="allow" if run_id else None,
        # no TTY prompts, no console flood; a dead network fails init instead of hanging
        settings=wandb.Settings(quiet=True, init_timeout=60, console="off"),
    )
    logger.log_checkpoints = log_checkpoints
    return logger


def previous_wandb_id(run_dir: Path) -> str | None:
    """The W&B run id used by an earlier process in ``run_dir`` (for resume)."""
    runs = sorted((Path(run_dir) / "wandb").glob("*run-*-*"), key=lambda p: p.stat().st_mtime)
    return runs[-1].name.rsplit("-", 1)[-1] if runs else None


def finish_loggers(
    loggers: Iterable,
    failed: bool,
    checkpoint_dir: Path | None = None,
    summary: Mapping[str, float] | None = None,
) -> None:
    """Close every logger at the end of a job, also one that raised.

    Lightning's WandbLogger never calls ``wandb.finish()``: without this, the next job of a
    multirun would log into this job's W&B run. A logger with ``upload_checkpoints`` (MLflow)
    gets the checkpoints of a successful job before its run is marked FINISHED.

    Args:
        loggers: the job's Lightning loggers.
        failed: the job raised (its runs are marked failed, nothing is uploaded).
        checkpoint_dir: ``RunDir.checkpoints``, for the loggers that upload the best weights.
        summary: the run's end values (``training.pipeline.ChosenEpoch.tracker_summary``:
            validation at the epoch ``RunDir.best_weights`` holds, ``<name>_last``,
            ``best_epoch``). A W&B run's summary takes them (its default summary is each
            key's last value); a logger with ``record_summary`` (MLflow) records them its own
            way.
    """
    for logger in loggers:
        if summary and not failed:
            _record_summary(logger, summary)
        upload = getattr(logger, "log_checkpoints", False) and not failed and checkpoint_dir
        if upload and hasattr(logger, "upload_checkpoints"):
            try:
                logger.upload_checkpoints(Path(checkpoint_dir))
            except Exception as err:  # the job succeeded: a failed upload only warns
                log.warning("could not upload checkpoints to %s: %s", type(logger).__name__, err)
        try:
            logger.finalize("failed" if failed else "success")
        except Exception as err:  # a logger failing to close must not hide the real error
            log.warning("could not finalize %s: %s", type(logger).__name__, err)
        run = opened_experiment(logger)
        if run is None or not hasattr(run, "finish"):
            continue
        files = checkpoint_files(Path(checkpoint_dir)) if upload else []  # weights, sidecars
        if files:
            import wandb  # lazy: as in wandb_logger

            artifact = wandb.Artifact(f"model-{run.id}", type="model")
            for path in files:
                artifact.add_file(str(path))
            run.log_artifact(artifact, aliases=["best", "latest"])
        run.finish(exit_code=1 if failed else 0)
        close_experiment(logger)


def _record_summary(logger, summary: Mapping[str, float]) -> None:
    """The end values into the logger's run summary; a failure only warns (the job is done)."""
    try:
        record = getattr(logger, "record_summary", None)
        if record is not None:
            record(dict(summary))
            return
        run = opened_experiment(logger)
        if run is not None and hasattr(run, "summary") and hasattr(run.summary, "update"):
            run.summary.update(dict(summary))  # W&B: overrides the last-value default
            # a name known only at the last epoch: its value stays, as <name>_last only
            for name in [k.removesuffix("_last") for k in summary if k.endswith("_last")]:
                if name not in summary and name in run.summary.keys():
                    del run.summary[name]
    except Exception as err:
        log.warning("could not record the run summary in %s: %s", type(logger).__name__, err)
