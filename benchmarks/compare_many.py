"""How long ``python -m experiments.compare`` takes on 500 run folders.

Writes 500 synthetic run folders into a temp folder, laid out as ``python -m
experiments.train`` lays them out (``.hydra/config.yaml`` composed from ``train.yaml``
with ``logger=csv``, ``.hydra/overrides.yaml``, a ``metrics.json`` with the usual keys,
``csv/metrics.csv`` in Lightning's CSV layout), varying ``seed`` and ``optimizer.lr``
(10 learning rates x 50 seeds), then times the whole command (interpreter start, search,
reading, statistics, compare.md/.csv/.png) as a subprocess, a few times.

Example:
    python benchmarks/compare_many.py
    python benchmarks/compare_many.py --runs 500 --repeats 3 --keep /tmp/many
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LRS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.3)
CLASSES = tuple(str(i) for i in range(10))
EPOCHS = 15


def template_config() -> str:
    """The composed default config as Hydra saves it (unresolved), as YAML text."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from experiments.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["logger=csv", "data.num_workers=0"])
    return OmegaConf.to_yaml(cfg)


def fake_metrics(rng: random.Random, lr: float, seed: int, run_dir: Path) -> dict:
    acc = min(0.99, 0.9 + 0.02 * (lr in (0.01, 0.02)) + rng.gauss(0, 0.01))
    metrics = {
        "epochs": EPOCHS,
        "global_step": EPOCHS * 23,
        "run_dir": str(run_dir),
        "seed": seed,
        "wall_time_s": round(rng.uniform(20, 40), 3),
    }
    for split in ("test", "val"):
        metrics.update(
            {
                f"{split}/acc": acc + rng.gauss(0, 0.005),
                f"{split}/loss": 1 - acc,
                f"{split}/macro_f1": acc - 0.005,
                f"{split}/balanced_acc": acc,
                f"{split}/top5_acc": 0.999,
                **{f"{split}/precision/{c}": rng.random() for c in CLASSES},
                **{f"{split}/recall/{c}": rng.random() for c in CLASSES},
            }
        )
    return metrics


def write_metrics_csv(path: Path, rng: random.Random, final_acc: float) -> None:
    """Lightning's CSV logger layout: one header, a row per logged step, blanks elsewhere."""
    columns = ["epoch", "lr-SGD", "step", "train/acc", "train/loss", "val/acc", "val/loss"]
    columns += [f"val/acc_class/{c}" for c in CLASSES]
    path.parent.mkdir(parents=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        step = 0
        for epoch in range(EPOCHS):
            writer.writerow({"epoch": "", "lr-SGD": 0.01, "step": step})
            for _ in range(2):
                step += 10
                writer.writerow({"epoch": epoch, "step": step, "train/loss": rng.random()})
            acc = final_acc - 0.3 * (EPOCHS - 1 - epoch) / EPOCHS + rng.gauss(0, 0.01)
            row = {"epoch": epoch, "step": step, "val/acc": acc, "val/loss": 1 - acc}
            row.update({f"val/acc_class/{c}": rng.random() for c in CLASSES})
            writer.writerow(row)
            writer.writerow({"epoch": epoch, "step": step, "train/acc": acc + 0.02})


def make_runs(root: Path, n: int, config_text: str) -> None:
    rng = random.Random(0)
    seeds_per_lr = max(1, n // len(LRS))
    for i in range(n):
        lr, seed = LRS[(i // seeds_per_lr) % len(LRS)], i % seeds_per_lr
        run = root / "sweep" / str(i)
        (run / ".hydra").mkdir(parents=True)
        text = re.sub(r"^seed: .*$", f"seed: {seed}", config_text, count=1, flags=re.M)
        text = re.sub(r"^  lr: .*$", f"  lr: {lr}", text, count=1, flags=re.M)
        (run / ".hydra" / "config.yaml").write_text(text)
        (run / ".hydra" / "overrides.yaml").write_text(f"- optimizer.lr={lr}\n- seed={seed}\n")
        metrics = fake_metrics(rng, lr, seed, run)
        (run / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
        write_metrics_csv(run / "csv" / "metrics.csv", rng, metrics["val/acc"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="write the runs here and keep them")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        start = time.perf_counter()
        make_runs(root, args.runs, template_config())
        print(f"wrote {args.runs} run folders under {root} in {time.perf_counter() - start:.1f} s")
        cmd = [sys.executable, "-m", "experiments.compare", str(root / "sweep"), f"out={root}"]
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            res = subprocess.run(cmd, capture_output=True, text=True)
            times.append(time.perf_counter() - start)
            if res.returncode != 0:
                sys.exit(f"compare failed ({res.returncode}):\n{res.stderr[-2000:]}")
        head = res.stdout.splitlines()
        print("\n".join(head[:3] + ["..."] + head[-1:]))
        print(
            f"compare on {args.runs} runs: wall time median {statistics.median(times):.2f} s, "
            f"min {min(times):.2f} s, max {max(times):.2f} s over {len(times)} runs "
            f"(python -m experiments.compare, interpreter start included)"
        )


if __name__ == "__main__":
    main()
