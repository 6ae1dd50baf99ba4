"""Every command's arguments: its usage, its own options and the cheap check that runs
before its worker (and torch, Lightning) is imported. ``python -m experiments.<command>``
and the ``experiments-<command>`` scripts call these.

A worker module has ``command(options, overrides)``: the work, once the arguments are
right. ``train`` is the one command Hydra drives: its check is ``cli.check``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.override_parser.overrides_parser import OverridesParser

from experiments.cli import parse, run
from experiments.cli.check import check, runs_task
from experiments.cli.train_help import help_text
from experiments.config import CONF_DIR
from experiments.console import filter_upstream_warnings, pause_gc
from experiments.errors import UserError, exit_with, one_line
from experiments.recorded import config_dirs
from experiments.recorded.folder import boolean, load_run_config, split_trust
from experiments.runs.layout import (
    BEST_WEIGHTS,
    CALIBRATION,
    CHECKPOINTS,
    CSV_LOG,
    ENV,
    EVAL_METRICS,
    EXPORT_REPORT,
    EXPORTED,
    HYDRA,
    MANIFEST,
    METRICS,
    MODEL_CARD,
    OLD_WEIGHTS_SUFFIX,
    PREDICTIONS,
    RELIABILITY,
    SAVED_CONFIG,
    SAVED_OVERRIDES,
    WEIGHTS_SUFFIX,
)
from experiments.runs.provenance import prestart_git_probe

EVAL_USAGE = f"""\
usage: python -m experiments.eval [run_dir=]<run folder> [ckpt=best|last|<file.pt>]
           [posthoc_tau=<tau>] [tta=none|flip|flip_translate] [key=value ...]

Rebuilds the run's data (same split) and model from <run>/{HYDRA}/{SAVED_CONFIG}, loads the
weights-only checkpoint (default best), runs the test split and writes
<run>/{EVAL_METRICS} (with test/ece, the expected calibration error over 15 bins, and
after calibration test/ece_calibrated), {RELIABILITY} and {MODEL_CARD}. Other key=value
arguments override keys of the run's config, e.g. data.batch_size=256
trainer.accelerator=cpu (+key=value adds a key). posthoc_tau=1.0 also reports
test/posthoc/{{acc,balanced_acc,macro_f1}} after post-hoc logit adjustment (logits minus
tau * log of the training split's class prior; for long-tailed data). tta=flip also reports
test/tta/{{acc,balanced_acc,macro_f1}} on the mean softmax of each image and its mirror
image; flip_translate adds the image shifted by one pixel each way (6 views). Only for
images a mirror leaves of the same class.
The run is rebuilt from a closed set of classes (ours, torchvision's transforms and model
builders), never by calling what its files name; EXPERIMENTS_TRUSTED_MODULES=<pkg>[,<pkg>]
admits the targets of a package of your own."""


PREDICT_USAGE = f"""\
usage: python -m experiments.predict [run_dir=]<run folder> input=<image folder | file.csv>
           [ckpt=best|last|<file.pt>] [output=<file.csv>] [image_dir=<folder>]
           [device=auto|cpu|cuda] [tta=none|flip|flip_translate] [key=value ...]

Runs the checkpoint (default best) on new inputs and writes a CSV to
<run>/{PREDICTIONS} or output; what it holds is the run's task's output:
  classification  every image in a folder (png jpg jpeg bmp gif webp tif, sorted by name)
                  or every row of a CSV with a `filename` column (relative to the CSV's
                  folder, or to image_dir), read with the run's eval transform: one row
                  file,predicted,probability (softmax of the predicted class;
                  temperature-scaled once experiments.calibrate ran)
  regression      input is a CSV with a header row holding the columns the run trained on
                  (by name; others are ignored): row,predicted, one value per data row in
                  file order, in the target's own units
  segmentation    images as for classification: a PNG mask per image (8-bit class indices,
                  at the image's size) under <output stem>_masks/, and file,mask,classes
tta=flip (a classifier's run): each image's probabilities are the mean softmax of the
image and its mirror; flip_translate adds the four one-pixel shifts.
A run of a LightningModule of your own is refused (eval tests it). Other key=value
arguments override keys of the run's config, e.g. data.batch_size=256.
The run is rebuilt from a closed set of classes (ours, torchvision's transforms and model
builders), never by calling what its files name; EXPERIMENTS_TRUSTED_MODULES=<pkg>[,<pkg>]
admits the targets of a package of your own."""


CALIBRATE_USAGE = f"""\
usage: python -m experiments.calibrate [run_dir=]<run folder> [ckpt=best|last|<file.pt>]
           [key=value ...]

Fits one temperature T in [0.05, 20] on the run's validation split (the T that minimizes
the negative log-likelihood of softmax(logits / T); predictions do not change, their
probabilities do). It keeps T = 1, and says why, when the split is saturated (every sample
right), too small (< 100 samples or < 20 of a class), the fit lands on a bound, or a
cross-fitted check (T fitted on one half of the split raises the other half's NLL) fails.
Writes <run>/{CALIBRATION}: T, the reason, and NLL and ECE (15 bins) before and after
on the validation and test splits, with the checkpoint, its epoch and the sample counts.
predict then reports calibrated probabilities for that checkpoint, and eval
test/ece_calibrated. Other key=value arguments override keys of the run's config."""


EXPORT_USAGE = f"""\
usage: python -m experiments.export [run_dir=]<run folder> [format=onnx|torchscript]
           [ckpt=best|last|<file.pt>] [opset=18] [key=value ...]

Writes <run>/{EXPORTED["onnx"]} (any batch size) or \
<run>/{EXPORTED["torchscript"]}. The file takes
float images (N, C, H, W) in [0, 1] at the size the run's eval transform gives (what
torchvision's ToImage + ToDtype(scale=True) make) and returns logits (N, classes), or
(N, classes, H, W) per pixel for a segmentation run; the normalization the run trained
with is inside. It is checked on the test split's first batch: the largest difference from
PyTorch's logits and both accuracies (a segmentation run: the argmax's pixel agreement) go to
<run>/{EXPORT_REPORT} and {MODEL_CARD}. A run trained with compile=true exports the plain
net. ONNX needs onnx, onnxscript and onnxruntime: pip install 'experiments[export]'."""


VERIFY_USAGE = f"""\
usage: python -m experiments.verify [run_dir=]<run folder> [steps=N] [integrity=true]

Runs python -m experiments.train again with the run's own overrides ({HYDRA}/{SAVED_OVERRIDES})
in a temporary folder, with the code installed here, and compares: the whole run's
{METRICS} values and the tensors of its best and last weights ({CHECKPOINTS}/
{BEST_WEIGHTS} and last{WEIGHTS_SUFFIX}; an older run's best{OLD_WEIGHTS_SUFFIX} and \
last{OLD_WEIGHTS_SUFFIX}), when the run
saves them (a run whose config saves none, e.g. debug=fast, is verified on its metrics,
and says so); with steps=N only the first N training steps, by the losses logged at those
steps ({"/".join(CSV_LOG)}). On the machine {ENV} names they must be equal bit for bit; on
another, within a relative tolerance of 1e-5 (printed). Exit 0 when they match, 1 when
they differ (each difference printed), 2 on a run folder that cannot be verified. The
run's files are read as data: an overrides entry that could run code or write elsewhere
(a hydra key, a flag, a target outside conf/) or a corrupt file is one line, exit 2,
before anything is trained.

integrity=true trains nothing: it compares every file of the run (or of a sweep, and of
each job in it) with the sha256 and size its {MANIFEST} lists. Exit 0 when all match,
1 naming each file modified, missing or added after the run; a folder written before
manifests existed has none: a note, exit 0."""


COMPARE_USAGE = f"""\
usage: python -m experiments.compare [run_dir=]<path> [<path> ...] [metric=<name>] [mode=max|min]
                                     [out=<folder>] [ignore=<key>,<key>...] [--latex]
                                     [confirm_top_k=K [confirm_seeds=N]]

Groups the finished runs found under the paths (run folders, sweep folders or any folder
above runs, searched recursively, or glob patterns) by their saved config, leaving out
replicate keys (seed, *.seed, *_seed), paths, hydra, task_name, tags, resume and per-run
output locations, and prints per group: n, mean ± std and the 95% confidence interval
(Student's t, kept inside [0, 1] for accuracy-like metrics) of the metric at each run's
selected epoch (the one the best checkpoint keeps; a last-epoch value is labelled last),
and of test/acc, test/balanced_acc, test/macro_f1, val/acc, wall_time_s when every run
has them.
Writes compare.md, compare.csv and compare.png into out (default: next to the inputs).

  metric=<name>     the metric to rank by (default: the runs' own optimized_metric, a
                    validation metric; test metrics are shown, not used to rank)
  mode=max|min      whether higher or lower is better (default: the runs' optimized_mode)
  out=<folder>      where to write compare.md, compare.csv, compare.png (also --out=<folder>)
  ignore=<keys>     more config keys (comma-separated, dotted) to leave out of the grouping
  --latex           also write compare.tex: the table as LaTeX (mean and 95% CI, seeds)
  confirm_top_k=K   train the top K configs again on fresh seeds (their saved overrides,
                    through python -m experiments.train, into <compared folder>-confirm)
                    and say whether the winner keeps its rank
  confirm_seeds=N   fresh seeds per config for confirm_top_k (default: the most seeds a
                    top group ran, at least 2)

With two groups or more a verdict follows the table: the first group against each other
(paired t on the seeds both ran, else Welch's t; Holm-adjusted for 3+ groups). It is
marked best only when it beats every other at 95%; otherwise the groups tied with it are
marked tie, with about how many seeds per group would decide it (or "more than 100", or
"no difference detectable").

Runs whose {METRICS} or config cannot be read, or that lack the metric, are skipped and
listed (and named on stderr, one line each). Exit status 2 when no run can be compared."""


@dataclass(frozen=True)
class Command:
    """One command of a finished run or sweep: parse, check cheaply, then hand over."""

    usage: str
    own: dict
    worker: str  # the module whose command(options, overrides) does the work
    # other key=value arguments change the run's saved config; the cheap check then loads
    # it with them (verify and compare read what they need: a sweep folder too)
    overrides: bool = True
    many: bool = False  # several folders (compare)
    typed: Callable[[dict], dict] = dict  # the options' values as the worker takes them

    def __call__(self, argv: Sequence[str] | None = None) -> None:
        run(self.body, argv)

    def body(self, argv: list[str]) -> int | None:
        options, overrides = parse(argv, self.own, self.usage, overrides=self.overrides,
                                   many=self.many)  # fmt: skip
        typed = self.typed(options)
        if self.overrides:  # unknown keys and an unreadable run answer before torch loads
            load_run_config(options["run_dir"], split_trust(overrides)[1])
        # the worker (torch, Lightning) is imported only once the arguments are right
        return importlib.import_module(self.worker).command(typed, overrides)


# models.tta.TTA's modes, spelled here too: that module imports torch, this one must not
TTA = ("none", "flip", "flip_translate")


def _predict_options(options: dict) -> dict:
    """predict's (and eval's) tta one of ``TTA``."""
    if options["tta"] not in TTA:
        raise UserError(f"tta={options['tta']!r} is not valid; use one of {', '.join(TTA)}")
    return options


def _evaluate_options(options: dict) -> dict:
    """eval's posthoc_tau a float, None when not given; tta one of ``TTA``."""
    tau = _predict_options(options)["posthoc_tau"]
    try:
        return {**options, "posthoc_tau": float(tau) if tau else None}
    except ValueError:
        raise UserError(f"posthoc_tau={tau!r} is not a number (1.0 is Menon et al.'s)") from None


def _export_options(options: dict) -> dict:
    """export's format one of ``EXPORTED``, its opset a whole number."""
    if options["format"] not in EXPORTED:
        raise UserError(
            f"format={options['format']!r} is not valid; use one of {', '.join(EXPORTED)}"
        )
    try:
        return {**options, "opset": int(options["opset"])}
    except ValueError:
        raise UserError(f"opset={options['opset']!r} is not a number (18 is the default)") from None


def _verify_options(options: dict) -> dict:
    """verify's integrity a bool, steps a whole number >= 1 or None (integrity takes none)."""
    integrity, steps = boolean("integrity", options["integrity"]), options["steps"]
    if integrity and steps:
        raise UserError("integrity=true trains nothing: give it without steps=")
    if steps and (not steps.isdigit() or int(steps) < 1):
        raise UserError(f"steps={steps!r} is not valid: expected a whole number >= 1")
    return {**options, "integrity": integrity, "steps": int(steps) if steps else None}


RUN = {"run_dir": None, "ckpt": "best"}
evaluate = Command(
    EVAL_USAGE,
    {**RUN, "posthoc_tau": "", "tta": "none"},
    "experiments.evaluation.evaluate",
    typed=_evaluate_options,
)
predict = Command(
    PREDICT_USAGE,
    {**RUN, "input": None, "output": "", "image_dir": "", "device": "auto", "tta": "none"},
    "experiments.evaluation.prediction",
    typed=_predict_options,
)
calibrate = Command(CALIBRATE_USAGE, RUN, "experiments.evaluation.temperature")
export = Command(
    EXPORT_USAGE,
    {**RUN, "format": "onnx", "opset": "18"},
    "experiments.evaluation.exporting",
    typed=_export_options,
)
verify = Command(
    VERIFY_USAGE,
    {"run_dir": None, "steps": "", "integrity": "false"},
    "experiments.evaluation.verification",
    overrides=False,
    typed=_verify_options,
)
AUTO = "<auto>"  # an option not given (an empty metric= is an error, not this)


def _compare_options(options: dict) -> dict:
    """compare's options typed: AUTO is None, counts are whole numbers, --latex a bool."""
    typed = {k: None if v == AUTO else v for k, v in options.items()}
    for key in ("confirm_top_k", "confirm_seeds"):
        if typed[key] is not None:
            try:
                typed[key] = int(typed[key])
            except ValueError:
                raise UserError(f"{key}={typed[key]}: must be a whole number") from None
    typed["latex"] = boolean("latex", options["latex"])
    return typed


compare = Command(
    COMPARE_USAGE,
    {"run_dir": [], "metric": AUTO, "mode": AUTO, "out": "", "ignore": "", "latex": "false",
     "confirm_top_k": AUTO, "confirm_seeds": AUTO},
    "experiments.analysis.comparison",
    overrides=False,
    many=True,
    typed=_compare_options,
)  # fmt: skip


CONFIG_DIR_FLAGS = ("-cd", "--config-dir")


def with_config_dirs(argv: list[str]) -> list[str]:
    """``argv`` with your own config folders as one ``hydra.searchpath=[...]`` at its end:
    those of ``-cd``/``--config-dir`` (taken out: Hydra would skip the check) and of a
    ``hydra.searchpath`` given, then ``EXPERIMENTS_CONFIG_PATH``'s (``recorded.config_dirs``;
    a resumed or verified run reads the same variable). At the end, as ``-m`` and the other
    flags stay first; composed after ``conf/``, so an option of ours keeps its name.

    Raises:
        UserError: a ``-cd`` without a folder, or a folder that does not exist.
    """
    folders, rest, given = [], [], []
    args = iter(argv)
    for arg in args:
        flag, eq, value = arg.partition("=")
        if flag in CONFIG_DIR_FLAGS:
            value = value if eq else next(args, "")
            if not value or not Path(value).expanduser().is_dir():
                raise UserError(
                    f"{flag} {value}: {'no such folder' if value else 'expected a folder'}; "
                    f"give the folder that holds your config groups (model/, data/ ...)"
                )
            folders.append(f"file://{Path(value).expanduser().resolve()}")
        elif arg.lstrip("+").startswith("hydra.searchpath="):
            given.append(arg)
        else:
            rest.append(arg)
    folders += [f"file://{d}" for d in config_dirs()]
    if not folders:
        return list(argv)
    entries = [*_searchpath_entries(given[-1]), *folders] if given else folders
    quoted = ",".join(_quoted(e) for e in dict.fromkeys(entries))
    return [*rest, f"hydra.searchpath=[{quoted}]"]


def _quoted(text: str) -> str:
    """``text`` as one quoted string of Hydra's override grammar."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _searchpath_entries(arg: str) -> list[str]:
    """The entries of a ``hydra.searchpath=[...]`` argument, as Hydra parses them."""
    try:
        value = OverridesParser.create().parse_override(arg.lstrip("+")).value()
    except Exception as err:  # Hydra's grammar: the message names what is wrong
        raise UserError(f"cannot parse override {arg!r}: {one_line(err)}") from None
    return [str(v) for v in (value if isinstance(value, list) else [value])]


def train(argv: Sequence[str] | None = None) -> None:
    """``python -m experiments.train``: check the command line before Hydra starts (fast,
    one line: ``config.precheck``), then run the training task."""
    pause_gc()
    filter_upstream_warnings()
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(help_text(CONF_DIR))
        sys.exit(0)
    try:
        argv = with_config_dirs(argv)
        checked = check(argv, str(CONF_DIR))  # replayed overrides included
    except UserError as err:
        exit_with(err)
    sys.argv = [sys.argv[0], *checked.argv]  # what DDP ranks and SLURM requeues re-run
    if not runs_task(checked.argv):  # --cfg job, --info, ...: Hydra prints; no torch needed
        try:
            hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")(
                lambda cfg: None
            )()
        except ValueError as err:  # Hydra's own: "Only one of --run, --multirun, --cfg ..."
            exit_with(UserError(str(err)))
        return
    prestart_git_probe()  # its git subprocesses overlap the import below
    # the worker (torch, Lightning) is imported only once the command line is right
    importlib.import_module("experiments.training.pipeline").launch(checked)
