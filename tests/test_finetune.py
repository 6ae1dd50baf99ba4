"""Fine-tuning: backbones by name with pretrained weights files, init_from an earlier run,
the frozen-then-unfrozen backbone with its own learning rate, exact across resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from experiments.errors import UserError
from experiments.models import backbone
from experiments.runs.layout import RunDir
from experiments.runs.weights import read_state_dict
from experiments.training.build import datamodule_and_model
from experiments.training.pipeline import train
from tests.helpers import REPO, run_inproc

ENV = {"PYTHONPATH": str(REPO)}
QUICK = ["logger=none", "test=false", "data.num_workers=0", "seed=0"]


def _assert_tensors_equal(net_state: dict, file_state: dict, skip: str) -> int:
    checked = 0
    for key, value in file_state.items():
        if key.startswith(skip):
            continue
        assert torch.equal(net_state[key], value), key
        checked += 1
    return checked


def test_timm_backbone_loads_a_weights_file_with_a_new_head_and_gray_stem(tmp_path):
    import timm

    source = timm.create_model("test_resnet", num_classes=1000)
    torch.save(source.state_dict(), tmp_path / "w.pt")
    net = backbone((1, 28, 28), 7, "test_resnet", "timm", str(tmp_path / "w.pt"))
    state, file_state = net.state_dict(), source.state_dict()
    stem = next(k for k in file_state if k.endswith("weight") and file_state[k].ndim == 4)
    assert torch.allclose(state[stem], file_state[stem].sum(dim=1, keepdim=True))
    head = net.pretrained_cfg["classifier"]
    assert state[f"{head}.weight"].shape[0] == 7
    body = {k: v for k, v in file_state.items() if k != stem}
    assert _assert_tensors_equal(state, body, head) > 20
    # the normalization the weights were trained with, averaged over RGB for one channel
    mean = sum(source.pretrained_cfg["mean"]) / 3
    assert net.pretrained_norm[0] == [pytest.approx(mean)]
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 7)


def test_torchvision_backbone_loads_a_weights_file_and_its_cache(tmp_path, monkeypatch):
    import torchvision

    source = torchvision.models.resnet18(num_classes=1000)
    torch.save(source.state_dict(), tmp_path / "r18.pth")
    net = backbone((3, 64, 64), 5, "resnet18", "torchvision", str(tmp_path / "r18.pth"))
    assert net.fc.out_features == 5
    assert _assert_tensors_equal(net.state_dict(), source.state_dict(), "fc.") > 100
    assert net.pretrained_norm == ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    # pretrained=true reads torch hub's cache and never downloads unless asked
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "hub"))
    with pytest.raises(UserError, match="no cached weights for torchvision resnet18"):
        backbone((3, 64, 64), 5, "resnet18", "torchvision", True)
    url = torchvision.models.ResNet18_Weights.DEFAULT.url
    cached = tmp_path / "hub" / "hub" / "checkpoints" / Path(url).name
    cached.parent.mkdir(parents=True)
    torch.save(source.state_dict(), cached)
    net = backbone((3, 64, 64), 5, "resnet18", "torchvision", True)
    assert torch.equal(net.layer4[1].conv2.weight, source.layer4[1].conv2.weight)


def test_weights_that_do_not_fit_name_what_is_missing_unexpected_or_misshapen(tmp_path):
    import timm

    torch.save(timm.create_model("test_resnet").state_dict(), tmp_path / "other.pt")
    with pytest.raises(UserError) as err:
        backbone((3, 32, 32), 10, "test_convnext", "timm", str(tmp_path / "other.pt"))
    line = str(err.value)
    assert "\n" not in line and "missing" in line and "unexpected" in line, line
    state = timm.create_model("test_resnet").state_dict()
    key = next(k for k in state if k.endswith("conv2.weight"))
    state[key] = torch.zeros(3, 3, 1, 1)
    torch.save(state, tmp_path / "bad_shape.pt")
    with pytest.raises(UserError, match=f"1 of the wrong shape .e.g. {key}"):
        backbone((3, 32, 32), 10, "test_resnet", "timm", str(tmp_path / "bad_shape.pt"))


def test_unknown_backbone_is_one_line_with_close_matches_exit_2(tmp_path, data_dir):
    res = run_inproc(
        "-m",
        "experiments.train",
        "model=backbone",
        "model.net.name=resnet81",
        f"paths.data_dir={data_dir}",
        "logger=none",
        cwd=tmp_path,
        env_extra=ENV,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "resnet81" in lines[0] and "did you mean resnet18" in lines[0]
    assert "Traceback" not in res.stderr


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, data_dir):
    """A digits CNN trained for one epoch: its best weights are what init_from loads."""
    from hydra import compose, initialize_config_dir

    from experiments.config import CONF_DIR

    out = tmp_path_factory.mktemp("pretrained")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                f"paths.data_dir={data_dir}",
                f"paths.output_dir={out}",
                "model=cnn",
                "trainer.max_epochs=1",
                *QUICK,
            ],
        )
    train(cfg)
    return out


def test_init_from_a_run_reproduces_its_backbone_and_drops_a_misfit_head(make_cfg, finished_run):
    best = read_state_dict(RunDir(finished_run).best_weights)
    _, model = datamodule_and_model(make_cfg("model=cnn", f"model.init_from={finished_run}"))
    assert _assert_tensors_equal(model.net.state_dict(), best, skip="~") == len(best)
    # another class count (4 random classes of 8x8 images): the head is new, the rest the run's
    cfg = make_cfg(
        "model=cnn",
        f"model.init_from={finished_run}",
        "data.dataset={_target_:tests.helpers.random_sets,_partial_:true,n:200}",
    )
    _, model = datamodule_and_model(cfg)
    state = model.net.state_dict()
    assert state["head.3.weight"].shape[0] != best["head.3.weight"].shape[0]
    assert _assert_tensors_equal(state, best, skip="head.3") == len(best) - 2


def test_init_from_a_run_without_best_weights_is_one_line(make_cfg, tmp_path):
    empty = tmp_path / "empty_run"
    empty.mkdir()
    with pytest.raises(UserError, match=f"has no checkpoints/{RunDir(empty).best_weights.name}"):
        datamodule_and_model(make_cfg("model=cnn", f"model.init_from={empty}"))


FREEZE = [
    "model=cnn",
    "optimizer=adamw",
    "optimizer.lr=0.002",
    "model.freeze_backbone_epochs=1",
    "model.backbone_lr_scale=0.1",
    "data.dataset={_target_:tests.helpers.random_sets,_partial_:true,n:640}",
    "data.batch_size=32",
    "trainer.max_epochs=3",
    "callbacks.state_dict_checkpoint.save_last=true",
]


def test_backbone_frozen_for_n_epochs_with_batchnorm_in_eval_then_trained(make_cfg, tmp_path):
    from lightning.pytorch.callbacks import Callback

    seen: list[dict] = []

    class Snap(Callback):
        def on_train_epoch_end(self, trainer, pl_module) -> None:
            seen.append({k: v.clone() for k, v in pl_module.net.state_dict().items()})

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            bn = pl_module.net.features[1]
            assert bn.training == (trainer.current_epoch >= 1), trainer.current_epoch

    cfg = make_cfg(*FREEZE, *QUICK, f"paths.output_dir={tmp_path / 'run'}")
    from experiments.training.build import datamodule_and_model as build

    datamodule, model = build(cfg)
    start = {k: v.clone() for k, v in model.net.state_dict().items()}
    import lightning as L

    L.Trainer(
        max_epochs=2,
        callbacks=[Snap()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
    ).fit(model, datamodule=datamodule)
    groups = model.trainer.optimizers[0].param_groups
    assert groups[0]["lr"] == pytest.approx(groups[1]["lr"] * 0.1)
    for key, value in start.items():
        frozen_then = torch.equal(seen[0][key], value)
        assert frozen_then == (not key.startswith("head.")), key  # epoch 0: only the head
        if value.dtype.is_floating_point and not key.endswith("num_batches_tracked"):
            assert not torch.equal(seen[1][key], seen[0][key]), key  # epoch 1: everything


@pytest.mark.slow
def test_freeze_schedule_is_exact_across_a_resume(make_cfg, tmp_path):
    def run(name, *extra):
        return train(make_cfg(*FREEZE, *QUICK, f"paths.output_dir={tmp_path / name}", *extra))

    run("A", "trainer.max_epochs=2")  # epoch 1 frozen, epoch 2 trained
    run("B", "trainer.max_epochs=1")  # stops while the backbone is still frozen
    run("B", f"resume={tmp_path / 'B'}", "trainer.max_epochs=2")
    a = torch.load(tmp_path / "A/checkpoints/last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "B/checkpoints/last.ckpt", weights_only=True)["state_dict"]
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.slow
def test_pretrained_backbone_run_takes_the_weights_statistics_and_evals_without_the_file(
    tmp_path, data_dir
):
    import json

    import timm

    weights = tmp_path / "w.pt"
    torch.save(timm.create_model("test_resnet").state_dict(), weights)
    run = tmp_path / "run"
    common = [f"paths.data_dir={data_dir}", "logger=none", "data.num_workers=0"]
    res = run_inproc(
        "-m",
        "experiments.train",
        "model=backbone",
        "model.net.name=test_resnet",
        f"model.net.pretrained={weights}",
        "model.net.small_input=true",
        "data.mean=auto",
        "data.std=auto",
        "trainer.max_epochs=1",
        f"hydra.run.dir={run}",
        *common,
        cwd=tmp_path,
        env_extra=ENV,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    said = res.stdout + res.stderr
    assert "model.net.pretrained=" in said and " new (fc.weight, fc.bias)" in said, said[-3000:]
    stats = json.loads((run / "data_stats.json").read_text())
    mean = sum(timm.create_model("test_resnet").pretrained_cfg["mean"]) / 3
    assert stats["computed_from"] == "weights" and stats["mean"] == [pytest.approx(mean)]
    weights.unlink()  # eval rebuilds the net, loads the best weights; the pretrained file is gone
    res = run_inproc("-m", "experiments.eval", f"run_dir={run}", cwd=tmp_path, env_extra=ENV)
    assert res.returncode == 0, res.stderr[-3000:]
    trained = json.loads((run / "metrics.json").read_text())
    evaluated = json.loads((run / "eval_metrics.json").read_text())
    assert evaluated["test/acc"] == trained["test/acc"]
