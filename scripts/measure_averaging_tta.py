"""Weight averaging and test-time augmentation against neither, on Fashion-MNIST, paired by
seed: docs/models.md shows its output.

Averaging never changes the raw weights' training (tests/test_weight_averaging.py checks
it bit for bit), so one run per seed gives both arms of the comparison: a run with
``callbacks.weight_averaging.kind=<kind>`` (``--kind``) keeps the average in
``last.safetensors`` and the raw weights, exactly those a run without averaging ends
with, in ``last.ckpt``. Each seed trains the short recipe ``RECIPE``; then the last
epoch's averaged and raw weights are tested as ``python -m experiments.eval <run>
ckpt=<weights> tta=flip|flip_translate`` tests them (``SavedRun.logits`` over
``tta_views``, without the rest of eval's report, which costs ~90 s a call here). It
prints the mean test accuracy of each (95% interval over seeds) and the paired
differences (TTA against no TTA on the same weights; averaged against raw of the same
run) with their 95% intervals (Student's t). Finished runs are kept under ``--out`` and
reused, so a second call only prints (or fills in what is missing).

Example (about 2 minutes a seed on an idle 2-core CPU; needs data/FashionMNIST):

    python scripts/measure_averaging_tta.py --seeds 0 1 2 3 4
    python scripts/measure_averaging_tta.py --kind last_k --seeds 0 1 trainer.max_epochs=4
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

from experiments.analysis.significance import t_quantile_975
from experiments.evaluation.saved_run import SavedRun
from experiments.models.tta import tta_views
from experiments.runs.checkpoint_io import load_full_checkpoint
from experiments.runs.files import read_json_object
from experiments.runs.layout import RunDir
from experiments.runs.weights import save_state_dict

REPO = Path(__file__).resolve().parents[1]
# the speedrun_mnist recipe on Fashion-MNIST with random left-right flips (a view TTA then
# averages over), half a pass over the training split as two quarter-epochs (last_k
# averages the two); its own test is left to eval
RECIPE = [
    "data=fashion_mnist", "data.augment={_target_:torchvision.transforms.v2.RandomHorizontalFlip}",
    "trainer.limit_train_batches=0.25", "model=speednet", "optimizer=adamw",
    "scheduler=onecycle", "data.batch_size=128", "model.label_smoothing=0.05",
    "model.scheduler_interval=step", "model.channels_last=true", "optimizer.lr=0.01",
    "optimizer.weight_decay=0.01", "scheduler.warmup_epochs=0.3", "trainer.max_epochs=2",
    "trainer.num_sanity_val_steps=0", "logger=none", "test=false",
]  # fmt: skip
AVERAGING = {
    "ema": ["callbacks.weight_averaging.decay=0.99"],
    "last_k": ["callbacks.weight_averaging.k=2"],
}
TTA = ("none", "flip", "flip_translate")


def measure(run: Path, kind: str, seed: int, data_dir: str, extra: list[str]) -> dict:
    """``{"averaged": {tta: test acc}, "raw": {...}}`` of one run, trained if missing."""
    done = run / "measured.json"
    if done.is_file():
        return read_json_object(done)
    overrides = [*RECIPE, f"callbacks.weight_averaging.kind={kind}", *AVERAGING[kind], *extra]
    args = [*overrides, f"seed={seed}", f"paths.data_dir={data_dir}", f"hydra.run.dir={run}"]
    layout = RunDir(run)
    if not layout.metrics.is_file():  # a run trained before, not yet measured: kept
        res = subprocess.run([sys.executable, "-m", "experiments.train", *args], cwd=REPO,
                             capture_output=True, text=True)  # fmt: skip
        if res.returncode != 0:
            sys.exit(f"training {run} failed:\n{res.stderr[-3000:]}")
    state = load_full_checkpoint(layout.last_ckpt)["state_dict"]
    raw = save_state_dict(
        {k.removeprefix("net."): v for k, v in state.items() if k.startswith("net.")},
        run / "raw_last.safetensors",
    )
    result: dict = {}
    for arm, ckpt in (("averaged", "last"), ("raw", str(raw))):
        # what eval's test/acc and test/tta/acc are computed from (SavedRun.logits), without
        # the rest of its report (calibration, plots, the model card): ~90 s a call here
        saved = SavedRun(run, ckpt)
        result[arm] = {}
        for mode in TTA:
            logits, labels = saved.logits("test", tta_views(mode))
            result[arm][mode] = float((logits.argmax(1) == labels).float().mean())
    done.write_text(json.dumps(result))
    return result


def interval(values: list[float]) -> str:
    """``mean [low, high]`` in points (x100), the 95% t interval of the mean."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{100 * mean:+.2f}"
    half = t_quantile_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return f"{100 * mean:.2f} [{100 * (mean - half):.2f}, {100 * (mean + half):.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--kind", default="ema", choices=list(AVERAGING))
    parser.add_argument("--out", type=Path, default=REPO / "outputs/measure_averaging_tta")
    parser.add_argument("--data-dir", default=str(REPO / "data"))
    parser.add_argument("overrides", nargs="*", help="more key=value for every run")
    args = parser.parse_args()
    tag = "_".join([args.kind, *(o.replace("/", "-") for o in args.overrides)])[:100]
    runs = {s: measure(args.out / tag / f"seed{s}", args.kind, s, args.data_dir, args.overrides)
            for s in args.seeds}  # fmt: skip
    print(f"Fashion-MNIST test accuracy (%), {len(runs)} seeds, mean [95% interval]; {tag}\n")
    print("| weights | no TTA | tta=flip | tta=flip_translate |")
    print("|---|---|---|---|")
    for arm in ("raw", "averaged"):
        cols = [interval([r[arm][m] for r in runs.values()]) for m in TTA]
        print(f"| {arm} | {' | '.join(cols)} |")
    print("\nPaired differences (points), mean [95% interval]:\n")
    print("| comparison | difference |")
    print("|---|---|")
    for arm in ("raw", "averaged"):
        for m in TTA[1:]:
            diffs = [r[arm][m] - r[arm]["none"] for r in runs.values()]
            print(f"| {arm}: tta={m} - no TTA | {interval(diffs)} |")
    for m in TTA:
        diffs = [r["averaged"][m] - r["raw"][m] for r in runs.values()]
        print(f"| {args.kind} - raw, tta={m} | {interval(diffs)} |")


if __name__ == "__main__":
    main()
