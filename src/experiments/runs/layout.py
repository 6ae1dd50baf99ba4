"""Where everything of one run lives, in one place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PREVIOUS_SUFFIX = ".prev"  # the full checkpoint before the newest one (see checkpoint_io)


def sidecar_epoch(sidecar: dict) -> int:
    """The 1-based epoch a ``best.json``/``last.json`` records (run dirs written before
    sidecars counted from 1 hold a 0-based one)."""
    epoch = int(sidecar.get("epoch", 0))
    return epoch if sidecar.get("epoch_base") == 1 else epoch + 1


@dataclass(frozen=True)
class RunDir:
    """A run folder as ``python -m experiments.train`` makes it::

    <run>/.hydra/{config,overrides}.yaml   the composed config and the command's overrides
    <run>/checkpoints/last.ckpt[.prev]      full checkpoints (weights, optimizer, loops, RNG)
    <run>/checkpoints/{best,last}.pt[.json] weights-only state_dicts + sidecars
    <run>/hpc_ckpt_N.ckpt                   Lightning's SLURM pre-emption checkpoints
    <run>/metrics.json                      written when the run finished
    <run>/eval_metrics.json, reliability.png  experiments.eval (test metrics, ECE)
    <run>/calibration.json                  experiments.calibrate (temperature, ECE)
    <run>/model.onnx | model.torchscript.pt, export.json   experiments.export
    <run>/model_card.md                     what the model is, refreshed by each of those
    <run>/env.json                          provenance (git, versions, host, SLURM job)
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
    def best_pt(self) -> Path:
        return self.checkpoints / "best.pt"

    @property
    def best_json(self) -> Path:
        return self.checkpoints / "best.json"

    def best_value(self, metric: str) -> float | None:
        """``metric`` at the best epoch (the one ``best.pt`` holds, ``best.json``'s value),
        when that is the metric ``best.pt`` was chosen by; else None."""
        import json

        try:
            best = json.loads(self.best_json.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(best, dict) or best.get("monitor") != metric:
            return None
        value = best.get("value")
        if not isinstance(value, int | float) or isinstance(value, bool):
            return None
        return float(value)

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
