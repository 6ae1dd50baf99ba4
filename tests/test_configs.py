"""Every option of every config group composes and instantiates."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from hydra.utils import get_class, instantiate
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.loggers import Logger
from omegaconf import OmegaConf

from experiments.config import CONF_DIR, schema
from experiments.data import ImageData
from experiments.models import ClassificationModule


def discover() -> list[tuple[str, str]]:
    root = Path(CONF_DIR)
    found = []
    for path in sorted(root.rglob("*.yaml")):
        rel = path.relative_to(root)
        # group/option.yaml (nested groups too); _name.yaml is a fragment options include
        if len(rel.parts) > 1 and not rel.stem.startswith("_"):
            found.append(("/".join(rel.parts[:-1]), rel.stem))
    return found


OPTIONS = discover()
# groups that are not selectable options of train.yaml
SKIP_GROUPS = {"hydra", "paths"}


def test_options_found():
    groups = {g for g, _ in OPTIONS}
    assert len(OPTIONS) >= 20
    assert {
        "data",
        "model",
        "optimizer",
        "scheduler",
        "trainer",
        "callbacks",
        "logger",
        "debug",
        "experiment",
    } <= groups


def test_every_file_starts_with_a_comment_and_example():
    for path in Path(CONF_DIR).rglob("*.yaml"):
        lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("# @package")]
        assert lines[0].startswith("# ") and "Example:" in lines[0], path


@pytest.mark.parametrize(("group", "option"), [o for o in OPTIONS if o[0] not in SKIP_GROUPS])
def test_option_composes_and_instantiates(make_cfg, group, option, tmp_path):
    extra = []
    if (group, option) in (("data", "image_csv"), ("experiment", "finetune")):
        extra = [f"data.csv_file={tmp_path}/x.csv", f"data.image_dir={tmp_path}"]
    if (group, option) in (("data", "diabetes"), ("model", "regressor")):
        extra = ["experiment=diabetes"]  # the regression task's parts compose as its recipe
    if (group, option) in (("data", "shapes"), ("model", "unet")):
        extra = ["experiment=shapes"]  # and segmentation's
    cfg = make_cfg(f"{group}={option}", *extra)
    schema.check(cfg)
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves

    if "net" not in cfg.model:  # a task module with its own layers (regression)
        from experiments.training.build import optimizer_partials

        model = instantiate(cfg.model, **optimizer_partials(cfg))
        assert isinstance(model, LightningModule)
        assert isinstance(instantiate(cfg.data), LightningDataModule)
    else:
        net = instantiate(cfg.model.net, in_shape=(3, 32, 32), num_classes=7)
        assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 7)
        model = instantiate(
            cfg.model,
            net=net,
            optimizer=instantiate(cfg.optimizer),
            scheduler=instantiate(cfg.scheduler) if cfg.scheduler else None,
            num_classes=7,
        )
        assert isinstance(model, ClassificationModule)
        assert isinstance(instantiate(cfg.data), ImageData)
    optimizer = instantiate(cfg.optimizer)(model.parameters())
    if cfg.scheduler:  # a schedule over the whole run is told its length by the module
        factory = instantiate(cfg.scheduler)
        whole_run = "total_steps" in inspect.signature(factory).parameters
        length = {"total_steps": 100, "total_epochs": cfg.trainer.max_epochs} if whole_run else {}
        assert factory(optimizer, **length) is not None
    from experiments.training import build

    callbacks = build.callbacks(cfg, with_logger=True)
    assert callbacks and all(isinstance(c, Callback) for c in callbacks)
    for node in cfg.logger.values():
        assert isinstance(instantiate(node), Logger)
    trainer_cfg = cfg.trainer
    if trainer_cfg.accelerator == "gpu" and not torch.cuda.is_available():
        # no GPU on CI: check that everything else about the preset builds a Trainer
        trainer_cfg = OmegaConf.merge(trainer_cfg, {"accelerator": "cpu"})
        strategy = trainer_cfg.get("strategy")
        if OmegaConf.is_dict(strategy):  # FSDP needs CUDA: check its keys, then run on CPU
            cls = get_class(strategy._target_)
            keys = {k for k in strategy if not k.startswith("_")}
            inspect.signature(cls).bind_partial(**{k: None for k in keys})
            trainer_cfg = OmegaConf.merge(trainer_cfg, {"strategy": "auto", "precision": "32-true"})
    assert isinstance(instantiate(trainer_cfg, enable_progress_bar=False), Trainer)


def test_hydra_and_paths_groups_resolve(make_cfg):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", return_hydra_config=True)
    assert "runs" in cfg.hydra.run.dir and "multiruns" in cfg.hydra.sweep.dir
    assert cfg.hydra.job.chdir is False


def test_defaults():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", return_hydra_config=True)
    choices = cfg.hydra.runtime.choices
    assert cfg.seed == 42 and cfg.optimized_metric == "val/acc"
    assert (choices.data, choices.model, choices.optimizer) == ("digits", "mlp", "sgd")
    assert (choices.scheduler, choices.logger, choices.trainer) == ("none", "csv", "default")
    assert choices.experiment is None and choices.debug is None
