"""The GPU check: one command, about 8 minutes on one CUDA GPU, that writes
``benchmarks/gpu.md``: each speedrun recipe's time to its target and test accuracy over seeds
(the CLI with ``trainer=gpu_fast``, a fresh process a seed, ``time_to_target/*`` from its
metrics.json), then the step-time pairs of ``benchmarks.run`` (raw and hand loops, bare
Lightning, the default stack) in fp32 and bf16-mixed, eager and compiled. The table is
rewritten after every part, so a run stopped early keeps what it measured; a part that would
start after ``--budget`` seconds is listed as skipped.

    python -m benchmarks.gpu                            # a GPU machine: benchmarks/gpu.md
    python -m benchmarks.gpu --dry-run --out /tmp/gpu   # the CPU, tiny, in well under a minute
"""

from __future__ import annotations

import argparse
import platform
import struct
import sys
import tempfile
import time
from pathlib import Path

import lightning
import torch

from benchmarks import run
from benchmarks.recipes import train_cli
from experiments.config import CONF_DIR

REPO = Path(__file__).resolve().parents[1]
# recipe -> the torchvision folder under data/ it reads, its target; no config or data: not run
RECIPES = {"speedrun_mnist": ("MNIST/raw", "val/acc>=0.99")}
RECIPES["speedrun_fashion_mnist"] = ("FashionMNIST/raw", "val/acc>=0.92")
RECIPES["speedrun_cifar10"] = ("cifar-10-batches-py", "val/acc>=0.94")
# (precision, compile): eager first, as compiling is the slow part
SETTINGS = [("32-true", False), ("bf16-mixed", False), ("32-true", True), ("bf16-mixed", True)]
# case -> model, sample shape, samples, epochs, batch (run.case)
CASES = {"MLP b64 (overhead-bound)": ("mlp", "1,8,8", 8000, 3, 64)}
CASES["CNN b64"] = ("cnn", "3,32,32", 6000, 3, 64)
CASES["ResNet-18 b128"] = ("resnet18", "3,32,32", 6000, 3, 128)
TINY = {"MLP b64 (overhead-bound)": ("mlp", "1,8,8", 256, 2, 64)}  # the same code path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    tiny = "the CPU, tiny data and sizes, one seed, no compile: checks that it runs"
    p.add_argument("--dry-run", action="store_true", help=tiny)
    p.add_argument("--out", type=Path, help="folder of gpu.md (default benchmarks/)")
    p.add_argument("--seeds", type=int, help="seeds a recipe (default 3; --dry-run 1)")
    p.add_argument("--blocks", type=int, default=1, help="repeats of each step case")
    p.add_argument("--budget", type=float, default=360, help="start nothing after this (s)")
    p.add_argument("--data-dir", type=Path, default=REPO / "data", help="the recipes' data")
    args = p.parse_args(argv)
    args.seeds = args.seeds or (1 if args.dry_run else 3)
    if args.out is None:
        if args.dry_run:  # the committed table holds GPU figures only
            p.error("--dry-run needs --out (it must not overwrite benchmarks/gpu.md)")
        args.out = REPO / "benchmarks"
    if not args.dry_run and not torch.cuda.is_available():
        p.error("no CUDA GPU is visible; --dry-run checks the script on the CPU")
    return args


def fake_torchvision(root: Path, n: int = 512) -> None:
    """Tiny MNIST-format sets (28x28, class-dependent brightness, so there is something to
    learn) for every MNIST-format recipe: the dry run's data."""
    for folder, _ in RECIPES.values():
        if not folder.endswith("/raw"):
            continue
        raw = root / folder
        raw.mkdir(parents=True, exist_ok=True)
        for split, size in (("train", n), ("t10k", n // 4)):
            y = torch.arange(size) % 10
            x = torch.rand(size, 28, 28, generator=torch.Generator().manual_seed(size)) * 60
            x = (x + y.view(-1, 1, 1) * 19).to(torch.uint8)
            (raw / f"{split}-images-idx3-ubyte").write_bytes(
                struct.pack(">IIII", 2051, size, 28, 28) + x.numpy().tobytes()
            )
            labels = y.to(torch.uint8).numpy().tobytes()
            (raw / f"{split}-labels-idx1-ubyte").write_bytes(
                struct.pack(">II", 2049, size) + labels
            )


def recipe_row(name: str, args, work: Path, over_budget) -> tuple[list, bool]:
    """One recipe over seeds: reached k/n, time to target from launch and from the first
    step, test accuracy; or why it was not run. Also whether a run failed."""
    folder, target = RECIPES[name]
    data = work / "data" if args.dry_run else args.data_dir
    if not (CONF_DIR / "experiment" / f"{name}.yaml").is_file():
        return [name, target, f"not run: no conf/experiment/{name}.yaml"], False
    if not (data / folder).is_dir():
        return [name, target, f"not run: {data / folder} not found"], False
    if args.dry_run:  # a target that is reached, so the time-to-target path runs too
        target, device = "val/acc>=0.0", ["trainer=cpu", "data.num_workers=0"]
        device.append("trainer.max_epochs=2")
    else:
        device = ["trainer=gpu_fast"]
    hit, first, acc, wall = run.Stats(), run.Stats(), run.Stats(), run.Stats()
    errors, failed = [], False
    for seed in range(args.seeds):
        if over_budget():
            errors.append(f"seed {seed} on: over the budget")
            break
        over = [f"experiment={name}", f"seed={seed}", f"target='{target}'", *device]
        over += [f"paths.data_dir={data}", "logger=csv"]
        metrics, s = train_cli(over, work / f"{name}-{seed}", run.child_env(args.threads), 300)
        if "error" in metrics:
            errors.append(f"seed {seed}: {metrics['error'].splitlines()[0]}")
            failed = True
            print(metrics["error"], file=sys.stderr)
            continue
        acc.append(metrics["test/acc"])
        wall.append(s)
        if metrics.get("time_to_target/reached"):
            hit.append(metrics["time_to_target/from_launch_s"])
            first.append(metrics["time_to_target/from_first_step_s"])
        print(f"  {name} seed {seed}: test/acc {acc[-1]:.4f}, to target {hit[-1:]} s", flush=True)
    reached = f"{len(hit)}/{len(acc)}" + "".join(f"; {e}" for e in errors)
    return [name, target, reached, hit.fmt(), first.fmt(), wall.fmt(), acc.fmt(digits=4)], failed


def step_rows(precision: str, compile_: bool, args, work: Path, over_budget) -> list[list]:
    """One setting's step cases: ms per step of each variant, and the pairs' ratios."""
    gpu = ["trainer.accelerator=gpu", "data.pin_memory=true"]  # pinned: host-to-GPU copies
    device = ["trainer.accelerator=cpu"] if args.dry_run else gpu
    setting, rows = f"{precision}, {'compiled' if compile_ else 'eager'}", []
    for i, (name, spec) in enumerate((TINY if args.dry_run else CASES).items()):
        if over_budget():
            rows.append([setting, f"{name}: skipped, past the {args.budget:.0f} s budget"])
            continue
        over = run.case(*spec, *device, f"trainer.precision={precision}", f"compile={compile_}")
        tag = f"{precision}-{compile_}-{i}"
        variants = {
            v: lambda b, v=v, t=tag, o=over: run.step_time(v, work, f"{t}-{v[:3]}-{b}", o)
            for v in run.VARIANTS
        }
        st = run.blocks(args.blocks, variants, f"{setting} {name}")
        raw, hand, bare, ours = (st[v] for v in run.VARIANTS)
        times = [s.fmt(1e3, 3) for s in (raw, hand, bare, ours)]
        ratios = [run.ratio(ours, hand).fmt(1, 3), run.ratio(ours, bare).fmt(1, 3)]
        rows.append([setting, name, *times, *ratios])
    return rows


def write(args, device: str, recipes: list, steps: list, elapsed: float) -> Path:
    mode = "--dry-run: the CPU, tiny sizes; not GPU figures" if args.dry_run else "one GPU"
    lines = [
        "# The GPU check (`python -m benchmarks.gpu`)", "",
        f"{time.strftime('%Y-%m-%d')}, {mode}, {elapsed / 60:.1f} min; docs/performance.md "
        "explains the columns. Cells: median (min–max) over seeds or blocks.",
    ]  # fmt: skip
    versions = f"{platform.python_version()}, {torch.__version__}, {lightning.__version__}"
    lines += run.table(["device", "python, torch, lightning"], [[device, versions]])
    lines.append(f"## Speedrun recipes: `trainer={'cpu' if args.dry_run else 'gpu_fast'}`, "
                 f"{args.seeds} seed(s), a fresh process each")  # fmt: skip
    head = ["recipe", "target", "reached", "to target from launch s", "from first step s"]
    lines += run.table([*head, "whole run s", "test/acc"], recipes)
    lines.append("## Step time (ms a step, in-memory data; docs/performance.md, table 1)")
    head = ["setting", "case", *run.VARIANTS, "ours / hand loop", "ours / bare Lightning"]
    lines += run.table([h.replace("default stack", "ours") for h in head], steps)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu.md").write_text("\n".join(lines))
    return args.out / "gpu.md"


def main(argv=None) -> None:
    args = parse_args(argv)
    args.threads = 1 if args.dry_run else 4
    torch.set_num_threads(args.threads)
    start = time.perf_counter()

    def over_budget() -> bool:
        return time.perf_counter() - start > args.budget

    if args.dry_run:
        device = f"{platform.machine()} CPU (dry run)"
    else:
        cuda = f"CUDA {torch.version.cuda}"
        device = f"{torch.cuda.get_device_name(0)}, {cuda}, {torch.cuda.device_count()} visible"
    recipes, steps, failed = [], [], False
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        if args.dry_run:
            fake_torchvision(work / "data")
        for name in RECIPES:
            print(f"[{name}] ({time.perf_counter() - start:.0f} s)", flush=True)
            row, bad = recipe_row(name, args, work, over_budget)
            recipes.append(row)
            failed |= bad
            write(args, device, recipes, steps, time.perf_counter() - start)
        for precision, compile_ in SETTINGS:
            setting = f"{precision}, {'compiled' if compile_ else 'eager'}"
            if compile_ and args.dry_run:  # inductor's code generation takes minutes on a CPU
                steps.append([setting, "skipped in --dry-run"])
            else:
                print(f"[{precision} compile={compile_}] ({time.perf_counter() - start:.0f} s)")
                steps += step_rows(precision, compile_, args, work, over_budget)
            out = write(args, device, recipes, steps, time.perf_counter() - start)
    print(f"wrote {out} in {time.perf_counter() - start:.0f} s")
    if failed:  # exit 1, also when run in-process (a test): its stderr is above
        sys.exit("error: a recipe run failed; gpu.md names it")


if __name__ == "__main__":
    main()
