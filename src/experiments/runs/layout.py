"""Where everything of one run lives, in one place."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from experiments.errors import UserError, one_line
from experiments.runs.files import read_json_object
from experiments.runs.manifest import MANIFEST

log = logging.getLogger(__name__)

PREVIOUS_SUFFIX = ".prev"  # the full checkpoint before the newest one (see checkpoint_io)
SIDECAR_NAMES = ("best.json", "last.json")
# weights-only files: what runs write now, and what runs written before safetensors hold
WEIGHTS_SUFFIX = ".safetensors"
OLD_WEIGHTS_SUFFIX = ".pt"
WEIGHTS_ROLES = ("best", "last")
_NUMBER = (int, float)
# the fields of a sidecar that training and resuming read, and the types they may have
SIDECAR_TYPES = {
    "epoch": (int,),
    "epoch_base": (int, type(None)),
    "global_step": (int,),
    "monitor": (str, type(None)),
    "value": (*_NUMBER, type(None)),
}


def weights_file(checkpoints: Path, role: str) -> Path:
    """``<checkpoints>/<role>.safetensors`` (``role``: best or last), or an older run's
    ``<role>.pt`` when only that exists: the one place either name is spelled."""
    new = Path(checkpoints) / f"{role}{WEIGHTS_SUFFIX}"
    old = new.with_suffix(OLD_WEIGHTS_SUFFIX)
    return old if not new.exists() and old.is_file() else new


def weights_role(path: str | Path) -> str | None:
    """``best`` or ``last`` when ``path`` is named as a run's own weights file is (either
    format), else None."""
    name = Path(str(path)).name
    for role in WEIGHTS_ROLES:
        if name in (f"{role}{WEIGHTS_SUFFIX}", f"{role}{OLD_WEIGHTS_SUFFIX}"):
            return role
    return None


def checkpoint_files(checkpoints: Path) -> list[Path]:
    """The weights files and their sidecars that exist, best first (what trackers upload)."""
    files = []
    for role in WEIGHTS_ROLES:
        files += [weights_file(checkpoints, role), Path(checkpoints) / f"{role}.json"]
    return [f for f in files if f.is_file()]


def sidecar_epoch(sidecar: dict) -> int:
    """The 1-based epoch a ``best.json``/``last.json`` records (run dirs written before
    sidecars counted from 1 hold a 0-based one)."""
    epoch = int(sidecar.get("epoch", 0))
    return epoch if sidecar.get("epoch_base") == 1 else epoch + 1


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


@dataclass(frozen=True)
class RunDir:
    """A run folder as ``python -m experiments.train`` makes it::

    <run>/.hydra/{config,overrides}.yaml   the composed config and the command's overrides
    <run>/checkpoints/last.ckpt[.prev]      full checkpoints (weights, optimizer, loops, RNG)
    <run>/checkpoints/{best,last}.safetensors  weights-only state_dicts (an older run: .pt)
    <run>/checkpoints/{best,last}.json      their sidecars (epoch, metric, why chosen)
    <run>/hpc_ckpt_N.ckpt                   Lightning's SLURM pre-emption checkpoints
    <run>/metrics.json                      written when the run finished
    <run>/eval_metrics.json, reliability.png  experiments.eval (test metrics, ECE)
    <run>/calibration.json                  experiments.calibrate (temperature, ECE)
    <run>/model.onnx | model.torchscript.pt, export.json   experiments.export
    <run>/model_card.md                     what the model is, refreshed by each of those
    <run>/env.json                          provenance (git, versions, host, SLURM job)
    <run>/manifest.json                     every artifact's sha256 and size (runs.manifest)
    <run>/.lock                             held by the process training in it
    <run>/fold_<k>/                         cv.folds=K: one such run per fold (+ cv.md)
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def last_ckpt(self) -> Path:
        return self.checkpoints / "last.ckpt"

    @property
    def best_weights(self) -> Path:
        """The best weights of this run: ``best.safetensors``, or an older run's ``best.pt``."""
        return weights_file(self.checkpoints, "best")

    @property
    def last_weights(self) -> Path:
        """The last epoch's weights: ``last.safetensors``, or an older run's ``last.pt``."""
        return weights_file(self.checkpoints, "last")

    @property
    def best_pt(self) -> Path:
        """Old name of ``best_weights`` (callers written before safetensors)."""
        return self.best_weights

    @property
    def manifest(self) -> Path:
        """``manifest.json``: every artifact's sha256 and size (``runs.manifest``)."""
        return self.path / MANIFEST

    @property
    def best_json(self) -> Path:
        return self.checkpoints / "best.json"

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

    @property
    def last_json(self) -> Path:
        return self.checkpoints / "last.json"

    def sidecars(self) -> list[Path]:
        """The checkpoints' sidecars that exist (``best.json``, ``last.json``)."""
        return [self.checkpoints / n for n in SIDECAR_NAMES if (self.checkpoints / n).exists()]

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.json"

    @property
    def eval_metrics(self) -> Path:
        return self.path / "eval_metrics.json"

    @property
    def calibration(self) -> Path:
        """The temperature ``experiments.calibrate`` fitted, and ECE before and after."""
        return self.path / "calibration.json"

    @property
    def reliability_png(self) -> Path:
        return self.path / "reliability.png"

    def exported(self, fmt: str) -> Path:
        """``model.onnx`` or ``model.torchscript.pt``, and ``export.json`` beside them."""
        return self.path / {"onnx": "model.onnx", "torchscript": "model.torchscript.pt"}[fmt]

    @property
    def export_report(self) -> Path:
        return self.path / "export.json"

    @property
    def model_card(self) -> Path:
        return self.path / "model_card.md"

    @property
    def env(self) -> Path:
        return self.path / "env.json"

    @property
    def git_diff(self) -> Path:
        """The checkout's uncommitted changes when the run started (only when there were)."""
        return self.path / "git.diff"

    @property
    def requirements(self) -> Path:
        """Every installed distribution as name==version, for reproduce.sh."""
        return self.path / "requirements.txt"

    @property
    def reproduce_script(self) -> Path:
        return self.path / "reproduce.sh"

    @property
    def saved_config(self) -> Path:
        return self.path / ".hydra" / "config.yaml"

    @property
    def saved_overrides(self) -> Path:
        return self.path / ".hydra" / "overrides.yaml"

    @property
    def lock_file(self) -> Path:
        return self.path / ".lock"

    @property
    def finished(self) -> bool:
        return self.metrics.is_file()

    def hpc_checkpoints(self) -> list[Path]:
        """Lightning's ``hpc_ckpt_N.ckpt`` files, newest (highest N) first."""

        def number(path: Path) -> int:
            suffix = path.stem.rsplit("_", 1)[-1]
            return int(suffix) if suffix.isdigit() else -1

        return sorted(self.path.glob("hpc_ckpt_*.ckpt"), key=number, reverse=True)

    def resumable(self) -> bool:
        """Something to continue: a full checkpoint, or (cross-validation, ``cv.folds``)
        a ``fold_<k>`` run with a checkpoint or finished."""
        if self.has_checkpoint():
            return True
        folds = (RunDir(d) for d in self.path.glob("fold_*"))
        return any(f.has_checkpoint() or f.finished for f in folds)

    def has_checkpoint(self) -> bool:
        """A full checkpoint to continue from exists (``last.ckpt``, its ``.prev``, or hpc)."""
        return any(self.checkpoints.glob("last.ckpt*")) or bool(self.hpc_checkpoints())
