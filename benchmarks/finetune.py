"""Does ``experiment=finetune`` hold beyond the set it was tuned on?

Three small real sets cut from the registry's MNIST and Fashion-MNIST (``make data``;
``scripts/get_data.py --image-csv mnist`` for MNIST's PNGs) with ``scripts/subset_csv.py``:

  fashion100   Fashion-MNIST, 100 training images per class (10 classes, 1,000 images);
               test: 200 per class of the test split (2,000)
  mnist100     the same cut of MNIST
  fashion_lt4  four similar, grayscale classes of Fashion-MNIST (coat, pullover, shirt,
               t-shirt), long-tailed 8:1 (400/200/100/50, 750 images); test: the same
               four classes of the test split, equally long-tailed (1,000/500/250/125)

On each, three ways a user would train, as a user would (the CLI, one process a run):

  recipe   experiment=finetune (its defaults)
  plain    the same ImageNet weights and epochs, AdamW at one constant learning rate for
           every layer: no head-only epochs, no warmup or decay, no label smoothing, no
           augmentation
  previous the recipe before this check (backbone at 0.1x, flips): ``--ways previous``
  scratch  our best scratch model on 28x28 images (model=cnn optimizer=adamw
           optimizer.lr=0.001, 15 epochs; docs/models.md)

Test accuracy and balanced accuracy (mean recall) per seed; mean and a 95% t interval over
the seeds, clipped to [0, 1]. Writes ``benchmarks/finetune.md`` and the raw results to
``<out>/results.json``; runs already in ``<out>`` are read back, not run again.

    python -m benchmarks.finetune                 # every set, every way, seeds 0 1 2
    python -m benchmarks.finetune --sets mnist100 --ways recipe plain --seeds 0 --jobs 2
    # item 9's first run on your own folder: 180 images, SGD (the old default) vs AdamW
    python -m benchmarks.finetune --sets fashion3_180 --ways cnn_sgd cnn_adamw
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.recipes import train_cli
from experiments.runs.layout import RunDir

REPO = Path(__file__).resolve().parents[1]
SUBSET = [sys.executable, str(REPO / "scripts" / "subset_csv.py")]
SIMILAR = "coat,pullover,shirt,t-shirt"
# set -> (PNG folder under data/, [(csv name, subset_csv arguments on train.csv/test.csv)])
SETS = {
    "fashion100": ("fashion_mnist_png", [("train", ["--per-class", "100"]),
                                         ("test", ["--per-class", "200"])]),
    "mnist100": ("mnist_png", [("train", ["--per-class", "100"]),
                               ("test", ["--per-class", "200"])]),
    "fashion_lt4": ("fashion_mnist_png", [
        ("train", ["--classes", SIMILAR, "--per-class", "400"]),
        ("train", ["--imbalance", "8"]),  # applied to the line above's output
        ("test", ["--classes", SIMILAR, "--imbalance", "8"]),
    ]),
    # a first folder of your own: 180 images, three classes (item 9: a sane start)
    "fashion3_180": ("fashion_mnist_png", [
        ("train", ["--classes", "dress,sandal,bag", "--per-class", "60"]),
        ("test", ["--classes", "dress,sandal,bag", "--per-class", "300"]),
    ]),
}  # fmt: skip
WAYS = {
    "recipe": ["experiment=finetune"],
    "plain": ["experiment=finetune", "model.freeze_backbone_epochs=0", "model.label_smoothing=0.0",
              "scheduler=none", "augment=none"],
    "scratch": ["data=image_csv", "model=cnn", "optimizer=adamw", "optimizer.lr=0.001",
                "trainer.max_epochs=15", "data.image_size=[28,28]"],
    # the recipe before this check: the backbone at 0.1x the head's rate, shifts and flips
    "previous": ["experiment=finetune", "model.backbone_lr_scale=0.1", "augment=basic"],
    # what model.loss=auto's logit-adjusted loss trades on a long-tailed set
    "recipe_ce": ["experiment=finetune", "model.loss=cross_entropy"],
    # data=image_csv's first run, at a photo-like 96 px: the old default SGD against AdamW
    "cnn_sgd": ["data=image_csv", "model=cnn", "optimizer=sgd", "data.image_size=[96,96]"],
    "cnn_adamw": ["data=image_csv", "model=cnn", "optimizer=adamw", "data.image_size=[96,96]"],
}  # fmt: skip
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}  # two-sided, by degrees of freedom


def make_set(name: str, data_dir: Path, out: Path) -> tuple[Path, Path, Path]:
    """The set's train and test CSVs under ``out/sets`` (made once) and its image folder."""
    folder, steps = SETS[name]
    root = data_dir / folder
    if not (root / "train.csv").is_file():
        raise SystemExit(f"{root / 'train.csv'} not found: make data (and, for MNIST, "
                         "scripts/get_data.py --image-csv mnist)")  # fmt: skip
    made = out / "sets"
    made.mkdir(parents=True, exist_ok=True)
    current: dict[str, Path] = {}
    for i, (split, extra) in enumerate(steps):
        source = current.get(split, root / f"{split}.csv")
        target = made / f"{name}_{split}_{i}.csv"
        if not target.is_file():
            res = subprocess.run([*SUBSET, str(source), *extra, "--out", str(target)],
                                 capture_output=True, text=True)  # fmt: skip
            if res.returncode:
                raise SystemExit(res.stderr.strip())
        current[split] = target
    return current["train"], current["test"], root / "images"


def train(set_name: str, way: str, seed: int, data_dir: Path, out: Path, extra: list[str]):
    run_dir = out / f"{set_name}-{way}-seed{seed}"
    result = run_dir / "result.json"
    if result.is_file():
        return json.loads(result.read_text())
    train_csv, test_csv, images = make_set(set_name, data_dir, out)
    over = [*WAYS[way], f"seed={seed}", f"data.csv_file={train_csv}", f"data.image_dir={images}",
            f"data.test_csv_file={test_csv}", "logger=csv", *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    metrics, wall = train_cli(over, run_dir, env)
    if "error" in metrics:
        raise SystemExit(f"{set_name} {way} seed {seed} failed: {metrics['error']}")
    with open(RunDir(run_dir).csv_metrics, newline="") as f:
        val_losses = [float(r["val/loss"]) for r in csv.DictReader(f) if r.get("val/loss")]
    row = {
        "set": set_name, "way": way, "seed": seed, "wall_s": round(wall, 1),
        "acc": metrics["test/acc"], "balanced_acc": metrics["test/balanced_acc"],
        "best_epoch": metrics.get("best_epoch"), "loss": metrics.get("loss"),
        "first_val_loss": val_losses[0] if val_losses else None,
    }  # fmt: skip
    result.write_text(json.dumps(row, indent=1))
    print(f"{set_name} {way} seed {seed}: acc={row['acc']:.4f} "
          f"balanced={row['balanced_acc']:.4f} in {wall:.0f} s", flush=True)  # fmt: skip
    return row


def interval(values: list[float]) -> str:
    """``mean ± half-width`` of a 95% t interval, clipped to [0, 1], and the values."""
    mean = statistics.fmean(values)
    each = ", ".join(f"{v:.4f}" for v in values)
    if len(values) < 2:
        return f"{mean:.4f} ({each})"
    half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    low, high = max(0.0, mean - half), min(1.0, mean + half)
    return f"{mean:.4f} [{low:.4f}, {high:.4f}] ({each})"


def table(rows: list[dict], seeds: list[int], extra: list[str]) -> str:
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.node()} "
        f"({platform.machine()}, {os.cpu_count()} cores, one thread a run), seeds {seeds}, "
        f"overrides {extra or 'none'}; `python -m benchmarks.finetune`.",
        "",
        "Test accuracy and balanced accuracy: mean [95% t interval, clipped to [0, 1]] (per seed).",
        "",
        "| set | way | accuracy | balanced accuracy | first val/loss | minutes a run |",
        "|---|---|---|---|---|---|",
    ]
    for set_name in SETS:
        for way in WAYS:
            got = [r for r in rows if r["set"] == set_name and r["way"] == way]
            if not got:
                continue
            minutes = statistics.median(r["wall_s"] for r in got) / 60
            first = [r.get("first_val_loss") for r in got]
            first = "-" if None in first else f"{min(first):.3g}-{max(first):.3g}"
            lines.append(
                f"| {set_name} | {way} | {interval([r['acc'] for r in got])} | "
                f"{interval([r['balanced_acc'] for r in got])} | {first} | {minutes:.1f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=list(SETS)[:3], choices=list(SETS))
    parser.add_argument("--ways", nargs="+", default=list(WAYS)[:3], choices=list(WAYS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (one thread each)")
    parser.add_argument("--data-dir", type=Path, default=REPO / "data")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "finetune_check")
    parser.add_argument("--table", type=Path, default=REPO / "benchmarks" / "finetune.md")
    parser.add_argument("extra", nargs="*", help="overrides for every run")
    args = parser.parse_args()
    for name in args.sets:
        make_set(name, args.data_dir, args.out)
    todo = [(s, w, seed) for seed in args.seeds for s in args.sets for w in args.ways]
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda t: train(*t, args.data_dir, args.out, args.extra), todo))
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    text = table(rows, args.seeds, args.extra)
    args.table.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
