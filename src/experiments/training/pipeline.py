"""Training: ``train(cfg)`` trains and tests one model, and ``task`` is the Hydra task
``python -m experiments.train`` runs (one run, or one job of a sweep)."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig

from experiments.callbacks import (
    FaultTolerance,
    StateDictCheckpoint,
    TrialReporter,
    ValidationAccuracy,
)
from experiments.callbacks.fault_tolerance import RunInterrupted
from experiments.callbacks.state_dict_checkpoint import exported
from experiments.callbacks.trial_reporter import trial_reporter
from experiments.compat.hydra import run_composed
from experiments.compat.lightning import WORKER_INTERRUPTED
from experiments.config import CONF_DIR, schema
from experiments.console import (
    SWEEP_LINE,
    metrics_table,
    print_config_tree,
    process_rank,
    quiet_console,
    resume_gc,
    route_lightning_logs,
    what_runs,
)
from experiments.errors import UserError, exit_with, find_user_error
from experiments.models.metrics import run_test
from experiments.runs.checkpoint_io import load_full_checkpoint
from experiments.runs.files import write_error, write_json
from experiments.runs.layout import RunDir, read_sidecar, sidecar_epoch, sidecar_of
from experiments.runs.lock import RunLock
from experiments.runs.manifest import write_manifest
from experiments.runs.provenance import git_probe, write_environment
from experiments.runs.resume import checkpoint_to_resume
from experiments.runs.sweep import earlier_sweep_job
from experiments.runs.weights import load_state_dict_file
from experiments.secrets import redact_saved_config, redacted_config
from experiments.tracking import finish_loggers
from experiments.tracking.sweep_summary import record_interrupted, stopped_by_a_rule
from experiments.training import build
from experiments.training.build import AUTO_LOSS_TRADE
from experiments.training.cross_validation import cross_validate
from experiments.training.model_card import split_counts, write_model_card
from experiments.training.remedies import train_with_remedies

log = logging.getLogger(__name__)

GROUP_ORDER = ("data", "model", "optimizer", "scheduler", "trainer", "callbacks", "logger")


def train(cfg: DictConfig) -> dict[str, float]:
    """Train and test one model as ``cfg`` says; write ``metrics.json``; return the metrics.

    Returns:
        Final ``train/*``, ``val/*`` and ``test/*`` metrics as floats.

    Raises:
        UserError: a mistake in the config or data (one line, naming what to fix).
        RunInterrupted: SIGTERM/SIGINT arrived; a checkpoint was saved first.
    """
    git = git_probe()  # started before torch and Lightning imported, if the CLI ran
    route_lightning_logs()
    # every key bound to its constructor's signature before anything is built (once: the
    # config the command line bound before Hydra made the run dir passes at once)
    schema.check(cfg)
    start = time.perf_counter()
    run_dir = Path(cfg.paths.output_dir)
    # the process that trains holds the run dir; ranks Lightning re-launched share it
    with RunLock(run_dir) if process_rank() == 0 else contextlib.nullcontext():
        resume_from = checkpoint_to_resume(cfg, run_dir)
        if cfg.seed is not None:  # seed=0 is a seed too
            L.seed_everything(cfg.seed, workers=True, verbose=False)
        datamodule, model = build.datamodule_and_model(cfg)
        loggers = build.loggers(cfg, run_dir, resuming=resume_from is not None)
        callbacks = build.callbacks(cfg, with_logger=bool(loggers)) + trial_reporter(cfg)
        trainer = build.trainer(cfg, callbacks, loggers, train_batches=_batches(datamodule))
        if trainer.is_global_zero:
            log.info("run: %s -> %s", what_runs(cfg, trainer), run_dir)
            write_environment(run_dir, cfg.seed, str(trainer.strategy.root_device), git())
        resume_gc()  # start-up is over: what it allocated stays, so later collections skip it
        metrics, chosen = _fit_and_test(
            cfg, trainer, model, datamodule, callbacks, loggers, resume_from
        )
        summary = {
            **metrics,
            **chosen.record(),
            "seed": cfg.seed,
            "run_dir": str(run_dir.resolve()),
            "wall_time_s": round(time.perf_counter() - start, 3),
            "params": sum(p.numel() for p in model.parameters()),
            **_progress(trainer, callbacks),
            **_pruned(callbacks),
            **_loss_record(cfg, model, metrics),
        }
        if trainer.is_global_zero:
            write_json(RunDir(run_dir).metrics, summary)
            write_model_card(run_dir, split_counts(datamodule))
            write_manifest(run_dir)  # last: every artifact's sha256 (experiments-verify)
    shown = chosen.done_line(metrics, summary["epochs"])
    log.info("done in %.1f s: %s  (%s)", summary["wall_time_s"], shown, run_dir, extra=SWEEP_LINE)
    if trainer.is_global_zero:
        log.info("%s", metrics_table(chosen.table(metrics)))
    return metrics


@dataclass
class ChosenEpoch:
    """The epoch whose weights ``best.pt`` keeps (``checkpoints/best.json``), the one every
    reported validation number refers to: the done line, the final table, ``metrics.json``
    and the trackers' summaries. ``epoch`` None: no ``best.pt`` (``debug=fast``, or no
    checkpoint callback), so the numbers are the last epoch's and say so.

    Attributes:
        monitor: the metric ``best.pt`` was chosen by (``optimized_metric``).
        value: its value at ``epoch`` (1-based).
        reason: why that epoch was chosen (ties, a fine-tune's head-only epochs).
        warnings: why the validation split may not rank epochs well (too small, saturated).
        val: ``val/*`` values known at ``epoch`` (the monitored one, and the per-epoch
            history's ``val/loss`` / ``val/acc``).
    """

    monitor: str
    value: float | None = None
    epoch: int | None = None
    reason: str | None = None
    warnings: list[str] = field(default_factory=list)
    val: dict[str, float] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The keys ``metrics.json`` gains (none without ``best.pt``: ``val/*`` are then the
        last epoch's, as they always are in ``metrics.json``)."""
        if self.epoch is None:
            return {}
        return {
            f"{self.monitor}_best": self.value,
            "best_epoch": self.epoch,
            "best_reason": self.reason,
            "warnings": list(self.warnings),
        }

    def done_line(self, metrics: dict[str, float], epochs: int) -> str:
        """``val/acc=0.9444 (epoch 7 of 10, best)  test/acc=0.9444``: validation at the
        epoch whose weights were tested, or at the last epoch, labelled as such."""
        test = [f"{k}={metrics[k]:.4f}" for k in shown_keys("test", self.monitor) if k in metrics]
        if self.epoch is not None and self.value is not None:
            shown = [f"{self.monitor}={self.value:.4f} (epoch {self.epoch} of {epochs}, best)"]
            if self.monitor != "val/acc" and "val/acc" in self.val:  # chosen by another metric
                shown.append(f"val/acc={self.val['val/acc']:.4f}")
            return "  ".join(shown + test)
        last = [f"{k}={metrics[k]:.4f} (epoch {epochs}, last)"
                for k in shown_keys("val", self.monitor) if k in metrics]  # fmt: skip
        return "  ".join(last + test)

    def table(self, metrics: dict[str, float]) -> dict[str, float]:
        """The final table's values: its ``val`` column at the chosen epoch (values not
        known there are left out, not filled with the last epoch's), ``test`` as tested."""
        if self.epoch is None:
            return metrics
        kept = {k: v for k, v in metrics.items() if not k.startswith("val/")}
        return {**kept, **self.val}

    def tracker_summary(self, metrics: dict[str, float]) -> dict[str, float]:
        """What a tracker's run summary shows at the end: the chosen epoch's values under
        their own names, every ``val/*`` of the last epoch as ``<name>_last``, and
        ``best_epoch`` (``tracking.finish_loggers`` drops a ``val/*`` name known only at
        the last epoch, so an unlabelled name always means the chosen epoch)."""
        if self.epoch is None:
            return {}
        last = {f"{k}_last": v for k, v in metrics.items() if k.startswith("val/")
                and not k.endswith("_best")}  # fmt: skip
        return {**last, **self.val, f"{self.monitor}_best": self.value, "best_epoch": self.epoch}


def shown_keys(stage: str, monitor: str) -> list[str]:
    """``<stage>/acc`` and the stage's own name of the optimized metric (``test/mae`` for
    ``val/mae``): what the done line shows of a stage, for a classifier or any task."""
    return list(dict.fromkeys([f"{stage}/acc", f"{stage}/{monitor.partition('/')[2] or monitor}"]))


def chosen_epoch(run_dir: Path, monitor: str, callbacks) -> ChosenEpoch:
    """The epoch ``best.pt`` holds, read from its sidecar (under ddp_fork the checkpoint
    callback lived in a child process); a corrupt sidecar is a warning and no choice."""
    path = RunDir(run_dir).best_json
    try:
        best = read_sidecar(path) if path.is_file() else {}
    except UserError as err:
        log.warning("%s", err)
        best = {}
    value, monitor = best.get("value"), str(best.get("monitor") or monitor)
    if not best or not isinstance(value, int | float):
        return ChosenEpoch(monitor=monitor)
    epoch = sidecar_epoch(best)
    val = {monitor: float(value)}
    saved = best.get("metrics")  # every val/* scalar of that epoch, where the sidecar has it
    if isinstance(saved, dict):
        val.update({k: float(v) for k, v in saved.items()
                    if k.startswith("val/") and isinstance(v, int | float)})  # fmt: skip
    for callback in callbacks:  # val/loss and val/acc of every epoch, resumed runs included
        if isinstance(callback, ValidationAccuracy):
            for row in callback.history:
                if row.get("epoch") == epoch - 1:  # the history counts from 0
                    val.update({k: float(v) for k, v in row.items() if k.startswith("val/")})
    val[monitor] = float(value)  # best.json's value is the one the choice was made on
    warnings = best.get("warnings")
    return ChosenEpoch(
        monitor=monitor,
        value=float(value),
        epoch=epoch,
        reason=str(best["reason"]) if best.get("reason") else None,
        warnings=[str(w) for w in warnings] if isinstance(warnings, list) else [],
        val=val,
    )


def _loss_record(cfg: DictConfig, model, metrics: dict[str, float]) -> dict[str, str]:
    """The loss trained with; when ``model.loss=auto`` chose the logit-adjusted loss, the
    trade it makes, with this run's test numbers, said once more at the end (and kept in
    ``metrics.json``'s ``loss_note`` for the model card)."""
    name = model.hparams.get("loss")  # what ran: build resolves auto
    if not isinstance(name, str):
        return {}
    if cfg.model.get("loss") != "auto" or name != "logit_adjusted":
        return {"loss": name}
    tested = ", ".join(f"{k}={metrics[k]:.4f}" for k in ("test/balanced_acc", "test/acc")
                       if k in metrics)  # fmt: skip
    note = f"model.loss=auto chose logit_adjusted (a long-tailed train split). {AUTO_LOSS_TRADE}"
    if tested:
        note += f" (this run: {tested})"
    log.info("%s", note)
    return {"loss": name, "loss_note": note}


def _batches(datamodule) -> int | None:
    try:
        return len(datamodule.train_dataloader())
    except Exception:  # a loader without a length: Lightning decides
        return None


def _fit_and_test(cfg, trainer, model, datamodule, callbacks, loggers, resume_from):
    """Fit, then test ``best.pt``'s weights; loggers are closed however this ends (with the
    chosen epoch's values in their summaries). Returns the metrics and that epoch."""
    guard = next((c for c in callbacks if isinstance(c, FaultTolerance)), None)
    checkpoints = next((c for c in callbacks if isinstance(c, StateDictCheckpoint)), None)
    layout = RunDir(cfg.paths.output_dir)
    try:
        for logger in loggers:
            logger.log_hyperparams(redacted_config(cfg))
        try:
            trainer.fit(model, datamodule=datamodule, ckpt_path=resume_from)
            validated = any(k.startswith("val/") for k in trainer.callback_metrics)
            if resume_from is not None and not validated:
                # the checkpoint had every epoch (stopped during test): fit had nothing to
                # do, so validate the restored weights again for metrics.json and sweepers
                trainer.validate(model, datamodule=datamodule, verbose=False)
            if trainer.is_global_zero:
                # a SLURM pre-emption's hpc_ckpt_N.ckpt is stale once fit is done, and under
                # SLURM Lightning's test() would restore it over best.pt's weights
                for stale in layout.hpc_checkpoints():
                    stale.unlink(missing_ok=True)
            metrics = _scalars(trainer.callback_metrics)
            if cfg.get("test") and not _pruned(callbacks):  # a pruned trial is a loser
                metrics.update(_test(cfg, trainer, model, datamodule, checkpoints, loggers))
            chosen = chosen_epoch(layout.path, str(cfg.optimized_metric), callbacks)
        except SIGTERMException:  # Lightning's signal path; the guard saved a checkpoint
            signum = guard.signum if guard is not None and guard.signum else 15
            epoch = trainer.current_epoch + 1  # 1-based, as the console counts
            raise RunInterrupted(signum, layout.last_ckpt, epoch, trainer.global_step) from None
        except Exception as err:
            if WORKER_INTERRUPTED not in str(err):
                raise
            # fork/spawn workers: they saved (compat.signal_safe_workers); SIGTERM reached them
            last = layout.last_ckpt
            saved = load_full_checkpoint(last)  # the workers' trainers, not this one, moved on
            raise RunInterrupted(15, last, saved["epoch"] + 1, saved["global_step"]) from None
    except BaseException:
        finish_loggers(loggers, failed=True)  # one W&B run per job, closed even on failure
        raise
    checkpoint_dir = checkpoints.dirpath if checkpoints else None
    finish_loggers(loggers, failed=False, checkpoint_dir=checkpoint_dir,
                   summary=chosen.tracker_summary(metrics))  # fmt: skip
    return metrics, chosen


def _test(cfg, trainer, model, datamodule, checkpoints, loggers) -> dict[str, float]:
    if checkpoints is not None and checkpoints.best_path.is_file():
        # the sidecar, not the callback: under ddp_fork the callback lived in a child
        best = read_sidecar(sidecar_of(checkpoints.best_path))  # a file: data
        value = f"{best['value']:.4f}" if best.get("value") is not None else "?"
        log.info("testing %s (epoch %d, %s=%s)", checkpoints.best_path.name, sidecar_epoch(best),
                 best.get("monitor"), value)  # fmt: skip
        load_state_dict_file(exported(model), checkpoints.best_path, map_location=model.device)
    tester = build.single_device_tester(cfg, trainer, loggers)
    return run_test(tester, model, datamodule) if tester.is_global_zero or tester is trainer else {}


def _progress(trainer, callbacks) -> dict[str, int]:
    """Epochs and steps trained; after ddp_fork/ddp_spawn the loops ran in child processes,
    so the last checkpoint's sidecar is the record."""
    checkpoints = next((c for c in callbacks if isinstance(c, StateDictCheckpoint)), None)
    sidecar = sidecar_of(checkpoints.last_path) if checkpoints else None
    if trainer.global_step == 0 and sidecar is not None and sidecar.is_file():
        last = read_sidecar(sidecar)
        return {"epochs": sidecar_epoch(last), "global_step": int(last.get("global_step", 0))}
    return {"epochs": trainer.current_epoch, "global_step": trainer.global_step}


def _pruned(callbacks) -> dict[str, int]:
    """``{"pruned_at_epoch": N}`` when an Optuna pruner stopped this trial."""
    epoch = next((c.pruned_at_epoch for c in callbacks if isinstance(c, TrialReporter)), None)
    return {} if epoch is None else {"pruned_at_epoch": epoch}


def _scalars(values) -> dict[str, float]:
    return {k: float(v) for k, v in values.items() if not (hasattr(v, "numel") and v.numel() != 1)}


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def task(cfg: DictConfig) -> float | None:
    """The Hydra task: one run, or one job of a sweep; its value goes to the sweeper."""
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        if process_rank() == 0:
            output = HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else None
            redact_saved_config(cfg, RunDir(output).saved_config if output else None)
            if cfg.get("print_config"):  # else it is only in the run dir (.hydra/config.yaml)
                print_config_tree(cfg, GROUP_ORDER + ("paths", "seed", "task_name"))
        else:  # a DDP rank Lightning re-launched: rank 0 speaks for all
            quiet_console()
        kept = earlier_sweep_job(cfg) if multirun else None
        if multirun and kept is None and stopped_by_a_rule(cfg):
            return None
        if kept is not None:
            metrics = kept
        elif cfg.get("cv") and cfg.cv.get("folds"):
            metrics = cross_validate(cfg, partial(train_with_remedies, train=train))
        else:
            metrics = train_with_remedies(cfg, train)
        if metrics is None:  # a sweep job that diverged: recorded, the sweep goes on
            return None
    except Exception as err:
        resume_gc()  # a sweep's next job in this process runs with the collector on
        interrupted = getattr(err, "signum", None)
        if interrupted is not None:  # RunInterrupted: checkpoint saved, say how to go on
            if multirun:  # stop the sweep; summarize what ran
                record_interrupted(cfg, str(err))
            resume = f"python -m experiments.train resume={cfg.paths.output_dir}"
            log.error("%s\n%s", err, "the same command again resumes the sweep" if multirun
                      else f"resume with: {resume}")  # fmt: skip
            sys.exit(128 + interrupted)
        user_error = find_user_error(err) or write_error(err, cfg.paths.output_dir)
        if user_error is None:
            raise
        if multirun:
            raise user_error from None  # fail only this job; the sweep summary records it
        exit_with(user_error)  # a user mistake exits 2, found early or late
    # to a sweeper: the best epoch's value (best.pt's weights) when best.pt was chosen by it
    value = RunDir(cfg.paths.output_dir).best_value(str(cfg.optimized_metric))
    value = value if value is not None else metrics.get(cfg.optimized_metric)
    if value is None:
        log.warning("optimized_metric %s was not logged; have: %s", cfg.optimized_metric,
                    ", ".join(sorted(metrics)))  # fmt: skip
    return value


def launch(checked) -> None:
    """Run the training task on the command line ``cli.check`` checked: a plain run on
    the config the check composed (Hydra does not compose it again), a sweep through Hydra."""
    if checked.run_cfg is None:
        task()
    else:
        run_composed(checked.composer, checked.run_cfg, task)
