"""Small helpers shared by the entry points."""

from __future__ import annotations

import gc
import logging
import os

from omegaconf import DictConfig, OmegaConf


def print_config_tree(cfg: DictConfig, order: tuple[str, ...] = ()) -> None:
    """Print the resolved config as a Rich tree, the groups in ``order`` first."""
    import rich
    import rich.syntax
    import rich.tree

    from experiments.secrets import redacted_config

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
