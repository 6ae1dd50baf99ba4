"""``make bench``: the framework against a hand-written loop and bare Lightning, sections
step, startup and data (docs/performance.md explains every table). Each runs in blocks,
every variant once per block in a rotating order, so a noisy machine slows all alike; cells
are the median (min–max) over blocks, ratios are taken within a block. In-process runs
compose ``conf/train.yaml`` with the overrides a command line would pass (:func:`compose`).

    python -m benchmarks.run --quick --out /tmp/bench     # seconds: checks it end to end
    python -m benchmarks.run --only step,startup --blocks 5     # outputs/bench/results.md
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hydra
import lightning
import torch
from hydra.utils import instantiate
from torch.utils.data import DataLoader

from benchmarks.baselines import BareModule, StepTimer, bare_trainer, hand_loop, in_memory
from experiments.config import CONF_DIR
from experiments.data import CsvImageDataset, export_digits
from experiments.data.loaders import StoreLoader
from experiments.data.samplers import EpochShuffleSampler
from experiments.data.store import TensorStore
from experiments.training.pipeline import train

REPO = Path(__file__).resolve().parents[1]
SECTIONS = ("step", "startup", "data")
VARIANTS = ("raw loop", "hand loop", "bare Lightning", "default stack")
TIMER = "+callbacks.bench_timer._target_=benchmarks.baselines.StepTimer"
DATA = "data.dataset={{_target_:benchmarks.baselines.tensor_sets,_partial_:true,n:{},shape:[{}]}}"


class Stats(list):
    """Repeated measurements of one quantity, one per block."""

    @property
    def median(self) -> float:
        return statistics.median(self) if self else float("nan")

    def fmt(self, scale: float = 1.0, digits: int = 2) -> str:
        if not self:
            return "n/a"
        m, lo, hi = (v * scale for v in (self.median, min(self), max(self)))
        if len(self) == 1:
            return f"{m:.{digits}f}"
        return f"{m:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def ratio(a: list, b: list) -> Stats:
    """Per-block ratios: the pair ran back to back, so the ratio is the fair number."""
    return Stats(x / y for x, y in zip(a, b, strict=False) if x and y)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny setting: checks it runs end to end")
    p.add_argument("--out", help="folder of results.md (default outputs/bench)")
    p.add_argument("--update-docs", action="store_true", help="write benchmarks/results.md")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of {SECTIONS}")
    p.add_argument("--blocks", type=int, help="repeats (default 3; --quick 1)")
    p.add_argument("--threads", type=int, default=1, help="torch/OMP threads of every variant")
    p.add_argument("overrides", nargs="*", help="for every step case, e.g. compile=true")
    args = p.parse_args(argv)
    if args.out is None:  # the committed tables change only when asked to
        args.out = str(REPO / ("benchmarks" if args.update_docs else "outputs/bench"))
    args.only = args.only.split(",")
    if set(args.only) - set(SECTIONS):
        p.error(f"--only: unknown {set(args.only) - set(SECTIONS)}; choose from {SECTIONS}")
    return args


def compose(work: Path, tag: str, overrides: list[str]):
    """``train.yaml`` composed as ``python -m experiments.train <overrides>`` composes it, with
    data and outputs under ``work`` and the paths Hydra fills in at run time given."""
    paths = [f"paths.data_dir={work / 'data'}", f"paths.log_dir={work / 'outputs'}"]
    paths += [f"paths.output_dir={work / tag}", "paths.sweep_group=null", "paths.job_name=null"]
    with hydra.initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra.compose("train", overrides=[*paths, *overrides])


def child_env(threads: int) -> dict:
    """A subprocess's environment: the repo importable, the same thread count, and no
    ``PL_*`` variables that a parent which ran Lightning would hand down."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PL_")}
    path = [str(REPO), str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env |= {"PYTHONPATH": os.pathsep.join(path), "HYDRA_FULL_ERROR": ""}
    return env | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def cli(cmd: list[str], work: Path, env: dict, ok: bool = True) -> float:
    """Wall seconds of ``python <cmd>``; raises when its exit status is not as expected."""
    t = time.time()
    res = subprocess.run([sys.executable, *cmd], cwd=work, env=env, capture_output=True, text=True)
    if (res.returncode == 0) != ok:
        raise RuntimeError(f"python {' '.join(cmd)}: exit {res.returncode}\n{res.stderr[-3000:]}")
    return time.time() - t


def blocks(n: int, variants: dict, what: str) -> dict[str, Stats]:
    """Every variant (``block -> value``) once per block, the order rotating."""
    out, names = {name: Stats() for name in variants}, list(variants)
    for b in range(n):
        for name in names[b % len(names) :] + names[: b % len(names)]:
            out[name].append(variants[name](b))
        shown = (f"{k} {v[-1]:.4g}" if isinstance(v[-1], float) else f"{k} {v[-1]['hit']}"
                 for k, v in out.items())  # fmt: skip
        print(f"  {what} {b + 1}/{n}: " + ", ".join(shown), flush=True)
    return out


def case(model: str, shape: str, n: int, epochs: int, batch: int, *extra: str) -> list[str]:
    """The overrides of one step case: ``n`` seeded in-memory samples of ``shape``, the step
    timer, no test; on the CPU unless ``extra`` says otherwise (later overrides win)."""
    over = [f"model={model}", DATA.format(n, shape), f"data.batch_size={batch}", TIMER]
    return [*over, f"trainer.max_epochs={epochs}", "test=false", "trainer.accelerator=cpu", *extra]


def step_cases(args) -> dict[str, list[str]]:
    """Case -> overrides (``args.overrides`` last, for every case)."""
    cases = {"CNN b64 (compute-bound)": ("cnn", "3,32,32", 750, 3)}  # ~10 steps an epoch
    cases["MLP b64 (overhead-bound)"] = ("mlp", "1,8,8", 8000, 4)  # ~106, digits-sized
    cases["CNN b64, compile=true"] = ("cnn", "3,32,32", 750, 3, "compile=true")
    if args.quick:  # compile: graph capture only, no code generation (seconds, not a minute)
        cases = {k: (m, s, 300, 2, *x) for k, (m, s, _, _, *x) in cases.items()}
        cases["CNN b64, compile=true"] += ("callbacks.compile.backend=eager",)
    return {k: case(m, s, n, e, 64, *x, *args.overrides) for k, (m, s, n, e, *x) in cases.items()}


def step_time(variant: str, work: Path, tag: str, overrides: list[str]) -> float:
    """Seconds per step of one variant on the data, net and optimizer the overrides compose."""
    cfg = compose(work, tag, overrides)
    if variant == "default stack":
        train(cfg)
        return StepTimer.last.step_s
    torch.manual_seed(0)
    dm = instantiate(cfg.data)
    dm.setup("fit")
    net = instantiate(cfg.model.net, in_shape=dm.input_shape, num_classes=dm.num_classes)
    if cfg.compile:
        net.compile(**{k: v for k, v in cfg.callbacks.compile.items() if k == "backend"})
    if variant != "bare Lightning":
        return hand_loop(net, dm, cfg.trainer, cfg.optimizer, work / tag, variant == "hand loop")
    timer = StepTimer()
    module = BareModule(net, cfg.optimizer.lr, cfg.optimizer.momentum)
    bare_trainer(cfg.trainer, [timer], work / tag).fit(module, datamodule=dm)
    return timer.step_s


def bench_step(args, work: Path) -> dict:
    results = {}
    for i, (case, over) in enumerate(step_cases(args).items()):
        variants = {
            v: lambda b, v=v, i=i, o=over: step_time(v, work, f"step{i}-{v[:3]}-{b}", o)
            for v in VARIANTS
        }
        results[case] = blocks(args.blocks, variants, case)
    return results


def bench_startup(args, work: Path) -> dict:
    data, first, env = export_digits(work / "data" / "digits"), work / "first", child_env(1)
    cmd = ["-m", "experiments.train", f"paths.data_dir={data.parent}"]
    stop = [f"+callbacks.bench_timer.first_step_file={first}"]
    stop += ["+callbacks.bench_timer.exit_after_first=true", f"hydra.run.dir={work / 'first-run'}"]
    bare = ["-m", "benchmarks.baselines", str(data), str(first), str(work)]

    def until_first_step(argv: list[str]) -> float:
        first.unlink(missing_ok=True)
        t0 = time.time()
        cli(argv, work, env)
        return float(first.read_text()) - t0

    return blocks(args.blocks, {
        "train to first step": lambda b: until_first_step([*cmd, TIMER, *stop]),
        "bare Lightning to first step": lambda b: until_first_step(bare),
        "--help": lambda b: cli([*cmd, "--help"], work, env),
        "--cfg job": lambda b: cli([*cmd, "--cfg", "job"], work, env),
        "bad override (data.batch_size=0)": lambda b: cli([*cmd, "data.batch_size=0"], work,
                                                          env, ok=False),
        "unknown option (model=nope)": lambda b: cli([*cmd, "model=nope"], work, env, ok=False),
    }, "start-up")  # fmt: skip


def loader_rate(dataset, workers: int, epochs: int) -> float:
    """Samples/s over ``epochs`` passes after a warm-up pass (caches filled, workers up)."""
    if isinstance(dataset, TensorStore):  # the framework's loader of a stored split
        loader = StoreLoader(dataset, 64, sampler=EpochShuffleSampler(len(dataset)))
    else:
        loader = DataLoader(dataset, 64, True, num_workers=workers, persistent_workers=workers > 0)
    for _ in loader:
        pass
    t, n = time.perf_counter(), 0
    for _ in range(epochs):
        n += sum(len(x) for x, _y in loader)
    return n / (time.perf_counter() - t)


def bench_data(args, work: Path) -> dict:
    root = export_digits(work / "data" / "digits")
    transform = instantiate(compose(work, "data", []).data.train_transform)
    epochs, tensors = 1 if args.quick else 3, in_memory(1797, (1, 8, 8), 0)
    # cache: decoded images kept; cache_samples: the transformed samples kept (the default)
    caches = {"no cache": {}, "cache=decoded": {"cache": True}}
    caches["cache=tensors (default)"] = {"cache": True, "cache_samples": True}
    files = (root / "labels.csv", root / "images")
    variants = {
        f"CsvImageDataset, {name}, workers={w}": lambda b, c=cache, w=w: loader_rate(
            CsvImageDataset(*files, transform=transform, image_mode="L", **c), w, epochs
        )
        for w in ((0,) if args.quick else (0, 1, 2))
        for name, cache in caches.items()
    }
    variants["in-memory tensors, workers=0"] = lambda b: loader_rate(tensors, 0, epochs)
    variants["in-memory tensors, batch-level path (TensorStore), workers=0"] = lambda b: (
        loader_rate(TensorStore(*tensors.tensors), 0, epochs)
    )
    loaders = blocks(args.blocks, variants, "loaders")
    # the default run as the profiling callback measures it, and the same run on in-memory
    # tensors: what the measure reads when loading costs nothing (Lightning's own work
    # between steps counts as data wait too)
    over = ["profile=true", "trainer.max_epochs=2", "test=false", "trainer.accelerator=cpu"]
    over += ["trainer.limit_train_batches=6", "trainer.limit_val_batches=1"] if args.quick else []

    def data_wait(tag: str, extra: list[str]) -> float:
        cfg = compose(work, tag, [*over, *extra])
        train(cfg)
        summary = Path(cfg.paths.output_dir) / "profile" / "summary.json"
        return json.loads(summary.read_text())["data_wait_frac"]

    wait = {"default": lambda b: data_wait(f"wait-{b}", [])}
    wait["floor"] = lambda b: data_wait(f"floor-{b}", [DATA.format(1797, "1,8,8")])
    return {"loaders": loaders, "wait": blocks(args.blocks, wait, "data wait")}


def table(head: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = [[*row, *[""] * (len(head) - len(row))] for row in rows]  # short rows padded
    return ["", *lines, *("| " + " | ".join(map(str, row)) + " |" for row in rows), ""]


def report(results: dict, args, elapsed: float) -> tuple[list[str], list]:
    """The lines of ``results.md`` and its targets: ``(what, measured, Stats, upper bound)``."""
    targets = []
    lines = ["# Benchmarks: the framework against a hand-written loop", ""]
    lines.append(
        f"`make bench` ({'--quick, ' if args.quick else ''}{args.blocks} blocks, {elapsed / 60:.1f}"
        " min). Cells: **median** (min–max) over blocks; ratios are taken per block. Each "
        "column is explained in docs/performance.md. Timings come from a shared machine."
    )
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    versions = f"{platform.python_version()}, {torch.__version__}, {lightning.__version__}"
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    machine = f"{platform.machine()}, {os.cpu_count()} cores, GPU {gpu}, load at the end {load}"
    lines += table(["machine", "python, torch, lightning"], [[machine, versions]])
    if "step" in results:
        rows = []
        for case, st in results["step"].items():
            raw, hand, bare, stack = (st[v] for v in VARIANTS)
            over = Stats(s - b for s, b in zip(stack, bare, strict=False))
            net = Stats(o - (h - r) for o, h, r in zip(over, hand, raw, strict=False))
            rows.append([case, *(s.fmt(1e3) for s in (raw, hand, bare, stack))])
            rows[-1] += [ratio(stack, hand).fmt(1, 3), ratio(bare, raw).fmt(1, 3)]
            rows[-1] += [over.fmt(1e6, 0), net.fmt(1e6, 0)]
            if case.startswith("CNN b64 ("):
                what = "compute-bound: default stack ≤ 3% slower than the hand loop"
                targets.append((what, f"stack/hand = {rows[-1][5]}", ratio(stack, hand), 1.03))
            elif case.startswith("MLP"):
                what = "overhead-bound: ≤ 150 µs/step above bare Lightning, net of the hand loop's"
                measured = f"net {rows[-1][-1]} µs (stack − bare = {rows[-1][-2]} µs)"
                targets.append((what + " own work", measured, net, 1.5e-4))
        head = ["case", *(f"{v} ms" for v in VARIANTS), "stack / hand", "bare / raw"]
        lines += ["## 1. Step time (in-memory data, per step after the first epoch)"]
        lines += table([*head, "stack − bare µs", "stack − bare − (hand − raw) µs"], rows)
    if "startup" in results:
        st = results["startup"]
        first = ratio(st["train to first step"], st["bare Lightning to first step"])
        rows = [[k, v.fmt()] for k, v in st.items()]
        rows.append(["ratio train / bare Lightning (first step)", first.fmt(1, 3)])
        lines += ["## 2. Start-up (fresh processes, wall seconds)", *table(["command", "s"], rows)]
        what = "time to first step ≤ 1.1× the bare Lightning script"
        targets.append((what, f"{first.fmt(1, 3)}×", first, 1.1))
        # a wrong value (data.batch_size=0) is caught once the classes are imported
        fast = {k: v for k, v in st.items() if k.startswith(("--", "unknown"))}
        measured = ", ".join(f"{k} {v.median:.2f} s" for k, v in fast.items())
        worst = max(fast.values(), key=lambda s: s.median)
        targets.append(("`--help`, `--cfg job`, unknown keys ≤ 1 s", measured, worst, 1.0))
    if "data" in results:
        wait = results["data"]["wait"]
        rows = [[k, v.fmt(1, 0)] for k, v in results["data"]["loaders"].items()]
        lines += ["## 3. Data (the bundled digits, 1797 8×8 PNGs, batch 64)"]
        lines += table(["loader", "samples/s"], rows)
        measured = f"{wait['default'].fmt(100, 1)} %"
        lines.append(
            f"Data-wait share of step time in the default run (`profile=true`, epoch 2): "
            f"**{measured}**; on in-memory tensors (a floor): **{wait['floor'].fmt(100, 1)} %**.\n"
        )
        what = "data wait ≤ 3% of step time on the default pipeline"
        targets.append((what, measured, wait["default"], 0.03))
    rows = [[w, m, "yes" if s.median <= b else "no"] for w, m, s, b in targets]
    lines += ["", "## Targets (why one is missed: docs/performance.md)"]
    return [*lines, *table(["target", "measured", "met"], rows)], targets


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.blocks = args.blocks or (1 if args.quick else 3)
    # Lightning and the framework log at INFO; the bench prints its own progress
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    for name in ("lightning", "experiments"):
        logging.getLogger(name).setLevel(logging.WARNING)
    start, results = time.perf_counter(), {}
    runs = {"step": bench_step, "startup": bench_startup, "data": bench_data}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for section in (s for s in SECTIONS if s in args.only):
            print(f"[{section}] ({time.perf_counter() - start:.0f} s)", flush=True)
            results[section] = runs[section](args, Path(tmp))
    lines, targets = report(results, args, time.perf_counter() - start)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.md").write_text("\n".join(lines))
    print(f"wrote {Path(args.out) / 'results.md'} in {time.perf_counter() - start:.0f} s")
    for what, measured, stats, bound in targets:
        print(f"  {'MET ' if stats.median <= bound else 'MISS'} {what}: {measured}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
