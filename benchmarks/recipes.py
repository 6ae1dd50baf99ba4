"""``make recipes``: train every ``experiment=`` recipe over seeds, as a user would (the CLI
in a subprocess), and write the README's results table to ``benchmarks/recipes.md``.

Real data sets come from ``scripts/get_data.py`` (packages on the registries); a recipe
whose data is not on disk is reported as skipped, not faked.

    python -m benchmarks.recipes                     # all recipes, seeds 0 1 2
    python -m benchmarks.recipes --recipes mnist --seeds 0
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

REPO = Path(__file__).resolve().parents[1]
RECIPES = {  # recipe -> the folder under data/ it needs (None: bundled)
    "digits": None,
    "mnist": "MNIST/raw",
    "fashion_mnist": "FashionMNIST/raw",
    "cifar10": "cifar-10-batches-py",
}


def run(recipe: str, seed: int, data_dir: Path, out: Path, extra: list[str]) -> dict:
    run_dir = out / f"{recipe}-seed{seed}"
    cmd = [sys.executable, "-m", "experiments.train", f"experiment={recipe}", f"seed={seed}",
           f"paths.data_dir={data_dir}", f"hydra.run.dir={run_dir}", *extra]  # fmt: skip
    start = time.perf_counter()
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"{recipe} seed {seed} failed:\n{res.stderr[-3000:]}")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    print(f"{recipe} seed {seed}: test/acc={metrics['test/acc']:.4f} in {wall:.0f} s", flush=True)
    return {"test_acc": metrics["test/acc"], "wall_s": wall, "epochs": metrics["epochs"]}


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
        needs = RECIPES[recipe]
        if needs and not (args.data_dir / needs).exists():
            print(f"{recipe}: skipped, {args.data_dir / needs} not found (scripts/get_data.py)")
            rows.append(f"| {recipe} | `experiment={recipe}` | - | not run: no data on disk | - |")
            continue
        results = [run(recipe, s, args.data_dir, args.out, args.extra) for s in args.seeds]
        accs = [r["test_acc"] for r in results]
        walls = [r["wall_s"] for r in results]
        spread = f" ± {statistics.stdev(accs):.4f}" if len(accs) > 1 else ""
        span = f"n={len(accs)}; {min(accs):.4f}-{max(accs):.4f}"
        rows.append(
            f"| {recipe} | `experiment={recipe}` | {results[0]['epochs']} | "
            f"{statistics.mean(accs):.4f}{spread} ({span}) | "
            f"{statistics.median(walls):.0f} s ({min(walls):.0f}-{max(walls):.0f}) |"
        )
    table = "\n".join(
        [
            f"Measured {time.strftime('%Y-%m-%d')} on {platform.node()} "
            f"({platform.processor() or platform.machine()}), seeds {args.seeds}, "
            f"overrides {args.extra or 'none'}.",
            "",
            "| data | preset | epochs | test accuracy, mean ± std | wall time per run |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )
    args.table.write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
