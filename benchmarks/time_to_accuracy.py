"""Time to accuracy: wall seconds from launching a training process until its validation
accuracy first reaches a target, for the framework against a hand-written loop.

Two variants of the same ``experiment=<recipe>``, each a fresh subprocess:

- *framework*: ``python -m experiments.train experiment=<recipe> logger=csv`` with the
  default callbacks (what users run), in a temporary run dir;
- *hand loop*: ``python -m benchmarks.tta_handloop``, plain PyTorch doing the same recipe
  (same data files, split, transforms, augmentation, net class, seed, optimizer, per-step
  schedule, label smoothing, EMA), read from the very config the framework composes.

Both are observed the same way from outside: the parent polls the run's metrics CSV (the
framework's CSV logger, ``<run_dir>/csv/metrics.csv``; the hand loop's own
``metrics.csv``, flushed after every validation) every ``--poll`` seconds and stamps each
new ``val/acc`` row with the seconds since it launched the process. At the first row at or
above the target (or ``--after`` epochs later: digits 2, for the per-epoch column) it
sends SIGTERM and waits for the exit (not timed). Both processes get
the same ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` (the framework has no thread setting).

Variants run as interleaved blocks (both once per block, the order alternating), so a
noisy, shared machine slows both alike. Reported per recipe: time to target (median and
min-max over blocks), the epoch each run reached it at, the end of epoch 1 and seconds per
later epoch (start-up versus per-epoch cost), and the framework / hand-loop ratio: the
median of the per-block ratios with their range, and a 95% interval (t on the log ratios,
i.e. for their geometric mean). A second ratio compares both at the same epoch (the
earlier of the two epochs reached in that block), which leaves out the luck of the
trajectory and keeps only the overhead.

Examples:
    python -m benchmarks.time_to_accuracy --quick          # digits, 1 block (~30 s)
    python -m benchmarks.time_to_accuracy --recipes digits --repeats 2
    python -m benchmarks.time_to_accuracy                  # digits x5 and MNIST x3 (long)
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import Stats

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("framework", "hand loop")


@dataclass(frozen=True)
class Recipe:
    """A recipe of ``conf/experiment`` with its accuracy target and default repeats."""

    target: float
    repeats: int
    after: int  # epochs watched past the target (the per-epoch column), 0 for long epochs
    needs: str | None = None  # folder under the data dir it reads; None: exported on demand


RECIPES = {
    "digits": Recipe(target=0.97, repeats=5, after=2),
    "mnist": Recipe(target=0.99, repeats=3, after=0, needs="MNIST/raw"),
}


# --- the recipe, from the composed config ----------------------------------------------


def compose_recipe(recipe: str, data_dir: Path):
    """The config ``python -m experiments.train experiment=<recipe>`` trains with."""
    from hydra import compose, initialize_config_dir

    from experiments.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=[f"experiment={recipe}", f"paths.data_dir={data_dir}"])


def _plain(node):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True) if node is not None else None


def _name(node: dict) -> str:
    return str(node["_target_"]).rsplit(".", 1)[-1]


def _transform(node: dict) -> list | None:
    """``[mean, std]`` of the per-sample transform (ToImage, ToDtype(scale) [, Normalize])."""
    steps = node["transforms"] if _name(node) == "Compose" else [node]
    names = [_name(s) for s in steps]
    if names[:2] != ["ToImage", "ToDtype"] or names[2:] not in ([], ["Normalize"]):
        raise ValueError(f"transform {names} (the hand loop does ToImage, ToDtype[, Normalize])")
    if not steps[1].get("scale"):
        raise ValueError("ToDtype without scale=true")
    return [list(steps[2]["mean"]), list(steps[2]["std"])] if len(steps) == 3 else None


def _shift(node: dict | None) -> int | None:
    """Padding of the recipe's random-shift augmentation; None without augmentation."""
    if node is None:
        return None
    if _name(node) != "RandomShift" or node.get("padding_mode", "constant") != "constant":
        raise ValueError(f"augmentation {_name(node)} (the hand loop does RandomShift only)")
    return int(node.get("padding", 4))


def _schedule(node: dict | None) -> dict | None:
    if node is None:
        return None
    kind = _name(node)
    if kind == "warmup_cosine":
        keys = {"warmup_epochs": 1.0, "min_lr_ratio": 0.0}
    elif kind == "one_cycle":
        keys = {"warmup_epochs": 0.3, "div_factor": 25.0, "final_div_factor": 1e4}
    else:
        raise ValueError(f"scheduler {kind} (the hand loop does warmup_cosine and one_cycle)")
    return {"kind": kind, **{k: float(node.get(k, v)) for k, v in keys.items()}}


def _unsupported(cfg) -> list[str]:
    """Options of the config that the hand loop does not reproduce."""
    from omegaconf import OmegaConf

    data, model, trainer = cfg.data, cfg.model, cfg.trainer
    checks = {
        "cv.folds (cross-validation)": not OmegaConf.select(cfg, "cv.folds")
        and not data.get("folds"),
        f"data.dataset={data.dataset}": data.dataset in ("digits", "mnist"),
        "data.mixup_alpha / cutmix_alpha": not data.get("mixup_alpha")
        and not data.get("cutmix_alpha"),
        f"data.sampler={data.get('sampler')}": data.get("sampler", "shuffle") == "shuffle",
        "data.mean=auto": data.get("mean") != "auto",
        "a separate eval_transform": _plain(data.train_transform) == _plain(data.eval_transform),
        f"model.loss={model.get('loss')}": model.get("loss", "cross_entropy")
        in ("cross_entropy", "auto"),
        "model.class_weights": model.get("class_weights") is None,
        "model.freeze / fine-tuning": not model.get("freeze")
        and not model.get("freeze_backbone_epochs")
        and model.get("init_from") is None
        and float(model.get("backbone_lr_scale", 1.0)) == 1.0,
        "model.channels_last": not model.get("channels_last"),
        f"trainer.precision={trainer.precision}": str(trainer.precision) in ("32", "32-true"),
        "gradient accumulation / clipping": int(trainer.accumulate_grad_batches) == 1
        and trainer.get("gradient_clip_val") is None,
        "validation less than once per epoch, or limited batches": int(
            trainer.check_val_every_n_epoch
        )
        == 1
        and all(trainer.get(f"limit_{s}_batches") is None for s in ("train", "val")),
    }
    return [what for what, ok in checks.items() if not ok]


def recipe_spec(cfg) -> dict:
    """What ``benchmarks.tta_handloop`` needs to train the recipe, from its config.

    Raises:
        ValueError: the recipe uses something the hand loop does not do (named).
    """
    bad = _unsupported(cfg)
    if bad:
        raise ValueError(f"the hand loop does not reproduce: {', '.join(bad)}")
    data, model = cfg.data, cfg.model
    optimizer = _plain(cfg.optimizer)
    name = _name(optimizer)
    for key in ("_target_", "_partial_"):
        optimizer.pop(key, None)
    batch_stats = data.get("mean") is not None
    return {
        "seed": int(cfg.seed),
        "max_epochs": int(cfg.trainer.max_epochs),
        "data": {
            "dataset": str(data.dataset),
            "root": str(data.root),
            "batch_size": int(data.batch_size),
            "num_workers": int(data.get("num_workers", 0)),
            "persistent_workers": bool(data.get("persistent_workers", False)),
            "val_fraction": float(data.get("val_fraction", 0.1)),
            "test_fraction": float(data.get("test_fraction", 0.1)),
            "split_seed": int(data.get("split_seed", 0)),
            "stratified": data.get("split", "random") == "stratified",
            "normalize": _transform(_plain(data.train_transform)),
            "shift": _shift(_plain(data.get("augment"))),
            "batch_mean": list(data.mean) if batch_stats else None,
            "batch_std": list(data.std) if batch_stats else None,
        },
        "net": _plain(model.net),
        "optimizer": {"name": name, **optimizer},
        "schedule": _schedule(_plain(cfg.get("scheduler"))),
        "label_smoothing": float(model.get("label_smoothing", 0.0)),
        "ema_decay": None if model.get("ema_decay") is None else float(model.ema_decay),
    }


# --- one run, watched from outside -----------------------------------------------------


@dataclass
class Run:
    """One training process: every validation row seen, and how it ended."""

    variant: str
    seed: int
    target: float
    # (epoch, 1-based; val/acc; seconds from launch to the row's appearance)
    epochs: list[tuple[int, float, float]] = field(default_factory=list)
    status: str = "running"  # reached | missed (max_epochs done) | failed | timeout
    rc: int | None = None
    log: Path | None = None

    @property
    def hit(self) -> tuple[int, float] | None:
        """``(epoch, seconds)`` of the first validation at or above the target."""
        return next(((e, t) for e, acc, t in self.epochs if acc >= self.target), None)

    def seconds_at(self, epoch: int) -> float | None:
        return next((t for e, _, t in self.epochs if e == epoch), None)

    def per_epoch(self) -> float | None:
        """Seconds per epoch after the first, over the epochs seen."""
        if len(self.epochs) < 2:
            return None
        (e0, _, t0), (e1, _, t1) = self.epochs[0], self.epochs[-1]
        return (t1 - t0) / (e1 - e0)

    def describe(self) -> str:
        if self.hit:
            return f"{self.variant} {self.hit[1]:.1f} s (epoch {self.hit[0]})"
        best = max((acc for _, acc, _ in self.epochs), default=float("nan"))
        return f"{self.variant} {self.status.upper()} (rc={self.rc}, best val/acc {best:.4f})"


def val_rows(path: Path) -> list[tuple[int, float]]:
    """``(epoch, val/acc)`` of the complete rows of a metrics CSV that hold ``val/acc``."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    text = text[: text.rfind("\n") + 1]  # a row being written is read on the next poll
    rows = []
    for rec in csv.DictReader(io.StringIO(text)):
        try:
            rows.append((int(float(rec["epoch"])), float(rec["val/acc"])))
        except (KeyError, TypeError, ValueError):  # rows of other metrics, a torn header
            continue
    return rows


def _signature(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


def stop(proc: subprocess.Popen, grace: float = 120.0) -> int:
    """SIGTERM (the framework checkpoints and exits), SIGKILL after ``grace`` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def watch(
    cmd: list[str], env: dict, metrics: Path, run: Run, max_epochs: int, after: int, opts
) -> Run:
    """Launch ``cmd``; stamp each new validation row of ``metrics``; stop ``after`` epochs
    past the target, after the last epoch, when the process ends or after
    ``opts.timeout`` seconds."""
    seen: set[int] = set()
    last = None
    with open(run.log, "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                time.sleep(opts.poll)
                now = time.perf_counter() - t0
                proc.poll()  # before reading: once it has ended, this read is the last
                signature = _signature(metrics)
                if signature != last:
                    last = signature
                    for epoch, acc in val_rows(metrics):
                        if epoch not in seen:
                            seen.add(epoch)
                            run.epochs.append((epoch + 1, acc, now))
                run.status = _status(run, max_epochs, after, proc.returncode, now > opts.timeout)
                if run.status != "running":
                    break
        finally:
            run.rc = stop(proc)
    return run


def _status(run: Run, max_epochs: int, after: int, rc: int | None, late: bool) -> str:
    """How the watch stands: ``rc`` is None while the process runs, ``late`` past timeout."""
    last = run.epochs[-1][0] if run.epochs else 0
    if run.hit and (last >= run.hit[0] + after or last >= max_epochs or rc is not None or late):
        return "reached"
    if last >= max_epochs:
        return "missed"
    if rc is not None:
        return "missed" if rc == 0 else "failed"
    return "timeout" if late else "running"


def child_env(threads: int) -> dict:
    """The environment of both variants: same thread counts, the repo importable, and no
    ``PL_*`` variables a parent that ran Lightning itself would hand down."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PL_")}
    parts = [str(REPO), str(REPO / "src"), os.environ.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
    if threads > 0:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def launch(variant: str, recipe: str, tag: str, seed: int, spec_file: Path, work: Path, opts):
    """``(command, metrics file)`` of one variant."""
    run_dir = work / "runs" / tag
    if variant == "framework":
        accelerator = {"auto": "auto", "cpu": "cpu", "cuda": "gpu"}[opts.device]
        cmd = [
            *(sys.executable, "-m", "experiments.train", f"experiment={recipe}", f"seed={seed}"),
            *(f"paths.data_dir={opts.data_dir}", f"paths.log_dir={work / 'outputs'}"),
            *(f"hydra.run.dir={run_dir}", "logger=csv", f"trainer.accelerator={accelerator}"),
        ]
        return cmd, run_dir / "csv" / "metrics.csv"
    cmd = [
        *(sys.executable, "-m", "benchmarks.tta_handloop", f"--spec={spec_file}"),
        *(f"--out={run_dir}", f"--seed={seed}", f"--device={opts.device}"),
    ]
    return cmd, run_dir / "metrics.csv"


# --- the benchmark ---------------------------------------------------------------------


@dataclass
class RecipeResult:
    """Every run of one recipe, by variant, in block order."""

    recipe: str
    target: float
    max_epochs: int
    runs: dict[str, list[Run]]
    skipped: str | None = None
    import_s: list[float] = field(default_factory=list)  # `import lightning` alone, per block


def bench_recipe(recipe: str, blocks: int, work: Path, opts, log) -> RecipeResult:
    """Interleaved blocks of both variants on one recipe."""
    target = opts.target if opts.target is not None else RECIPES[recipe].target
    needs = RECIPES[recipe].needs
    after = opts.after if opts.after is not None else RECIPES[recipe].after
    if needs and not (Path(opts.data_dir) / needs).exists():
        reason = f"{Path(opts.data_dir) / needs} not found (scripts/get_data.py)"
        log(f"  {recipe}: skipped, {reason}")
        return RecipeResult(recipe, target, 0, {v: [] for v in VARIANTS}, skipped=reason)
    cfg = compose_recipe(recipe, Path(opts.data_dir))
    spec = recipe_spec(cfg)
    if spec["data"]["dataset"] == "digits":  # both read the export; make it before timing
        from experiments.data.datasets import export_digits

        export_digits(spec["data"]["root"])
    spec_file = work / f"{recipe}-spec.json"
    spec_file.write_text(json.dumps(spec, indent=1))
    env = child_env(opts.threads)
    runs: dict[str, list[Run]] = {v: [] for v in VARIANTS}
    import_s = []
    for block in range(blocks):
        # the floor of any Lightning-based run: a process that only imports Lightning (with
        # the collector paused during the import, as the framework runs it)
        t = time.time()
        code = "import gc; gc.disable(); import lightning"
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        import_s.append(time.time() - t)
        seed = spec["seed"] + (block if opts.vary_seed else 0)
        for variant in VARIANTS[block % 2 :] + VARIANTS[: block % 2]:
            tag = f"{recipe}-{variant.replace(' ', '_')}-{block}"
            cmd, metrics = launch(variant, recipe, tag, seed, spec_file, work, opts)
            run = Run(variant, seed, target, log=work / f"{tag}.log")
            watch(cmd, env, metrics, run, spec["max_epochs"], after, opts)
            if run.status in ("failed", "timeout"):
                tail = run.log.read_text()[-2000:]
                log(f"  {recipe} {variant}: {run.status} (rc={run.rc}); log tail:\n{tail}")
            runs[variant].append(run)
        log(
            f"  {recipe} block {block + 1}/{blocks} (seed {seed}): "
            + ", ".join(runs[v][-1].describe() for v in VARIANTS)
        )
    return RecipeResult(recipe, target, spec["max_epochs"], runs, import_s=import_s)


def bench(work: Path, recipes: list[str], repeats: dict[str, int], opts, log) -> dict:
    """Every recipe in turn; ``{recipe: RecipeResult}``."""
    work.mkdir(parents=True, exist_ok=True)
    return {r: bench_recipe(r, repeats[r], work, opts, log) for r in recipes}


# --- report ----------------------------------------------------------------------------


def paired_ratios(result: RecipeResult, same_epoch: bool = False) -> list[float]:
    """Framework / hand loop per block where both reached the target; with ``same_epoch``,
    both at the earlier of the two epochs reached (pure overhead, no trajectory luck)."""
    ratios = []
    for fw, hand in zip(*(result.runs[v] for v in VARIANTS), strict=True):
        if not (fw.hit and hand.hit):
            continue
        if same_epoch:
            epoch = min(fw.hit[0], hand.hit[0])
            a, b = fw.seconds_at(epoch), hand.seconds_at(epoch)
        else:
            a, b = fw.hit[1], hand.hit[1]
        if a and b:
            ratios.append(a / b)
    return ratios


def ratio_text(ratios: list[float]) -> str:
    """Median (min-max) of paired ratios and the 95% t interval of their geometric mean."""
    if not ratios:
        return "n/a (no block where both reached the target)"
    text = f"**{Stats(ratios).fmt(1, 3)}**"
    if len(ratios) < 2:
        return text + " (one block: no interval)"
    from experiments.analysis.stats import t_quantile_975

    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    half = t_quantile_975(len(logs) - 1) * sd / math.sqrt(len(logs))
    return (
        f"{text}; geometric mean {math.exp(mean):.3f}, 95% CI "
        f"{math.exp(mean - half):.3f}–{math.exp(mean + half):.3f} (n={len(ratios)})"
    )


def _variant_row(variant: str, runs: list[Run]) -> str:
    hits = [r.hit for r in runs if r.hit]
    tta = Stats([t for _, t in hits])
    first = Stats([r.epochs[0][2] for r in runs if r.epochs])
    per = Stats([p for r in runs if (p := r.per_epoch()) is not None])
    start = Stats(
        [r.epochs[0][2] - p for r in runs if r.epochs and (p := r.per_epoch()) is not None]
    )
    epochs = ", ".join(str(r.hit[0]) if r.hit else f"{r.status}" for r in runs)
    return (
        f"| {variant} | {tta.fmt(1, 2)} | {epochs} | {first.fmt(1, 2)} | {per.fmt(1, 2)} "
        f"| {start.fmt(1, 2)} | {len(hits)}/{len(runs)} |"
    )


def report_lines(results: dict, threads: int) -> list[str]:
    """Markdown: per recipe a table of both variants and the two ratios."""
    lines = []
    for name, res in results.items():
        n = len(res.runs[VARIANTS[0]])
        lines += ["", f"### {name}: val/acc ≥ {res.target}"]
        if res.skipped:
            lines += ["", f"Not run: {res.skipped}."]
            continue
        lines += [
            "",
            f"`experiment={name}` (max {res.max_epochs} epochs), {n} block(s), "
            f"OMP/MKL threads {threads or 'default'}. Cells: median (min–max) over blocks.",
            "",
            "| variant | time to target s | epoch reached, per block | end of epoch 1 s "
            "| s per later epoch | ≈ start-up s (epoch 1 − s/epoch) | reached |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [_variant_row(v, res.runs[v]) for v in VARIANTS]
        lines += [
            "",
            f"- framework / hand loop, time to target: {ratio_text(paired_ratios(res))}",
            "- framework / hand loop at the same epoch (the earlier of the two reached): "
            + ratio_text(paired_ratios(res, same_epoch=True)),
        ]
        hand = [r.hit[1] for r in res.runs[VARIANTS[1]] if r.hit]
        if res.import_s and hand:
            floor = Stats(res.import_s)
            lines.append(
                f"- floor: a process that only runs `import lightning` (collector paused) takes "
                f"{floor.fmt(1, 2)} s, {floor.median / Stats(hand).median:.2f}× the hand "
                "loop's whole time to target"
            )
        missed = [r for v in VARIANTS for r in res.runs[v] if not r.hit]
        for r in missed:
            best = max((acc for _, acc, _ in r.epochs), default=float("nan"))
            lines.append(
                f"- **{r.variant}, seed {r.seed}: did not reach {res.target}** ({r.status}, "
                f"{len(r.epochs)} epoch(s) seen, best val/acc {best:.4f}, rc={r.rc})"
            )
    return lines


# --- command line ----------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipes", default=",".join(RECIPES), help=f"comma list of {tuple(RECIPES)}")
    p.add_argument("--repeats", type=int, default=None, help="blocks (digits 5, mnist 3)")
    p.add_argument("--quick", action="store_true", help="digits only, one block")
    p.add_argument("--target", type=float, default=None, help="val/acc target for every recipe")
    p.add_argument("--threads", type=int, default=1, help="OMP/MKL threads of both (0: default)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--data-dir", default=str(REPO / "data"), help="holds digits/ and MNIST/")
    p.add_argument("--vary-seed", action="store_true", help="seed = recipe seed + block")
    p.add_argument("--after", type=int, default=None, help="epochs past the target (digits 2)")
    p.add_argument("--poll", type=float, default=0.05, help="seconds between metrics reads")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per run at most")
    p.add_argument("--work", default=None, help="keep run dirs and logs here (default: temp)")
    p.add_argument("--out", default=None, help="also write the report to this .md file")
    args = p.parse_args(argv)
    args.recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    bad = [r for r in args.recipes if r not in RECIPES]
    if bad:
        p.error(f"--recipes: unknown {bad}; choose from {tuple(RECIPES)}")
    if args.quick:
        args.recipes, args.repeats = ["digits"], 1
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    repeats = {r: args.repeats or RECIPES[r].repeats for r in args.recipes}

    def log(msg: str) -> None:
        print(msg, flush=True)

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tta-") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        try:
            results = bench(work, args.recipes, repeats, args, log)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    lines = [f"## Time to accuracy ({time.perf_counter() - start:.0f} s in all)"]
    lines += report_lines(results, args.threads)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
