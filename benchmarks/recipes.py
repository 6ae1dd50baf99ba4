"""``make recipes``: train every ``experiment=`` recipe over seeds as a user would (the CLI in a
subprocess) and write the table of docs/recipes.md to ``benchmarks/recipes.md``. A recipe
whose data is not on disk (``scripts/get_data.py``) is reported as not run, never faked.

    python -m benchmarks.recipes                     # all recipes, seeds 0 1 2
    python -m benchmarks.recipes --recipes mnist --seeds 0 trainer.max_epochs=1
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from experiments.runs.layout import RunDir

REPO = Path(__file__).resolve().parents[1]
RECIPES = {"digits": None, "mnist": "MNIST/raw", "fashion_mnist": "FashionMNIST/raw"}
RECIPES["cifar10"] = "cifar-10-batches-py"  # recipe -> the folder under data/ it needs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--data-dir", type=Path, default=REPO / "data")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "recipes")
    parser.add_argument("--table", type=Path, default=REPO / "benchmarks" / "recipes.md")
    parser.add_argument("extra", nargs="*", help="overrides for every run, e.g. trainer=gpu_fast")
    args = parser.parse_args()
    rows = []
    for recipe in args.recipes:
        if RECIPES[recipe] and not (args.data_dir / RECIPES[recipe]).exists():
            print(f"{recipe}: not run, {args.data_dir / RECIPES[recipe]} not found")
            rows.append(f"| {recipe} | `experiment={recipe}` | - | not run: no data on disk | - |")
            continue
        accs, walls = [], []
        for seed in args.seeds:
            run = args.out / f"{recipe}-seed{seed}"
            cmd = [
                sys.executable,
                "-m",
                "experiments.train",
                f"experiment={recipe}",
                f"seed={seed}",
            ]
            cmd += [f"paths.data_dir={args.data_dir}", f"hydra.run.dir={run}", *args.extra]
            start = time.perf_counter()
            res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            walls.append(time.perf_counter() - start)
            if res.returncode != 0:
                sys.exit(f"{recipe} seed {seed} failed:\n{res.stderr[-3000:]}")
            metrics = json.loads(RunDir(run).metrics.read_text())
            accs.append(metrics["test/acc"])
            print(f"{recipe} seed {seed}: test/acc={accs[-1]:.4f} in {walls[-1]:.0f} s", flush=True)
        spread = f" ± {statistics.stdev(accs):.4f}" if len(accs) > 1 else ""
        spread += f" (n={len(accs)}; {min(accs):.4f}-{max(accs):.4f})"
        rows.append(
            f"| {recipe} | `experiment={recipe}` | {metrics['epochs']} | "
            f"{statistics.mean(accs):.4f}{spread} | "
            f"{statistics.median(walls):.0f} s ({min(walls):.0f}-{max(walls):.0f}) |"
        )
    table = [
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.node()} ({platform.machine()}), "
        f"seeds {args.seeds}, overrides {args.extra or 'none'}.",
        "",
        "| data | preset | epochs | test accuracy, mean ± std | wall time per run |",
        "|---|---|---|---|---|",
        *rows,
    ]
    args.table.write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
