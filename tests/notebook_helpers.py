"""Synthetic run folders in the real format (what ``python -m experiments.train`` writes, as
``runs.layout`` names it), many at once and with no training: for the lab notebook's tests
and its benchmark. Imports no torch."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import yaml

from experiments.runs.layout import RunDir, SweepDir

DATASETS = ("digits", "fashion_mnist")
MODELS = ("mlp", "cnn")
LRS = (0.01, 0.03, 0.1, 0.3)
SEEDS = (0, 1, 2, 3, 4)
START = 1_790_000_000.0  # the first run's start time (2026-09); each next one a minute later


def config(data: str, model: str, lr: float, seed: int, tags: list[str]) -> dict:
    """A saved ``.hydra/config.yaml`` as Hydra writes it (unresolved interpolations), of the
    size and shape of a real one."""
    return {
        "task_name": "train", "seed": seed, "optimized_metric": "val/acc",
        "optimized_mode": "max", "tags": tags, "resume": None, "test": True,
        "cv": {"folds": None},
        "model": {
            "_target_": "experiments.models.ClassificationModule", "loss": "auto",
            "label_smoothing": 0.0, "monitor": "${optimized_metric}", "ema_decay": None,
            "net": {"_target_": f"experiments.models.{model.upper()}",
                    "hidden_sizes": [128, 64], "dropout": 0.0},
        },
        "optimizer": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": lr,
                      "momentum": 0.9, "weight_decay": 0.0, "nesterov": False},
        "scheduler": None,
        "data": {"_target_": "experiments.data.ImageDataModule", "dataset": data,
                 "root": "${paths.data_dir}/" + data, "batch_size": 64, "num_workers": 0,
                 "val_fraction": 0.15, "split_seed": 0,
                 "stats_file": "${paths.output_dir}/data_stats.json"},
        "trainer": {"_target_": "lightning.pytorch.Trainer", "accelerator": "cpu",
                    "devices": 1, "max_epochs": 10, "precision": "32-true",
                    "gradient_clip_val": None, "deterministic": False},
        "callbacks": {"model_checkpoint": {"monitor": "${optimized_metric}", "save_top_k": 1},
                      "early_stopping": {"enabled": False, "patience": 5}},
        "logger": {"csv": {"_target_": "experiments.tracking.csv.CSVLogger", "name": ""}},
        "paths": {"root_dir": "${oc.env:EXPERIMENTS_ROOT,.}",
                  "data_dir": "${paths.root_dir}/data",
                  "output_dir": "${hydra:runtime.output_dir}"},
    }  # fmt: skip


def accuracy(data: str, model: str, lr: float, seed: int, epoch: int) -> float:
    """A made-up but deterministic learning curve: better with the right lr, cnn, digits."""
    base = 0.9 if data == "digits" else 0.8
    base += 0.04 * (model == "cnn") - 0.1 * abs(LRS.index(lr) - 2) / 2
    noise = random.Random(f"{data}{model}{lr}{seed}").uniform(-0.02, 0.02)
    return round(min(0.999, base + noise - 0.3 / (epoch + 1)), 6)


def write_run(
    path: Path, data: str, model: str, lr: float, seed: int, *, tags=(), epochs: int = 6,
    start: float = START, overrides: list[str] | None = None, job: bool = False,
) -> Path:  # fmt: skip
    """One finished run folder: config, overrides, Hydra's choices, metrics.json, best.json
    and the CSV logger's rows, with every file's mtime set to ``start`` (the run's start)."""
    run = RunDir(path)
    run.saved_config.parent.mkdir(parents=True, exist_ok=True)
    run.saved_config.write_text(yaml.safe_dump(config(data, model, lr, seed, list(tags)),
                                               sort_keys=False))  # fmt: skip
    overrides = overrides or [f"data={data}", f"model={model}", f"optimizer.lr={lr}",
                              f"seed={seed}"]  # fmt: skip
    run.saved_overrides.write_text(yaml.safe_dump(overrides))
    choices = {"experiment": None, "hydra": "default", "paths": "default", "logger": "csv",
               "trainer": "default", "data": data, "scheduler": "none", "optimizer": "sgd",
               "model": model, "hydra/launcher": "basic"}  # fmt: skip
    hydra = {"hydra": {"run": {"dir": str(path)}, "runtime": {"output_dir": str(path),
                                                             "choices": choices}}}  # fmt: skip
    run.hydra_runtime.write_text(yaml.safe_dump(hydra, sort_keys=False))
    curve = [accuracy(data, model, lr, seed, e) for e in range(epochs)]
    best = max(range(epochs), key=lambda e: curve[e])
    losses = [round(1.5 - c, 6) for c in curve]
    val = {"val/acc": curve[best], "val/loss": losses[best], "val/acc_best": curve[best]}
    metrics = {
        **{k: v for k, v in val.items()}, "val/acc": curve[-1], "val/loss": losses[-1],
        "test/acc": round(curve[best] - 0.01, 6), "test/loss": losses[best] + 0.01,
        "test/recall/0": 0.5, "epochs": epochs, "best_epoch": best + 1, "seed": seed,
        "wall_time_s": 10.0 + seed, "run_dir": str(path),
    }  # fmt: skip
    run.metrics.write_text(json.dumps(metrics, indent=2))
    run.checkpoints.mkdir(exist_ok=True)
    sidecar = {"epoch": best + 1, "epoch_base": 1, "global_step": 10 * (best + 1),
               "monitor": "val/acc", "value": curve[best], "metrics": val}  # fmt: skip
    run.best_json.write_text(json.dumps(sidecar))
    run.csv_metrics.parent.mkdir(exist_ok=True)
    lines = ["epoch,step,train/loss,val/acc,val/loss"]
    for e in range(epochs):
        lines.append(f"{e},{10 * e + 9},{losses[e] + 0.05},,")
        lines.append(f"{e},{10 * e + 9},,{curve[e]},{losses[e]}")
    run.csv_metrics.write_text("\n".join(lines) + "\n")
    if job:
        record = {"status": "ok", "overrides": overrides, "value": curve[best], "num": 0}
        SweepDir.job_file(path).write_text(json.dumps(record))
    for f in path.rglob("*"):
        os.utime(f, (start, start))
    return path


def write_runs(root: Path, n: int, jobs_per_sweep: int = 20, tag_every: int = 3) -> list[Path]:
    """``n`` finished runs under ``root``: sweeps of ``jobs_per_sweep`` jobs (``sweep_<k>/<j>``,
    each sweep one data set and model over lrs x seeds, with ``sweep.json``), newest last.
    Every ``tag_every``-th run was launched with ``tags=[baseline]``."""
    paths = []
    for i in range(n):
        s, j = divmod(i, jobs_per_sweep)
        data, model = DATASETS[s % 2], MODELS[(s // 2) % 2]
        lr, seed = LRS[j % len(LRS)], SEEDS[(j // len(LRS)) % len(SEEDS)]
        sweep = root / f"sweep_{s:03d}"
        if j == 0:
            sweep.mkdir(parents=True, exist_ok=True)
            SweepDir(sweep).sweep_file.write_text(json.dumps({"space": ["optimizer.lr", "seed"]}))
        tags = ["baseline"] if i % tag_every == 0 else []
        paths.append(write_run(sweep / str(j), data, model, lr, seed, tags=tags,
                               start=START + 60 * i, job=True))  # fmt: skip
    return paths
