"""``python -m experiments.train``: compose the configs, train, test, write metrics.json.

Examples:
    python -m experiments.train model=cnn optimizer.lr=0.05
    python -m experiments.train -m optimizer.lr=0.01,0.1
    python -m experiments.train resume=auto
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from experiments.config import validate
from experiments.errors import UserError, find_user_error, one_line

log = logging.getLogger(__name__)

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
GROUP_ORDER = ("data", "model", "optimizer", "scheduler", "trainer", "callbacks", "logger")


def _sweep_group(mode, sweep_dir: str) -> str | None:
    return Path(sweep_dir).name if str(mode).endswith("MULTIRUN") else None


# used by conf/paths: the W&B group of a sweep's jobs
OmegaConf.register_new_resolver("experiments.sweep_group", _sweep_group, replace=True)


def train(cfg: DictConfig) -> dict[str, float]:
    """Train and test one model as ``cfg`` says; write ``metrics.json``; return the metrics.

    Returns:
        Final ``train/*``, ``val/*`` and ``test/*`` metrics as floats.

    Raises:
        UserError: a mistake in the config or data (one line, naming what to fix).
        RunInterrupted: SIGTERM/SIGINT arrived; a checkpoint was saved first.
    """
    from experiments.provenance import start_git_probe

    git = start_git_probe()  # runs while torch and lightning import
    # imported here, not at the top: torch + lightning cost ~6 s, and `--help`,
    # `--cfg job` and config errors should answer before paying it
    import lightning as L
    from hydra.utils import instantiate
    from lightning.pytorch.callbacks import LearningRateMonitor

    from experiments.callbacks import FaultTolerance, StateDictCheckpoint
    from experiments.callbacks.fault_tolerance import RunInterrupted
    from experiments.checkpoint_io import AtomicCheckpointIO
    from experiments.config import redact
    from experiments.io import load_state_dict_file, write_json
    from experiments.provenance import write_environment
    from experiments.tracking import finish_loggers, previous_wandb_id
    from experiments.utils import route_lightning_logs

    route_lightning_logs()
    validate(cfg)
    start = time.perf_counter()
    run_dir = Path(cfg.paths.output_dir)
    resume_from = _checkpoint_to_resume(cfg, run_dir)

    if cfg.seed is not None:  # seed=0 is a seed too
        L.seed_everything(cfg.seed, workers=True, verbose=False)

    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")  # the model learns the data's shape and class count from here

    net = instantiate(
        cfg.model.net, in_shape=datamodule.input_shape, num_classes=datamodule.num_classes
    )
    model = instantiate(
        cfg.model,
        net=net,
        optimizer=instantiate(cfg.optimizer),
        scheduler=instantiate(cfg.scheduler) if cfg.get("scheduler") else None,
        num_classes=datamodule.num_classes,
    )

    # a callback switched off (`enabled: false`, e.g. profile=false) is not built at all:
    # Lightning calls every hook of every callback on every step
    callbacks = [
        instantiate(c)
        for c in (cfg.get("callbacks") or {}).values()
        if c and c.get("enabled", True) is not False
    ]
    wandb_id = previous_wandb_id(run_dir) if resume_from else None
    loggers = [
        instantiate(c, **({"run_id": wandb_id} if "wandb" in str(c.get("_target_")) else {}))
        for c in (cfg.get("logger") or {}).values()
        if c
    ]
    if not loggers and any(isinstance(c, LearningRateMonitor) for c in callbacks):
        log.info("no logger configured: leaving out the LR monitor, which needs one")
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    guard = next((c for c in callbacks if isinstance(c, FaultTolerance)), None)
    if guard is not None:
        guard.install()  # from here on, SIGTERM/SIGINT end in a checkpoint, not a lost run

    trainer = instantiate(
        cfg.trainer, callbacks=callbacks, logger=loggers or False, plugins=[AtomicCheckpointIO()]
    )
    if trainer.is_global_zero:
        write_environment(run_dir, cfg.seed, str(trainer.strategy.root_device), git())
    checkpoints = next((c for c in callbacks if isinstance(c, StateDictCheckpoint)), None)
    try:
        for logger in loggers:
            logger.log_hyperparams(redact(OmegaConf.to_container(cfg, resolve=True)))

        trainer.fit(model, datamodule=datamodule, ckpt_path=resume_from)
        metrics = _scalars(trainer.callback_metrics)
        if cfg.get("test"):
            if checkpoints is not None and checkpoints.best_path.is_file():
                # the sidecar, not the callback: under ddp_fork the callback lived in a child
                best = json.loads(checkpoints.best_path.with_suffix(".json").read_text())
                log.info(
                    "testing best.pt (epoch %d, %s=%.4f)",
                    best["epoch"] + 1,
                    best["monitor"],
                    best["value"],
                )
                load_state_dict_file(model.net, checkpoints.best_path, map_location=model.device)
            tester = trainer
            if trainer.world_size > 1:
                # under DDP the test split would be sharded and padded with repeated samples;
                # one device scores every test image exactly once
                tester = L.Trainer(
                    accelerator=trainer.accelerator,
                    devices=1,
                    num_nodes=1,
                    logger=loggers or False,
                    enable_progress_bar=False,
                    enable_checkpointing=False,
                    callbacks=[],
                    precision=cfg.trainer.get("precision", "32-true"),
                )
            if tester.is_global_zero or tester is trainer:
                for result in tester.test(model, datamodule=datamodule, verbose=False):
                    metrics.update(_scalars(result))
        if guard is not None and guard.signum is not None:  # arrived after the last step
            raise RunInterrupted(
                guard.signum,
                run_dir / "checkpoints" / "last.ckpt",
                trainer.current_epoch,
                trainer.global_step,
            )
    except BaseException:
        finish_loggers(loggers, failed=True)  # one W&B run per job, closed even on failure
        raise
    finally:
        if guard is not None:
            guard.uninstall()
    finish_loggers(
        loggers, failed=False, checkpoint_dir=checkpoints.dirpath if checkpoints else None
    )

    summary = {
        **metrics,
        "seed": cfg.seed,
        "run_dir": str(run_dir.resolve()),
        "wall_time_s": round(time.perf_counter() - start, 3),
        **_progress(trainer, checkpoints),
    }
    if trainer.is_global_zero:
        write_json(run_dir / "metrics.json", summary)
    shown = "  ".join(f"{k}={metrics[k]:.4f}" for k in ("val/acc", "test/acc") if k in metrics)
    log.info("done in %.1f s: %s  (%s)", summary["wall_time_s"], shown, run_dir)
    return metrics


def _checkpoint_to_resume(cfg: DictConfig, run_dir: Path) -> Path | None:
    """The full checkpoint to continue from, or None for a fresh run.

    A fresh run refuses a run dir that already holds checkpoints (it would silently start
    an unfinished run over from step 0); a resume refuses a finished run unless
    ``trainer.max_epochs`` was raised.
    """
    from experiments.checkpoint_io import (
        PREVIOUS_SUFFIX,
        newest_valid_checkpoint,
        newest_valid_hpc_checkpoint,
        remove_stale_temp_files,
    )
    from experiments.precheck import has_last_checkpoint, requeued

    folder = run_dir / "checkpoints"
    if folder.is_dir():
        remove_stale_temp_files(folder)
    has_checkpoints = has_last_checkpoint(run_dir) or any(run_dir.glob("hpc_ckpt_*.ckpt"))
    # a SLURM job requeued after pre-emption/time-out runs again in its own job dir
    # (submitit keeps it): continue from the checkpoint instead of refusing
    if not cfg.get("resume") and not (has_checkpoints and requeued()):
        if has_checkpoints:
            raise UserError(
                f"{run_dir} already holds checkpoints of a run; continue it with "
                f"resume={run_dir} or choose another hydra.run.dir"
            )
        return None
    found = newest_valid_checkpoint(folder)
    hpc = newest_valid_hpc_checkpoint(run_dir)  # Lightning's SIGUSR1 (SLURM requeue) one
    if hpc is not None and (found is None or hpc[0].stat().st_mtime > found[0].stat().st_mtime):
        found = hpc
    if found is None:
        raise UserError(f"resume: no loadable checkpoint in {folder}")
    path, checkpoint = found
    if path.name.endswith(PREVIOUS_SUFFIX):
        log.warning("resume: the newest checkpoint is unreadable; falling back to %s", path)
    epochs_done = int(checkpoint.get("epoch", 0)) + 1
    max_epochs = cfg.trainer.get("max_epochs")
    finished = (run_dir / "metrics.json").is_file()
    if finished and max_epochs is not None and 0 <= max_epochs <= epochs_done:
        raise UserError(
            f"{run_dir} already finished {epochs_done} epochs (metrics.json); raise "
            f"trainer.max_epochs to train on, or start a new run"
        )
    log.info(
        "resuming %s from %s (epoch %d, step %d)",
        run_dir,
        path.name,
        checkpoint.get("epoch", 0),
        checkpoint.get("global_step", 0),
    )
    if finished:
        (run_dir / "metrics.json").rename(run_dir / "metrics.previous.json")
    return path


def _progress(trainer, checkpoints) -> dict[str, int]:
    """Epochs and steps trained; after ddp_fork/ddp_spawn the loops ran in child processes,
    so the last checkpoint's sidecar is the record."""
    sidecar = checkpoints.last_path.with_suffix(".json") if checkpoints else None
    if trainer.global_step == 0 and sidecar is not None and sidecar.is_file():
        last = json.loads(sidecar.read_text())
        return {"epochs": last["epoch"] + 1, "global_step": last["global_step"]}
    return {"epochs": trainer.current_epoch, "global_step": trainer.global_step}


def _scalars(values) -> dict[str, float]:
    out = {}
    for key, value in values.items():
        if hasattr(value, "numel") and value.numel() != 1:
            continue
        out[key] = float(value)
    return out


def fail(err: UserError) -> None:
    """Report a user mistake as one line and exit 1 (in a sweep: fail only this job)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        raise err
    # an error raised in a DataLoader worker arrives wrapped in the worker's traceback
    print(f"error: {one_line(err, last=True)}", file=sys.stderr)
    sys.exit(1)


def _redact_saved_config(cfg: DictConfig) -> None:
    """Hydra wrote .hydra/config.yaml before we ran: strip secret values from it."""
    from hydra.core.hydra_config import HydraConfig

    from experiments.config import redact

    plain = OmegaConf.to_container(cfg, resolve=False)
    clean = redact(plain)
    if clean == plain or not HydraConfig.initialized():
        return
    saved = Path(HydraConfig.get().runtime.output_dir) / ".hydra" / "config.yaml"
    if saved.is_file():
        OmegaConf.save(OmegaConf.create(clean), saved)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def main(cfg: DictConfig) -> float | None:
    from experiments.utils import print_config_tree, process_rank, quiet_console

    try:
        validate(cfg)
        if process_rank() == 0:
            _redact_saved_config(cfg)
            print_config_tree(cfg, GROUP_ORDER + ("paths", "seed", "task_name"))
        else:  # a DDP rank Lightning re-launched: rank 0 speaks for all
            quiet_console()
        metrics = train(cfg)
    except Exception as err:
        interrupted = getattr(err, "signum", None)
        if interrupted is not None:  # RunInterrupted: checkpoint saved, say how to go on
            log.error(
                "%s\nresume with: python -m experiments.train resume=%s", err, cfg.paths.output_dir
            )
            sys.exit(128 + interrupted)
        user_error = find_user_error(err)
        if user_error is None:
            raise
        fail(user_error)
    value = metrics.get(cfg.optimized_metric)
    if value is None:
        log.warning(
            "optimized_metric %s was not logged; have: %s",
            cfg.optimized_metric,
            ", ".join(sorted(metrics)),
        )
    return value


def cli() -> None:
    """Check the command line before Hydra starts (fast, one line), then run ``main``."""
    from experiments.precheck import precheck

    try:
        argv = precheck(sys.argv[1:], CONF_DIR)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    sys.argv = [sys.argv[0], *argv]
    main()


if __name__ == "__main__":
    cli()
