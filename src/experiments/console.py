"""What a run prints: quiet by default. The console gets what runs, a line per epoch, the
final table and every warning; Lightning's own notices (devices found, why fit stopped) go
to ``train.log`` only. In a sweep the console gets one line per job and the summary: each
job's other lines are in its own ``train.log``.

``ConsoleFilter`` sits on the console handler of Hydra's job logging (conf/hydra/default.yaml);
a record meant for the console in a sweep too is logged with ``extra=SWEEP_LINE``.
"""

from __future__ import annotations

import gc
import logging
import os
import warnings

import rich
import rich.syntax
import rich.tree
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from experiments.secrets import redacted_config

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


def print_config_tree(cfg: DictConfig, order: tuple[str, ...] = ()) -> None:
    """Print the resolved config as a Rich tree, the groups in ``order`` first."""
    tree = rich.tree.Tree("config", guide_style="dim")
    plain = redacted_config(cfg)
    keys = [k for k in order if k in plain] + [k for k in plain if k not in order]
    for key in keys:
        node = plain[key]
        text = OmegaConf.to_yaml(node) if isinstance(node, dict | list) else str(node)
        tree.add(str(key)).add(rich.syntax.Syntax(text, "yaml", theme="ansi_dark"))
    rich.print(tree)


_gc_paused = False


def pause_gc() -> None:
    """Turn the cyclic garbage collector off for a command's start-up (``resume_gc`` turns
    it back on).

    Start-up (torch, Lightning, torchmetrics, Hydra) allocates ~500k long-lived objects; the
    allocation count alone triggers full collections that walk all of them, ~0.7 s of the
    time to the first step on a 2-core CPU, and reclaim next to nothing.
    """
    global _gc_paused
    if gc.isenabled():
        gc.disable()
        _gc_paused = True


def resume_gc() -> None:
    """Once per process, when start-up is over: move every object alive now to the permanent
    generation (``gc.freeze``: later collections skip them) and turn the collector on."""
    global _gc_paused
    if _gc_paused:
        _gc_paused = False
        gc.freeze()
        gc.enable()


class _DropAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


def route_lightning_logs() -> None:
    """Send Lightning's log records through the root logger only.

    ``import lightning`` adds its own stderr handler; under Hydra, whose root logger
    already writes to the console and ``train.log``, every line would print twice. And
    ``lightning.pytorch``/``lightning.fabric``, when imported before logging is set up (a
    notebook, a script that imports Lightning first), get a stderr handler of their own and
    stop propagating: their notices would bypass the console filter and ``train.log``.
    Its per-run product advert is dropped (a filter on that one message).
    """
    if logging.getLogger().hasHandlers():
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            own = logging.getLogger(name)
            for handler in list(own.handlers):
                own.removeHandler(handler)
            own.propagate = True
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        target = logging.getLogger(name)
        if not any(isinstance(f, _DropAdverts) for f in target.filters):
            target.addFilter(_DropAdverts())


def process_rank() -> int:
    """Global rank of this process as launchers announce it (0 when not distributed)."""
    # the order Lightning reads them in (rank_zero_only): a launcher's RANK/LOCAL_RANK wins over
    # SLURM_PROCID, which is 0 for every process an interactive allocation forks itself
    for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        value = os.environ.get(var)
        if value not in (None, ""):
            return int(value)
    return 0


def quiet_console() -> None:
    """Non-zero ranks: keep warnings and errors on the console, not every info line twice."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(
            handler, logging.FileHandler
        ):
            handler.setLevel(logging.WARNING)
