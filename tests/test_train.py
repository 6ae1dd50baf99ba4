"""Real Lightning runs of train(cfg) on CPU: fast_dev_run per data x model, learning, seeding."""

from __future__ import annotations

import json

import pytest
import torch

from experiments.errors import find_user_error
from experiments.training.pipeline import train
from tests.helpers import write_cifar10, write_image_folder, write_mnist


def _data_overrides(name, tmp_path):
    if name == "image_csv":
        csv_file, image_dir = write_image_folder(tmp_path / "imgs", n=30, vary=True)
        return [f"data.csv_file={csv_file}", f"data.image_dir={image_dir}"]
    if name in ("mnist", "fashion_mnist"):
        write_mnist(tmp_path / "tv", "MNIST" if name == "mnist" else "FashionMNIST")
    if name == "cifar10":
        write_cifar10(tmp_path / "tv")
    if name == "digits":
        return []
    return [f"data.root={tmp_path / 'tv'}", "data.num_workers=0", "data.persistent_workers=false"]


PAIRS = [
    ("digits", "mlp"),
    ("digits", "cnn"),
    ("digits", "resnet18"),
    ("image_csv", "mlp"),
    ("image_csv", "cnn"),
    ("mnist", "cnn"),
    ("fashion_mnist", "mlp"),
    ("cifar10", "resnet18"),
]


@pytest.mark.parametrize(("data", "model"), PAIRS)
def test_fast_dev_run(make_cfg, tmp_path, data, model):
    cfg = make_cfg(f"data={data}", f"model={model}", "debug=fast", *_data_overrides(data, tmp_path))
    metrics = train(cfg)
    for key in ("train/loss", "val/acc", "test/acc", "test/loss"):
        assert key in metrics and torch.isfinite(torch.tensor(metrics[key])), key
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["test/acc"] == metrics["test/acc"] and saved["seed"] == 42


def test_experiment_preset_runs(make_cfg):
    cfg = make_cfg("experiment=digits_cnn", "debug=fast")
    assert cfg.model.net._target_.endswith("CNN") and cfg.optimizer._target_.endswith("AdamW")
    metrics = train(cfg)
    assert 0.0 < metrics["test/acc"] <= 1.0 and metrics["train/loss"] == metrics["train/loss"]


def test_one_hot_targets_train(make_cfg):
    cfg = make_cfg(
        "debug=fast",
        "+data.target_transform._target_=experiments.data.OneHot",
        "+data.target_transform.num_classes=10",
    )
    assert torch.isfinite(torch.tensor(train(cfg)["train/loss"]))


@pytest.mark.slow
def test_default_config_learns_digits(make_cfg):
    # the default config as a user runs it (seed 42): a real learning check, not "went up"
    metrics = train(make_cfg())
    assert metrics["val/acc"] >= 0.9
    assert metrics["test/acc"] >= 0.95


def _limited(make_cfg, tmp_path, seed, name):
    return train(
        make_cfg(
            f"seed={seed}",
            "debug=limit",
            "trainer.deterministic=true",
            "model.net.dropout=0.2",
            "logger=none",
            "test=false",
            f"paths.output_dir={tmp_path / name}",
        )
    )


def test_seed_zero_is_honoured(make_cfg, tmp_path):
    a = _limited(make_cfg, tmp_path, 0, "a")
    b = _limited(make_cfg, tmp_path, 0, "b")
    c = _limited(make_cfg, tmp_path, 1, "c")
    assert a == b
    assert a["train/loss"] != c["train/loss"]


def test_freeze_keeps_weights_and_leaves_them_out_of_the_optimizer(make_cfg):
    from hydra.utils import instantiate

    cfg = make_cfg("model.freeze=[0]", "debug=fast")  # MLP: index 0 is Flatten, 1 is Linear
    with pytest.raises(Exception) as info:
        train(cfg)
    assert "'0' matches no parameter" in str(find_user_error(info.value))
    cfg = make_cfg("model.freeze=[1]")
    net = instantiate(cfg.model.net, in_shape=(1, 8, 8), num_classes=10)
    model = instantiate(cfg.model, net=net, optimizer=instantiate(cfg.optimizer), scheduler=None)
    before = net[1].weight.detach().clone()
    opt = model.configure_optimizers()
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert id(net[1].weight) not in in_opt and id(net[3].weight) in in_opt
    x = torch.randn(4, 1, 8, 8)
    model.loss_fn(net(x), torch.tensor([0, 1, 2, 3])).backward()
    opt.step()
    assert torch.equal(before, net[1].weight)


def test_train_epoch_accuracy_and_loss_are_those_of_every_training_sample(make_cfg, tmp_path):
    """With lr=0 the weights never move, so the epoch's train/acc and train/loss must equal
    the net's accuracy and mean loss over the whole training split, however it was batched;
    a run stopped by max_steps mid-epoch still records them."""
    from hydra.utils import instantiate

    cfg = make_cfg("optimizer.lr=0.0", "trainer.max_epochs=1", "logger=none", "test=false")
    cfg.optimizer.momentum = 0.0
    metrics = train(cfg)
    dm = instantiate(cfg.data)
    dm.setup("fit")
    net = instantiate(cfg.model.net, in_shape=dm.input_shape, num_classes=dm.num_classes)
    from experiments.runs.layout import RunDir
    from experiments.runs.weights import read_state_dict

    net.load_state_dict(read_state_dict(RunDir(tmp_path / "run").last_weights))
    x, y = (torch.cat(t) for t in zip(*dm.train_dataloader(), strict=True))
    with torch.no_grad():
        logits = net(x)
    loss = torch.nn.functional.cross_entropy(logits, y, label_smoothing=cfg.model.label_smoothing)
    assert metrics["train/acc"] == pytest.approx(float((logits.argmax(1) == y).float().mean()))
    assert metrics["train/loss"] == pytest.approx(float(loss), rel=1e-5)

    stopped = train(
        make_cfg("+trainer.max_steps=3", f"paths.output_dir={tmp_path / 'b'}", "logger=none")
    )
    assert 0.0 <= stopped["train/acc"] <= 1.0 and stopped["train/loss"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("extra", [[], ["trainer.devices=2", "trainer.strategy=ddp"]])
def test_bf16_mixed_on_a_gpu_trains_to_finite_metrics(make_cfg, tmp_path, extra):
    if extra and torch.cuda.device_count() < 2:
        pytest.skip("DDP on GPUs needs two of them; one is visible")
    cfg = make_cfg("trainer=gpu", "trainer.precision=bf16-mixed", "debug=fast", *extra)
    metrics = train(cfg)
    assert "test/acc" in metrics
    assert all(torch.isfinite(torch.tensor(float(v))) for v in metrics.values())
