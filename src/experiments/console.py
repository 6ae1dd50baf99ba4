"""What a run prints: quiet by default. The console gets what runs, a line per epoch, the
final table and every warning; Lightning's own notices (devices found, why fit stopped) go
to ``train.log`` only. In a sweep the console gets one line per job and the summary: each
job's other lines are in its own ``train.log``.

``ConsoleFilter`` sits on the console handler of Hydra's job logging (conf/hydra/default.yaml);
a record meant for the console in a sweep too is logged with ``extra=SWEEP_LINE``.
"""

from __future__ import annotations

import logging
import os
import warnings

from experiments.errors import exit_with, find_user_error
from experiments.utils import pause_gc

SWEEP_LINE = {"sweep_line": True}

# Lightning's own code warns through torch's deprecated ``LeafSpec`` on every fit (it cannot
# be fixed here; upstream: Lightning-AI/pytorch-lightning#21326). tests/test_console.py checks
# that the warning still happens without this filter, so it can go when Lightning fixes it.
UPSTREAM_WARNINGS = (
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning, r"lightning\."),
)


# Lightning's checkpoint connector calls SLURMEnvironment.detect() on every fit and test,
# whatever cluster environment the Trainer was given (build.cluster_plugins gives one), and
# that warns whenever `srun` is installed and unused: on every run of every machine with
# SLURM installed (lightning/pytorch/trainer/connectors/checkpoint_connector.py,
# _select_ckpt_path; no upstream issue found). Hidden only when no SLURM job is running:
# inside an allocation the hint can be right.
SRUN_HINT = (r"The `srun` command is available on your system but is not used", UserWarning,
             r"lightning\.")  # fmt: skip


def filter_upstream_warnings() -> None:
    """Hide the few third-party warnings that only their authors can fix (each named above)."""

    hidden = list(UPSTREAM_WARNINGS)
    if not os.environ.get("SLURM_JOB_ID"):
        hidden.append(SRUN_HINT)
    for message, category, module in hidden:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


class ConsoleFilter(logging.Filter):
    """Keeps Lightning's INFO notices, and lines logged with ``extra={"console": False}``,
    off the console (they stay in ``train.log``); in a multirun, keeps every INFO line off
    it but those marked ``SWEEP_LINE``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        if getattr(record, "console", True) is False or record.name.startswith("lightning"):
            return False
        return not in_sweep() or getattr(record, "sweep_line", False)


def in_sweep() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.initialized() and str(HydraConfig.get().mode).endswith("MULTIRUN")
    except Exception:  # outside a Hydra run: not a sweep
        return False


def metrics_table(metrics: dict[str, float]) -> str:
    """The final metrics as a small table: one row per name, a column per stage."""
    names = sorted({k.split("/", 1)[1] for k in metrics if k.startswith(("val/", "test/"))})
    names = [n for n in names if "/" not in n]  # per-class values are in metrics.json
    rows = [f"{'':<14}{'val':>10}{'test':>10}"]
    for name in names:
        cells = [metrics.get(f"{stage}/{name}") for stage in ("val", "test")]
        rows.append(f"{name:<14}" + "".join(f"{c:>10.4f}" if c is not None else f"{'':>10}"
                                            for c in cells))  # fmt: skip
    return "\n".join(rows)


def what_runs(cfg, trainer) -> str:
    """``data=digits model=mlp optimizer=sgd(lr=0.1) ... on cpu``: the choices that matter."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    choices = dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else {}
    parts = [f"{g}={choices[g]}" for g in ("experiment", "data", "model") if choices.get(g)]
    opt = choices.get("optimizer", "")
    lr = OmegaConf.select(cfg, "optimizer.lr", default=None)
    parts.append(f"optimizer={opt}(lr={lr:g})" if lr is not None else f"optimizer={opt}")
    if choices.get("scheduler") not in (None, "none"):
        parts.append(f"scheduler={choices['scheduler']}")
    devices = f"{trainer.num_devices} x {trainer.strategy.root_device.type}"
    parts.append(f"epochs={trainer.max_epochs} on {devices}")
    return " ".join(parts)


def run_main(body, argv) -> None:
    """Run ``body(argv)`` as an entry point (eval, predict): a UserError exits 2 in one line,
    as train's do."""
    logging.basicConfig(
        level=logging.INFO,
        format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s",
        datefmt="%H:%M:%S",
    )
    filter_upstream_warnings()
    pause_gc()  # the body calls resume_gc once its start-up is over
    try:
        body(list(argv))
    except Exception as err:
        user_error = find_user_error(err)
        if user_error is None:
            raise
        exit_with(user_error)
