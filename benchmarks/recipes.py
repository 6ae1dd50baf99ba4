"""``make recipes``: train every ``experiment=`` recipe over seeds as a user would (the CLI in a
subprocess) and write the table of docs/recipes.md to ``benchmarks/recipes.md``. A recipe
whose data is not on disk (``scripts/get_data.py``) is reported as not run, never faked.

    python -m benchmarks.recipes                     # all recipes, seeds 0 1 2
    python -m benchmarks.recipes --recipes mnist --seeds 0 trainer.max_epochs=1
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from experiments.config import CONF_DIR
from experiments.runs.files import read_json
from experiments.runs.layout import RunDir

REPO = Path(__file__).resolve().parents[1]
RECIPES = {"digits": None, "mnist": "MNIST/raw", "fashion_mnist": "FashionMNIST/raw"}
RECIPES["cifar10"] = "cifar-10-batches-py"  # recipe -> the folder under data/ it needs
RECIPES |= {"speedrun_mnist": "MNIST/raw", "speedrun_fashion_mnist": "FashionMNIST/raw"}


def train_cli(overrides: list[str], run_dir: Path, env: dict | None = None, timeout=None):
    """``python -m experiments.train <overrides>`` into ``run_dir``, as a user runs it.

    Returns:
        ``(metrics.json as a dict, wall seconds)``; when the run failed or timed out, the
        dict holds only ``"error"``: the exit status and the end of its stderr.
    """
    cmd = [sys.executable, "-m", "experiments.train", *overrides, f"hydra.run.dir={run_dir}"]
    start = time.perf_counter()
    try:
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env,
                             timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"stopped after {timeout} s"}, time.perf_counter() - start
    wall = time.perf_counter() - start
    if res.returncode != 0:
        return {"error": f"exit {res.returncode}: {res.stderr[-3000:]}"}, wall
    return read_json(RunDir(run_dir).metrics, kind=dict), wall


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
        if not (CONF_DIR / "experiment" / f"{recipe}.yaml").is_file():
            print(f"{recipe}: not run, no conf/experiment/{recipe}.yaml")
            continue
        if RECIPES[recipe] and not (args.data_dir / RECIPES[recipe]).exists():
            print(f"{recipe}: not run, {args.data_dir / RECIPES[recipe]} not found")
            rows.append(f"| {recipe} | `experiment={recipe}` | - | not run: no data on disk | - |")
            continue
        accs, walls = [], []
        for seed in args.seeds:
            over = [f"experiment={recipe}", f"seed={seed}", f"paths.data_dir={args.data_dir}"]
            metrics, wall = train_cli([*over, *args.extra], args.out / f"{recipe}-seed{seed}")
            if "error" in metrics:
                sys.exit(f"{recipe} seed {seed} failed: {metrics['error']}")
            accs.append(metrics["test/acc"])
            walls.append(wall)
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
