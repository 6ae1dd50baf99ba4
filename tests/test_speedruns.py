"""The speedrun recipes (experiment=speedrun_*) compose and train a few steps on small generated
data in their real layout: the CIFAR-10 one cannot be timed on this machine (no data), so this
is what says its config runs; the batch path keeps channels_last after shift/flip."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from experiments.data import store
from experiments.training.pipeline import train
from tests.helpers import write_cifar10, write_mnist

# four steps an epoch, three epochs (past both warm-ups), so the one-cycle
# schedule is built and stepped as the recipe does
FEW_STEPS = [
    "trainer.limit_train_batches=4", "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1", "trainer.max_epochs=3", "data.num_workers=0", "logger=none",
]  # fmt: skip


def _train_and_watch(cfg) -> tuple[dict, list[torch.Tensor]]:
    """``train(cfg)``, with every training input the net (built inside train) was given."""
    seen: list[torch.Tensor] = []
    net_class = cfg.model.net._target_.rpartition(".")[2]

    def hook(module, args):  # torch's global pre-hook: every module; keep the net's input
        if type(module).__name__ == net_class and module.training:
            seen.append(args[0].detach())

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        metrics = train(cfg)
    finally:
        handle.remove()
    return metrics, seen


def test_speedrun_cifar10_trains_on_cifar_layout_data(make_cfg, tmp_path):
    write_cifar10(tmp_path / "data", per_batch=40)
    cfg = make_cfg(
        "experiment=speedrun_cifar10", f"paths.data_dir={tmp_path / 'data'}",
        "data.batch_size=16", "model.net.widths=[8,8,8,8]", *FEW_STEPS,
    )  # fmt: skip
    assert cfg.model.net._target_.endswith("ResNet9") and cfg.model.channels_last
    assert cfg.trainer.precision == "bf16-mixed" and cfg.model.scheduler_interval == "step"
    assert cfg.model.label_smoothing > 0 and cfg.optimizer.nesterov
    # flips + translate, both with a whole-batch form (no per-sample Python)
    batch_augment = store.batch_augmenter(instantiate(cfg.data.augment))
    assert batch_augment is not None and len(batch_augment.steps) == 2
    metrics, seen = _train_and_watch(cfg)
    for key in ("train/loss", "val/acc", "test/acc"):
        assert torch.isfinite(torch.tensor(metrics[key])), key
    # the shifted and flipped batch reaches the net in channels_last (oneDNN's NHWC path)
    assert len(seen) == 12 and all(x.shape == (16, 3, 32, 32) for x in seen)
    assert all(x.is_contiguous(memory_format=torch.channels_last) for x in seen)
    assert not all(x.is_contiguous() for x in seen)


def test_speedrun_fashion_mnist_trains_on_fashion_layout_data(make_cfg, tmp_path):
    write_mnist(tmp_path / "data", folder="FashionMNIST", n_train=120, n_test=20)
    cfg = make_cfg(
        "experiment=speedrun_fashion_mnist", f"paths.data_dir={tmp_path / 'data'}",
        "data.batch_size=16", *FEW_STEPS,
    )  # fmt: skip
    assert cfg.data.dataset == "fashion_mnist" and cfg.model.net._target_.endswith("SpeedNet")
    assert list(cfg.model.net.widths) == [32, 64, 128] and cfg.model.channels_last
    assert cfg.trainer.precision == "bf16-mixed"
    assert cfg.data.augment is None  # flips cost accuracy here (the footwear faces one way)
    metrics, seen = _train_and_watch(cfg)
    assert torch.isfinite(torch.tensor(metrics["test/acc"]))
    assert len(seen) == 12 and all(x.shape == (16, 1, 28, 28) for x in seen)


@pytest.mark.parametrize("name", ["speedrun_mnist", "speedrun_fashion_mnist"])
def test_speedrun_ablation_keys_compose(make_cfg, name):
    # the keys docs/recipes.md's ablations name switch each technique off (flips: on)
    flips = "++data.augment._target_=torchvision.transforms.v2.RandomHorizontalFlip"
    cfg = make_cfg(
        f"experiment={name}", flips, "model.channels_last=false",
        "model.label_smoothing=0", "trainer.precision=32-true", "scheduler=none",
        "~scheduler.warmup_epochs",
    )  # fmt: skip
    batch = store.batch_augmenter(instantiate(cfg.data.augment))
    assert [type(s).__name__ for s in batch.steps] == ["_Flip"] and not cfg.model.channels_last
    assert cfg.model.label_smoothing == 0 and cfg.trainer.precision == "32-true"
    assert not cfg.scheduler  # {}: no schedule (the recipe's warm-up key dropped with it)
