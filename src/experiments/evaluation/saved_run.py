"""A finished run opened again, as data: its config (with overrides) checked whole against
the closed vocabulary of ``config.allowlist`` and the schema before anything is built; its
data split as it trained; its net with the saved weights. What eval, predict, calibrate
and export start from."""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torchvision.transforms import v2

from experiments.analysis.calibration import T_RANGE
from experiments.callbacks.state_dict_checkpoint import exported
from experiments.config.schema import check
from experiments.data.datasets import read_image
from experiments.data.normalization import normalize, read_stats, resolve_stats
from experiments.errors import UserError, one_line, printable_line
from experiments.models.regression import RegressionModule
from experiments.models.segmentation import SegmentationModule
from experiments.recorded import allowlist
from experiments.recorded.folder import (
    checkpoint_path,
    load_run_config,
    read_sidecar,
    resolved,
    resolved_keys,
    split_trust,
)
from experiments.recorded.saved_net import build_net
from experiments.runs import manifest
from experiments.runs.files import read_json_object
from experiments.runs.layout import RunDir, checkpoint_label, own_role, recorded_epoch, sidecar_of
from experiments.runs.weights import load_state_dict_file
from experiments.training.build import model_extras, one_device_trainer, require_gpu
from experiments.training.model_card import write_model_card

log = logging.getLogger(__name__)

# the Trainer a saved run gets: these keys of its trainer section, one device, nothing else
# (a saved strategy, plugins or callbacks node is never built)
TRAINER_KEYS = ("accelerator", "precision", "deterministic", "benchmark", "limit_test_batches")
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
# where eval/predict overrides may go: the sections they build (and paths they refer to)
OVERRIDABLE = ("data", "model", "paths", *(f"trainer.{k}" for k in TRAINER_KEYS))
# what the builder hands the LightningModule and the net itself
MODULE_GIVEN = ("net", "optimizer", "scheduler", "num_classes", "class_weights", "class_prior")
NET_GIVEN = ("in_shape", "num_classes")
# what a LightningModule of your own (no model.net) may be handed: None for each
OWN_GIVEN = ("optimizer", "scheduler")
MAX_FEATURES = 100_000  # columns a checkpoint's sidecar may name


class SavedRun:
    """A run folder made by ``python -m experiments.train``.

    Args:
        ckpt: ``best``, ``last`` (the run's ``.safetensors``, an older run's ``.pt``) or a
            weights-only ``.safetensors`` / ``.pt`` file.
        overrides: ``key=value`` changes to the saved config (keys must exist; ``+key``
            adds one) of ``data``, ``model``, ``paths`` and ``trainer.{TRAINER_KEYS}``;
            ``trust_modified=true`` (as ``parse_args`` passes it on) is the argument below.
        trust_modified: use the run even when its files differ from its ``manifest.json``
            (each difference is a warning line).

    Raises:
        TamperedError: a file of the run differs from its manifest (exit 1), checked first.
        UserError: no such run folder or checkpoint, an unknown or unused override key, a
            target or key outside the vocabulary, a value of the wrong type or range, a
            statistics file outside the run folder. Nothing has been built then.
    """

    def __init__(
        self,
        run_dir: str | Path,
        ckpt: str = "best",
        overrides: Sequence[str] = (),
        trust_modified: bool = False,
    ):
        self.path = Path(run_dir)
        self.layout = RunDir(self.path)
        trusted, overrides = split_trust(overrides)
        for arg in overrides:  # a key a saved run does not build would be silently ignored
            key = arg.partition("=")[0].lstrip("+~").strip()
            if not any(key == p or key.startswith(p + ".") for p in OVERRIDABLE):
                raise UserError(
                    f"override {key}: not used when a saved run is rebuilt (its Trainer takes "
                    f"only {', '.join(f'trainer.{k}' for k in TRAINER_KEYS)}; data.*, model.* "
                    f"and paths.* may be set)"
                )
        own = {"best": self.layout.best_weights, "last": self.layout.last_weights}.get(ckpt)
        used = [self.layout.saved_config, *([own, sidecar_of(own)] if own else [])]
        # before anything of the run is read: a tampered file is one line, exit 1
        self.integrity = manifest.require_intact(self.path, used, trust_modified or trusted)
        self.cfg = load_run_config(self.path, overrides)
        self.ckpt = checkpoint_path(self.path, ckpt)
        self.data_cfg, self.model_cfg = resolved(self.cfg, "data"), resolved(self.cfg, "model")
        if not isinstance(self.data_cfg, dict) or not isinstance(self.model_cfg, dict):
            raise UserError(f"{self.layout.saved_config} has no data or model section")
        if "net" in self.model_cfg and not isinstance(self.model_cfg["net"], dict):
            raise UserError(f"{self.layout.saved_config} has no model.net section")
        self.trainer_cfg = resolved_keys(self.cfg, "trainer", TRAINER_KEYS)
        # everything that will be built, checked before any of it is
        data, model = self.data_cfg, dict(self.model_cfg)
        allowlist.check(data, "data", "data")
        if self.classifier:
            net = model.pop("net")
            allowlist.check(model, "module", "model", given=MODULE_GIVEN)
            allowlist.check(net, "net", "model.net", given=NET_GIVEN)
        else:  # a module of your own: trusted by EXPERIMENTS_TRUSTED_MODULES, or refused
            allowlist.check(model, "module", "model", given=OWN_GIVEN)
        accelerator = self.trainer_cfg.get("accelerator", "auto")
        if accelerator not in ACCELERATORS:
            raise UserError(
                f"trainer.accelerator={accelerator!r} is not valid; use one of {ACCELERATORS}"
            )
        # the types and bounds train checks (the trainer's too), on the sections as overridden
        # and resolved
        trainer = {"_target_": "lightning.pytorch.Trainer", **self.trainer_cfg}
        check(OmegaConf.create({"data": data, "model": self.model_cfg, "trainer": trainer}))
        stats = data.get("stats_file")
        if stats is not None and not Path(stats).resolve().is_relative_to(self.path.resolve()):
            raise UserError(
                f"data.stats_file={stats} is outside the run folder {self.path}: eval and "
                f"predict read the run's own statistics and write nowhere else; leave it as "
                f"the run saved it (data.stats_file={self.layout.data_stats})"
            )
        if data.get("mean") == "auto" and stats and Path(stats).exists():
            read_stats(Path(stats))  # a corrupt file is one line now, not in a data loader

    def refresh_manifest(self) -> Path | None:
        """Add the files written since the run was opened to its manifest (after the last write)."""
        return manifest.refresh(self.path, self.integrity)

    def finish(self) -> None:
        """After a command's last write: ``model_card.md`` again, then ``refresh_manifest``."""
        write_model_card(self.path)
        self.refresh_manifest()

    @property
    def sidecar(self) -> dict:
        """What was recorded with the checkpoint (epoch, metric, in_shape, class names), or {}."""
        return read_sidecar(self.ckpt)

    @property
    def ckpt_name(self) -> str:
        return self.layout.checkpoint_name(self.ckpt)

    @property
    def ckpt_epoch(self) -> int | None:
        """The 1-based epoch the checkpoint's sidecar records, or None."""
        return recorded_epoch(self.sidecar)

    @cached_property
    def temperature(self) -> float | None:
        """The temperature ``experiments.calibrate`` saved for this checkpoint when it applies,
        else None (never calibrated, kept T = 1, fitted for another checkpoint or epoch); read
        once, with the one line logged that says whether and why it applies.

        Raises:
            UserError: a corrupt ``calibration.json``, or a temperature outside ``T_RANGE``
                (one fitted before the range existed can turn every probability into 1.000).
        """
        path, layout = self.layout.calibration, self.layout
        saved = read_json_object(path)
        if not saved:
            return None
        t = saved.get("temperature")
        number = isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
        if not number or not T_RANGE[0] <= t <= T_RANGE[1]:
            raise UserError(
                f"{path}: temperature {str(t)[:40]} is not a number in [{T_RANGE[0]:g}, "
                f"{T_RANGE[1]:g}] (a fit from before that bound?); run experiments-calibrate "
                f"run_dir={layout.path} again, or delete the file"
            )
        name, now = self.ckpt_name, self.ckpt_epoch
        fitted_for = saved.get("ckpt")
        fitted_for = fitted_for if own_role(fitted_for) else layout.checkpoint_name(fitted_for)
        epoch = saved.get("ckpt_epoch")
        again = f"run experiments-calibrate run_dir={layout.path} ckpt=<it> to fit one"
        applied = None
        if fitted_for != name:
            note = (
                f"{path} was fitted for {fitted_for}, not {name}: probabilities are not "
                f"temperature-scaled; {again}"
            )
        elif isinstance(epoch, int) and now is not None and epoch != now:
            note = (
                f"{path} was fitted for {name} at epoch {epoch}; it now holds epoch {now}: "
                f"probabilities are not temperature-scaled; {again}"
            )
        elif t == 1:
            why = printable_line(saved.get("reason"), 300)
            note = f"{path} keeps T = 1 ({why}): probabilities as trained"
        else:
            applied, label = float(t), checkpoint_label(name, now if now is not None else epoch)
            note = (
                f"probabilities temperature-scaled: T = {t:.4g} from {path} (fitted on the "
                f"validation split for {label})"
            )
        log.info("%s", note)
        return applied

    def transform(self, key: str):
        """``data.<key>`` (e.g. ``eval_transform``) built from the vocabulary, or None."""
        node = self.data_cfg.get(key)
        return None if node is None else allowlist.build(node, "transform", f"data.{key}")

    def image_reader(self, in_shape: Sequence[int]) -> Callable[[Path], torch.Tensor]:
        """One image file to the net's input ``(C, H, W)`` as the run's eval data makes it, before
        ``normalize``: the dataset's own ``read_image`` in ``in_shape``'s channel mode, at the
        training size (``data.image_size``, else ``in_shape``'s), then ``data.eval_transform``.

        Raises:
            UserError: (when called) an unreadable image, or one the transform does not make
                ``in_shape``.
        """
        in_shape = tuple(int(v) for v in in_shape)
        mode = {1: "L", 3: "RGB"}[in_shape[0]]
        size = tuple(self.data_cfg.get("image_size") or in_shape[1:])  # (H, W)
        transform = self.transform("eval_transform") or v2.Compose(
            [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
        )

        def read(path: Path) -> torch.Tensor:
            x = transform(read_image(path, mode, size))
            if tuple(x.shape) != in_shape:
                raise UserError(
                    f"image {path} becomes {tuple(x.shape)} after the eval transform, the net "
                    f"expects {in_shape}; set (+)data.image_size=[H,W] to the size images had "
                    f"in training"
                )
            return x

        return read

    @cached_property
    def input_stats(self) -> tuple[list[float], list[float]] | None:
        """``(mean, std)`` the run trained with (``data_stats.json`` for ``data.mean=auto``,
        never recomputed) that ``normalize`` applies, or None.

        Raises:
            UserError: ``data.mean=auto`` and the run's statistics file is not there.
        """
        mean, std = self.data_cfg.get("mean"), self.data_cfg.get("std")
        stats_file = self.data_cfg.get("stats_file") if mean == "auto" else None
        return resolve_stats(mean, std, stats_file, train_split=None)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """A batch ``(B, C, H, W)`` from ``image_reader`` normalized as the data module
        normalizes its batches, with ``input_stats`` (and its ``UserError``)."""
        stats = self.input_stats
        return x if stats is None else normalize(x, *stats)

    @cached_property
    def datamodule(self):
        """The data as it trained: the same seeded train/val/test split, the same statistics."""
        data = dict(self.data_cfg)
        if data.get("download"):
            log.info("data.download=true is not followed here: a saved run reads its data")
            data["download"] = False
        datamodule = allowlist.build(data, "data", "data")
        # no prepare_data(): it exports or downloads, and a saved run only reads (the
        # digits' presence is checked before anything is built)
        datamodule.setup("fit")
        return datamodule

    @cached_property
    def net(self) -> torch.nn.Module:
        dm = self.datamodule
        return build_net(self.model_cfg["net"], dm.input_shape, dm.num_classes, self.ckpt)

    @property
    def classifier(self) -> bool:
        """Whether the run trained an image classifier (a ``model.net`` in our module): what
        predict, calibrate, export and eval's calibration numbers need."""
        return "net" in self.model_cfg

    @cached_property
    def task(self) -> str:
        """``classification`` (our module around ``model.net``), ``regression`` or
        ``segmentation`` (our ``RegressionModule``, ``SegmentationModule``), or ``own``: a
        module of yours, whose output only its own code knows."""
        if self.classifier:
            return "classification"
        tasks = {RegressionModule: "regression", SegmentationModule: "segmentation"}
        return tasks.get(allowlist.locate(self.model_cfg["_target_"], "module", "model"), "own")

    @property
    def feature_names(self) -> list[str]:
        """The feature columns a regression run trained on, in order: its checkpoint
        sidecar's ``feature_names``, else (an older sidecar) the run's data module's.

        Raises:
            UserError: a sidecar whose ``feature_names`` is not a list of column names.
        """
        names = self.sidecar.get("feature_names")
        if names is None:
            return [str(n) for n in getattr(self.datamodule, "feature_names", None) or []]
        ok = isinstance(names, list) and 0 < len(names) <= MAX_FEATURES
        if not ok or not all(isinstance(n, str) and 0 < len(n) <= 1000 for n in names):
            raise UserError(
                f"{sidecar_of(self.ckpt)}: feature_names={str(names)[:60]} is not a list of 1 "
                f"to {MAX_FEATURES} column names; restore the file, or delete it to read them "
                f"from the run's data"
            )
        return names

    def require_classifier(self, command: str) -> None:
        """Raises ``UserError`` (naming the run's module and what works for it instead) unless
        the run trained an image classifier, for a ``command`` only such a run can answer."""
        if not self.classifier:
            raise UserError(
                f"{command} needs an image classifier's run; {self.path} trained "
                f"{self.model_cfg.get('_target_')} (a module of your own, no model.net): "
                f"python -m experiments.eval {self.path} tests it with its own test_step"
            )

    def module(self):
        """The LightningModule (no optimizer) with the checkpoint's weights, for
        ``trainer.test``: ours around ``net``, or a module of your own built from its config
        with ``optimizer``/``scheduler`` None where it takes them, the weights loaded where
        its checkpoints took them from (``callbacks.state_dict_checkpoint.exported``)."""
        if not self.classifier:
            node = dict(self.model_cfg)
            takes = inspect.signature(allowlist.locate(node["_target_"], "module", "model"))
            given = {k: None for k in OWN_GIVEN if k in takes.parameters}
            module = allowlist.build(node, "module", "model", **given)
            load_state_dict_file(exported(module), self.ckpt)
            return module.eval()
        model = {k: v for k, v in self.model_cfg.items() if k != "net"}
        model.pop("init_from", None)  # recorded by training; eval starts from the checkpoint
        given = {
            "net": self.net,
            "optimizer": None,
            "scheduler": None,
            "num_classes": self.datamodule.num_classes,
            **model_extras(model, self.datamodule),
        }
        return allowlist.build(model, "module", "model", **given)

    def trainer(self):
        """A Trainer on one device from ``TRAINER_KEYS`` of the run's trainer section only."""
        require_gpu(self.trainer_cfg.get("accelerator"), "; add trainer.accelerator=cpu (or auto)")
        try:
            return one_device_trainer(**self.trainer_cfg, default_root_dir=str(self.path),
                                      logger=False, enable_model_summary=False)  # fmt: skip
        except (ValueError, TypeError) as err:
            raise UserError(f"trainer: {one_line(err)}") from None

    def has_split(self, split: str) -> bool:
        return len(getattr(self.datamodule, f"{split}_set", None) or ()) > 0

    def logits(self, split: str, views=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The net's logits ``(N, K)`` and the labels ``(N,)`` of a whole split, on the CPU; with
        ``views`` (a batch ``(B, C, H, W)`` to a list of batches: test-time augmentation,
        ``tta_views``) the log of the mean softmax over the views."""
        if not self.has_split(split):
            raise UserError(f"{self.path}: the run has no {split} split")
        dm, net = self.datamodule, self.net
        outs, labels = [], []
        with torch.inference_mode():
            for batch in getattr(dm, f"{split}_dataloader")():
                x, y = dm.on_after_batch_transfer(batch, 0)  # normalized as in training
                if views is None:
                    outs.append(net(x).float())
                else:
                    probs = torch.stack([net(v).float().softmax(1) for v in views(x)])
                    outs.append(probs.mean(0).log())
                labels.append(y)
        return torch.cat(outs), torch.cat(labels)

    def normalization(self) -> tuple[list[float], list[float]] | None:
        """``(mean, std)`` the data module normalizes batches with, or None."""
        stats = getattr(self.datamodule, "stats", None)
        return (list(stats[0]), list(stats[1])) if stats is not None else None
