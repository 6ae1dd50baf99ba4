"""Jobs that heal themselves: a run that fails for a mechanical reason is fixed and run
again, each remedy recorded in ``metrics.json`` (and so in a sweep's summary).

- **Out of memory** (``torch.OutOfMemoryError`` on a GPU; on a CPU the allocator's
  ``RuntimeError``, "DefaultCPUAllocator: can't allocate memory"): half the batch size and twice the
  gradient accumulation, so the effective batch, the optimizer steps per epoch and the
  learning-rate schedule stay the same; down to ``remedies.min_batch_size``.
- **Diverged** (a NaN or inf training loss): ``remedies.diverged_retries`` more runs, each
  at ``remedies.lr_scale`` times the learning rate. Past them, a sweep job ends with status
  ``diverged`` (the sweep goes on); a single run stops with the one-line error.

A retry starts the run over: the failed attempt's checkpoints are moved to
``checkpoints_attempt<k>/`` (nothing is deleted).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from experiments.callbacks.fault_tolerance import Diverged
from experiments.console import in_sweep
from experiments.errors import UserError, find_in_chain, one_line
from experiments.runs.files import read_json_object, write_json
from experiments.runs.layout import RunDir

log = logging.getLogger(__name__)


# what an allocator says when it cannot give the memory a tensor needs: CUDA's and MPS's
# "out of memory", the CPU allocator's "can't allocate memory" (errno ENOMEM) or, on
# Windows, "not enough memory"
OUT_OF_MEMORY = ("out of memory", "can't allocate memory", "not enough memory")


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is a tensor allocation that did not fit, on any device."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    text = str(err).lower() if isinstance(err, RuntimeError) else ""
    return any(words in text for words in OUT_OF_MEMORY)


def train_with_remedies(cfg: DictConfig, train: Callable[[DictConfig], dict]) -> dict | None:
    """``train(cfg)``, healed where a remedy applies; None for a sweep job that diverged
    past its retries (recorded in metrics.json as such)."""
    applied: list[str] = []
    while True:
        try:
            metrics = train(cfg)
        except Exception as err:
            oom = find_in_chain(err, is_out_of_memory)
            diverged = find_in_chain(err, lambda e: isinstance(e, Diverged))
            if oom is not None:
                remedy = _halve_batch(cfg)
            elif diverged is not None:
                remedy = _lower_lr(cfg, sum(r.startswith("optimizer.lr") for r in applied))
                if remedy is None and in_sweep():
                    return _record_diverged(cfg, diverged, applied)
            else:
                raise
            if remedy is None:
                raise
            applied.append(remedy)
            log.warning("%s: running again with %s", _first_line(oom or diverged), remedy,
                        extra={"sweep_line": True})  # fmt: skip
            checkpoints = RunDir(cfg.paths.output_dir).checkpoints
            if checkpoints.is_dir():
                checkpoints.rename(checkpoints.with_name(f"checkpoints_attempt{len(applied)}"))
            continue
        if applied:
            metrics = {**metrics, "remedies": applied}
            _add_to_metrics_file(cfg, {"remedies": applied})
        return metrics


def _halve_batch(cfg: DictConfig) -> str | None:
    batch = int(OmegaConf.select(cfg, "data.batch_size"))
    floor = int(OmegaConf.select(cfg, "remedies.min_batch_size", default=1) or 1)
    if not OmegaConf.select(cfg, "remedies.oom", default=True):
        return None
    if batch // 2 < floor:
        raise UserError(
            f"out of memory at data.batch_size={batch}, and half of it is below "
            f"remedies.min_batch_size={floor}: use a smaller model or input, or a larger device"
        )
    accumulate = int(OmegaConf.select(cfg, "trainer.accumulate_grad_batches", default=1) or 1)
    with open_dict(cfg):
        cfg.data.batch_size = batch // 2
        cfg.trainer.accumulate_grad_batches = accumulate * 2
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return (
        f"data.batch_size={batch // 2} trainer.accumulate_grad_batches={accumulate * 2} "
        f"(out of memory at batch {batch})"
    )


def _lower_lr(cfg: DictConfig, done: int) -> str | None:
    retries = int(OmegaConf.select(cfg, "remedies.diverged_retries", default=0) or 0)
    if done >= retries:
        return None
    scale = float(OmegaConf.select(cfg, "remedies.lr_scale", default=0.1))
    lr = float(OmegaConf.select(cfg, "optimizer.lr"))
    with open_dict(cfg):
        cfg.optimizer.lr = lr * scale
    return f"optimizer.lr={lr * scale:g} (diverged at lr {lr:g})"


def _record_diverged(cfg: DictConfig, err: BaseException, applied: list[str]) -> None:
    _add_to_metrics_file(cfg, {
        "status": "diverged", "diverged_at_step": getattr(err, "step", None),
        "error": _first_line(err), "remedies": applied,
    })  # fmt: skip
    log.error("diverged: %s", _first_line(err), extra={"sweep_line": True})


def _add_to_metrics_file(cfg: DictConfig, values: dict[str, Any]) -> None:
    path = RunDir(cfg.paths.output_dir).metrics
    write_json(path, {**read_json_object(path), **values})


def _first_line(err: BaseException | None) -> str:
    return one_line(err)[:300] if err is not None else ""
