"""Where everything of a run folder and of a sweep folder lives, in one place: the only
module that spells their file names (``tests/test_layout_names.py`` holds every other module
to it). Code names a ``RunDir``/``SweepDir`` attribute; a message that names a file without
its folder uses the constant below."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from experiments.errors import UserError, one_line
from experiments.runs.files import read_json_object

log = logging.getLogger(__name__)

# the files of a run folder (RunDir below shows where each lives)
CHECKPOINTS = "checkpoints"
LAST_CKPT = "last.ckpt"
PREVIOUS_SUFFIX = ".prev"  # the full checkpoint before the newest one (see checkpoint_io)
# weights-only files: what runs write now, and what runs written before safetensors hold
WEIGHTS_SUFFIX = ".safetensors"
OLD_WEIGHTS_SUFFIX = ".pt"
WEIGHTS_ROLES = ("best", "last")
SIDECAR_SUFFIX = ".json"  # <role>.json beside <role>.safetensors: epoch, metric, why chosen
BEST_WEIGHTS = f"best{WEIGHTS_SUFFIX}"
BEST_SIDECAR = f"best{SIDECAR_SUFFIX}"
METRICS = "metrics.json"
EVAL_METRICS = "eval_metrics.json"
CALIBRATION = "calibration.json"
RELIABILITY = "reliability.png"
EXPORTED = {"onnx": "model.onnx", "torchscript": "model.torchscript.pt"}
EXPORT_REPORT = "export.json"
MODEL_CARD = "model_card.md"
PREDICTIONS = "predictions.csv"
ENV = "env.json"
GIT_DIFF = "git.diff"
REQUIREMENTS = "requirements.txt"
REPRODUCE = "reproduce.sh"
MANIFEST = "manifest.json"  # runs.manifest: a run's or a sweep's (or a job's) file hashes
HYDRA = ".hydra"
SAVED_CONFIG = "config.yaml"
SAVED_OVERRIDES = "overrides.yaml"
NOTES = "notes.json"  # tags and a note added after the run (experiments-runs); not an artifact
# your own config folders (os.pathsep-separated), searched after conf/ when a run is composed
# or read back (reproduce.sh exports them): explicit, like the trust setting, and read only by
# experiments.recorded.config_dirs, never from a run's files (docs/own_task.md)
CONFIG_PATH_ENV = "EXPERIMENTS_CONFIG_PATH"
FOLD_PREFIX = "fold_"  # fold_<k>/: cv.folds=K trains one run per fold inside the run folder
CSV_LOG = ("csv", "metrics.csv")  # the CSV logger's rows (tracking's csv logger writes it)
# the files of a sweep folder (SweepDir below)
SWEEP_MANIFEST = "sweep.json"
JOB_FILE = "job.json"
# the fields of a sidecar that training and resuming read, and the types they may have
SIDECAR_TYPES = {
    "epoch": (int,),
    "epoch_base": (int, type(None)),
    "global_step": (int,),
    "monitor": (str, type(None)),
    "value": (int, float, type(None)),
}


def weights_file(checkpoints: Path, role: str) -> Path:
    """``<checkpoints>/<role>.safetensors`` (``role``: best or last), or an older run's
    ``<role>.pt`` when only that exists: the one place either name is spelled."""
    new = Path(checkpoints) / f"{role}{WEIGHTS_SUFFIX}"
    old = new.with_suffix(OLD_WEIGHTS_SUFFIX)
    return old if not new.exists() and old.is_file() else new


def own_role(name: object) -> str | None:
    """``best`` / ``last`` for a name ``RunDir.checkpoint_name`` gives the run's own weights
    (a bare file name, either format), else None (a path: a file from elsewhere)."""
    suffixes = (WEIGHTS_SUFFIX, OLD_WEIGHTS_SUFFIX)
    return next((r for r in WEIGHTS_ROLES for s in suffixes if name == f"{r}{s}"), None)


def checkpoint_label(name: object, epoch: object) -> str:
    """A checkpoint as people read it: ``best.safetensors (selected epoch 3)``,
    ``last.safetensors (last epoch 5)``, ``<file> (epoch 2)``; ``not recorded`` when the
    epoch is unknown."""
    known = isinstance(epoch, int) and not isinstance(epoch, bool)
    which = {"best": "selected epoch", "last": "last epoch"}.get(own_role(name), "epoch")
    return f"{name} ({which} {epoch if known else 'not recorded'})"


def checkpoint_files(checkpoints: Path) -> list[Path]:
    """The weights files and their sidecars that exist, best first (what trackers upload)."""
    weights = [weights_file(checkpoints, role) for role in WEIGHTS_ROLES]
    return [f for w in weights for f in (w, sidecar_of(w)) if f.is_file()]


def sidecar_of(weights: Path) -> Path:
    """The ``.json`` sidecar beside a weights file or full checkpoint (``best.safetensors``
    -> ``best.json``; a ``.pt`` given to eval or predict has one the same way)."""
    return Path(weights).with_suffix(SIDECAR_SUFFIX)


def sidecar_epoch(sidecar: dict) -> int:
    """The 1-based epoch a ``best.json``/``last.json`` records (run dirs written before
    sidecars counted from 1 hold a 0-based one)."""
    epoch = int(sidecar.get("epoch", 0))
    return epoch if sidecar.get("epoch_base") == 1 else epoch + 1


def recorded_epoch(sidecar: dict) -> int | None:
    """``sidecar_epoch``, or None when the sidecar records no epoch (none, or an old one)."""
    return sidecar_epoch(sidecar) if "epoch" in sidecar else None


def read_sidecar(path: Path) -> dict:
    """A checkpoint's ``.json`` sidecar (``best.json``/``last.json``) read as data, with the
    fields training reads (``SIDECAR_TYPES``) checked for type; ``{}`` when there is none.

    Raises:
        UserError: one line naming the file: corrupt, not an object, a field of the wrong type.
    """
    sidecar = read_json_object(path)
    for key, types in SIDECAR_TYPES.items():
        value = sidecar.get(key)
        if key in sidecar and (not isinstance(value, types) or isinstance(value, bool)):
            raise UserError(
                f"{path}: {key} is {type(value).__name__} {str(value)[:40]!r}, not what a run "
                f"writes there; restore the file (or delete it: it is rewritten at the next "
                f"checkpoint)"
            )
    return sidecar


def _at(*parts: str) -> property:
    """A property: the path ``parts`` inside the folder (of a RunDir or a SweepDir)."""
    return property(lambda self: self.path.joinpath(*parts))


@dataclass(frozen=True)
class RunDir:
    """A run folder as ``python -m experiments.train`` makes it::

    <run>/.hydra/{config,overrides}.yaml   the composed config and the command's overrides
    <run>/checkpoints/last.ckpt[.prev]      full checkpoints (weights, optimizer, loops, RNG)
    <run>/checkpoints/{best,last}.safetensors  weights-only state_dicts (an older run: .pt)
    <run>/checkpoints/{best,last}.json      their sidecars (epoch, metric, why chosen)
    <run>/hpc_ckpt_N.ckpt                   Lightning's SLURM pre-emption checkpoints
    <run>/metrics.json                      written when the run finished (resuming it to
                                            train on moves it to metrics.previous.json)
    <run>/data_stats.json, data_counts.json  data.mean=auto's statistics; images per class
    <run>/eval_metrics.json, reliability.png  experiments.eval (test metrics, ECE)
    <run>/calibration.json                  experiments.calibrate (temperature, ECE)
    <run>/model.onnx | model.torchscript.pt, export.json   experiments.export
    <run>/model_card.md                     what the model is, refreshed by each of those
    <run>/predictions.csv                   experiments.predict (unless output=)
    <run>/env.json, git.diff, requirements.txt, reproduce.sh  provenance (runs.provenance)
    <run>/manifest.json                     every artifact's sha256 and size (runs.manifest)
    <run>/.lock                             held by the process training in it
    <run>/notes.json                        tags and a note added later (experiments-runs)
    <run>/csv/metrics.csv                   the CSV logger's rows (logger=csv, the default)
    <run>/fold_<k>/                         cv.folds=K: one such run per fold (+ cv.md)
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    checkpoints = _at(CHECKPOINTS)
    last_ckpt = _at(CHECKPOINTS, LAST_CKPT)
    best_json = _at(CHECKPOINTS, BEST_SIDECAR)
    last_json = _at(CHECKPOINTS, f"last{SIDECAR_SUFFIX}")
    manifest = _at(MANIFEST)
    metrics = _at(METRICS)
    previous_metrics = _at("metrics.previous.json")
    eval_metrics = _at(EVAL_METRICS)
    calibration = _at(CALIBRATION)
    reliability_png = _at(RELIABILITY)
    export_report = _at(EXPORT_REPORT)
    model_card = _at(MODEL_CARD)
    predictions = _at(PREDICTIONS)
    data_counts = _at("data_counts.json")
    data_stats = _at("data_stats.json")
    cv_report = _at("cv.md")  # a cross-validated run's folds side by side
    csv_metrics = _at(*CSV_LOG)
    env = _at(ENV)
    git_diff = _at(GIT_DIFF)  # only when the checkout had uncommitted changes
    requirements = _at(REQUIREMENTS)
    reproduce_script = _at(REPRODUCE)
    saved_config = _at(HYDRA, SAVED_CONFIG)
    saved_overrides = _at(HYDRA, SAVED_OVERRIDES)
    hydra_runtime = _at(HYDRA, "hydra.yaml")  # Hydra's own record: its choices, its job
    notes = _at(NOTES)
    lock_file = _at(".lock")
    best_weights = property(lambda self: self.weights("best"))
    last_weights = property(lambda self: self.weights("last"))

    def weights(self, role: str) -> Path:
        """The weights of ``role``: ``best.safetensors`` / ``last.safetensors``, or an older
        run's ``best.pt`` / ``last.pt``."""
        return weights_file(self.checkpoints, role)

    def checkpoint_name(self, path: object) -> str:
        """The run's own weights by file name (``best.safetensors``, ``last.safetensors``, an
        older run's ``best.pt``), anything else by its full path (``?`` for what is not a
        path): how run files record a checkpoint."""
        if not isinstance(path, str | Path):
            return "?"
        try:
            resolved = Path(path).resolve()
            for own in (self.best_weights, self.last_weights):
                if resolved == own.resolve():
                    return own.name
            return str(resolved)
        except (OSError, ValueError, RuntimeError):
            return "?"

    def best_value(self, metric: str) -> float | None:
        """``metric`` at the best epoch (the one ``best_weights`` holds, ``best.json``'s
        value), when that is the metric it was chosen by; else None. A corrupt ``best.json``
        is a one-line warning naming it, and None: the caller's metrics.json value stands."""
        try:
            best = read_sidecar(self.best_json)
        except UserError as err:
            log.warning("%s", one_line(err))
            return None
        if best.get("monitor") != metric or best.get("value") is None:
            return None
        return float(best["value"])

    def sidecars(self) -> list[Path]:
        """The checkpoints' sidecars that exist (``best.json``, ``last.json``)."""
        return [p for p in (self.best_json, self.last_json) if p.exists()]

    def exported(self, fmt: str) -> Path:
        """``model.onnx`` or ``model.torchscript.pt``, and ``export.json`` beside them."""
        return self.path / EXPORTED[fmt]

    @property
    def finished(self) -> bool:
        return self.metrics.is_file()

    def hpc_checkpoints(self) -> list[Path]:
        """Lightning's ``hpc_ckpt_N.ckpt`` files, newest (highest N) first."""

        def number(path: Path) -> int:
            suffix = path.stem.rsplit("_", 1)[-1]
            return int(suffix) if suffix.isdigit() else -1

        return sorted(self.path.glob("hpc_ckpt_*.ckpt"), key=number, reverse=True)

    def fold(self, k: int) -> RunDir:
        """The run of cross-validation fold ``k`` (``fold_<k>/``)."""
        return RunDir(self.path / f"{FOLD_PREFIX}{int(k)}")

    def folds(self) -> list[RunDir]:
        """The ``fold_<k>`` runs there are, in fold order."""
        found = [
            (int(d.name[len(FOLD_PREFIX) :]), d)
            for d in self.path.glob(f"{FOLD_PREFIX}*")
            if d.name[len(FOLD_PREFIX) :].isdigit()
        ]
        return [RunDir(d) for _, d in sorted(found)]

    def resumable(self) -> bool:
        """Something to continue: a full checkpoint, or (cross-validation, ``cv.folds``)
        a ``fold_<k>`` run with a checkpoint or finished."""
        return self.has_checkpoint() or any(f.has_checkpoint() or f.finished for f in self.folds())

    def has_checkpoint(self) -> bool:
        """A full checkpoint to continue from exists (``last.ckpt``, its ``.prev``, or hpc)."""
        return any(self.checkpoints.glob(f"{LAST_CKPT}*")) or bool(self.hpc_checkpoints())

    @staticmethod
    def is_run_file(path: Path) -> bool:
        """``path`` is a file that stands for its run folder: its ``metrics.json`` or its
        ``.hydra/config.yaml`` (``folder_of`` gives the folder)."""
        path = Path(path)
        saved = path.name == SAVED_CONFIG and path.parent.name == HYDRA
        return path.name == METRICS or saved

    @staticmethod
    def folder_of(run_file: Path) -> Path:
        """The run folder of a file ``is_run_file`` accepts."""
        run_file = Path(run_file)
        return run_file.parent.parent if run_file.parent.name == HYDRA else run_file.parent

    @staticmethod
    def looks_like_run(names: set[str]) -> bool:
        """A folder holding these entry names is a run (finished, or with its config saved)."""
        return METRICS in names or HYDRA in names


@dataclass(frozen=True)
class SweepDir:
    """A sweep folder as ``python -m experiments.train -m`` makes it::

    <sweep>/sweep.json            what identifies the sweep (``runs.sweep.Manifest``)
    <sweep>/<job>/                one run folder per job (a RunDir) ...
    <sweep>/<job>/job.json        ... and its record: status, overrides, error, node
    <sweep>/summary.md, summary.csv  the table of every job (``tracking.sweep_summary``)
    <sweep>/parallel.png, contour.png, summary.png  its plots (``tracking.sweep_plots``)
    <sweep>/optimization_results.yaml  the best parameters (our Optuna sweeper)
    <sweep>/manifest.json         every artifact's sha256 and size (``runs.manifest``)
    <sweep>/.lock                 held by the process running the sweep
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    sweep_file = _at(SWEEP_MANIFEST)
    summary_md = _at("summary.md")
    summary_csv = _at("summary.csv")
    parallel_png = _at("parallel.png")  # every finished job as a line across the swept keys
    contour_png = _at("contour.png")  # the metric over the two most important swept keys
    summary_png = _at("summary.png")  # the metric by the swept key, when only one varies
    optimization_results = _at("optimization_results.yaml")
    manifest = _at(MANIFEST)

    @staticmethod
    def job_file(job_dir: Path) -> Path:
        """A job's record (``job.json``), written by the sweep when the job ends."""
        return Path(job_dir) / JOB_FILE

    def job_files(self) -> list[Path]:
        """The records of the jobs that ended, sorted by path."""
        return sorted(self.path.glob(f"*/{JOB_FILE}"))


def run_folders(root: Path) -> Iterator[tuple[Path, set[str]]]:
    """``(run folder, its entry names)`` under ``root`` (``root`` itself when it is a run),
    depth first in name order. Nothing inside a run is searched (its folds, checkpoints),
    hidden folders and symlinked folders are passed by, an unreadable folder is skipped."""
    todo = [Path(root)]
    while todo:
        folder = todo.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        names = {e.name for e in entries}
        if RunDir.looks_like_run(names):
            yield folder, names
            continue
        subs = [Path(e.path) for e in entries if not e.name.startswith(".") and _is_dir(e)]
        todo.extend(reversed(subs))


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False
