"""``python -m experiments.train``: compose the configs, train, test, write metrics.json.

Examples:
    python -m experiments.train model=cnn optimizer.lr=0.05
    python -m experiments.train -m optimizer.lr=0.01,0.1
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from experiments.config import validate
from experiments.errors import UserError, find_user_error

log = logging.getLogger(__name__)

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")


def _sweep_group(mode, sweep_dir: str) -> str | None:
    return Path(sweep_dir).name if str(mode).endswith("MULTIRUN") else None


# used by conf/paths: the W&B group of a sweep's jobs
OmegaConf.register_new_resolver("experiments.sweep_group", _sweep_group, replace=True)
GROUP_ORDER = ("data", "model", "optimizer", "scheduler", "trainer", "callbacks", "logger")


def train(cfg: DictConfig) -> dict[str, float]:
    """Train and test one model as ``cfg`` says; write ``metrics.json``; return the metrics.

    Returns:
        Final ``train/*``, ``val/*`` and ``test/*`` metrics as floats.
    """
    # imported here, not at the top: torch + lightning cost ~6 s, and `--help`,
    # `--cfg job` and config errors should answer before paying it
    import lightning as L
    from hydra.utils import instantiate
    from lightning.pytorch.callbacks import LearningRateMonitor

    from experiments.callbacks import StateDictCheckpoint
    from experiments.config import redact
    from experiments.io import load_state_dict_file, write_json
    from experiments.tracking import finish_loggers
    from experiments.utils import route_lightning_logs

    route_lightning_logs()
    validate(cfg)
    start = time.perf_counter()
    run_dir = Path(cfg.paths.output_dir)

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

    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c]
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values() if c]
    if not loggers and any(isinstance(c, LearningRateMonitor) for c in callbacks):
        log.info("no logger configured: leaving out the LR monitor, which needs one")
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]

    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    checkpoints = next((c for c in callbacks if isinstance(c, StateDictCheckpoint)), None)
    try:
        for logger in loggers:
            logger.log_hyperparams(redact(OmegaConf.to_container(cfg, resolve=True)))

        trainer.fit(model, datamodule=datamodule)
        metrics = _scalars(trainer.callback_metrics)
        if cfg.get("test"):
            if checkpoints is not None and checkpoints.best_path.is_file():
                log.info(
                    "testing best.pt (epoch %d, %s=%.4f)",
                    checkpoints.best_epoch + 1,
                    checkpoints.monitor,
                    checkpoints.best_score,
                )
                load_state_dict_file(model.net, checkpoints.best_path, map_location=model.device)
            for result in trainer.test(model, datamodule=datamodule, verbose=False):
                metrics.update(_scalars(result))
    except BaseException:
        finish_loggers(loggers, failed=True)  # one W&B run per job, closed even on failure
        raise
    finish_loggers(
        loggers, failed=False, checkpoint_dir=checkpoints.dirpath if checkpoints else None
    )

    summary = {
        **metrics,
        "seed": cfg.seed,
        "run_dir": str(run_dir.resolve()),
        "wall_time_s": round(time.perf_counter() - start, 3),
        "epochs": trainer.current_epoch,
        "global_step": trainer.global_step,
    }
    if trainer.is_global_zero:
        write_json(run_dir / "metrics.json", summary)
    shown = "  ".join(f"{k}={metrics[k]:.4f}" for k in ("val/acc", "test/acc") if k in metrics)
    log.info("done in %.1f s: %s  (%s)", summary["wall_time_s"], shown, run_dir)
    return metrics


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
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    message = lines[-1] if lines else type(err).__name__
    message = message.removeprefix("experiments.errors.UserError: ").removeprefix("UserError: ")
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        validate(cfg)
        from experiments.utils import print_config_tree

        print_config_tree(cfg, GROUP_ORDER + ("paths", "seed", "task_name"))
        metrics = train(cfg)
    except Exception as err:
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


if __name__ == "__main__":
    main()
