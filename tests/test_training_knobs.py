"""Training knobs: EMA weights, early stopping, schedules, label smoothing; and their bad
values refused before anything is built."""

from __future__ import annotations

import json

import pytest
import torch

from experiments.errors import UserError
from experiments.runs.layout import RunDir
from experiments.runs.weights import read_state_dict
from experiments.training.pipeline import train
from tests.helpers import EXACT, assert_same_training_state


def _ckpt(path):
    return torch.load(path, weights_only=True)


@pytest.mark.slow
def test_ema_weights_are_validated_and_saved_and_resume_stays_bit_exact(make_cfg, tmp_path):
    # (a constant LR: a schedule over the whole run changes when max_epochs is raised)
    ema = ["model.ema_decay=0.9"]

    def run(name, *extra):
        return train(make_cfg(*EXACT, *ema, f"paths.output_dir={tmp_path / name}", *extra))

    run("A", "trainer.max_epochs=4")
    run("B", "trainer.max_epochs=2")
    run("B", "trainer.max_epochs=4", f"resume={tmp_path / 'B'}")
    # the full checkpoints hold the EMA too (the WeightAveraging callback's state): equal
    # after resume
    assert_same_training_state(
        tmp_path / "A/checkpoints/last.ckpt", tmp_path / "B/checkpoints/last.ckpt"
    )
    ckpt = _ckpt(tmp_path / "A/checkpoints/last.ckpt")
    average = ckpt["callbacks"]["WeightAveraging"]["average"]
    exported = read_state_dict(RunDir(tmp_path / "A").last_weights)
    assert all(torch.equal(exported[k], average[f"net.{k}"]) for k in exported)  # the EMA
    assert any(not torch.equal(exported[k], ckpt["state_dict"][f"net.{k}"]) for k in exported)


@pytest.mark.slow
def test_the_validated_weights_are_the_ema(make_cfg, tmp_path):
    from hydra.utils import instantiate

    cfg = make_cfg("model.ema_decay=0.5", "trainer.max_epochs=2", "logger=none", "test=false")
    metrics = train(cfg)
    dm = instantiate(cfg.data)
    dm.setup("fit")
    net = instantiate(cfg.model.net, in_shape=dm.input_shape, num_classes=dm.num_classes)
    net.load_state_dict(read_state_dict(RunDir(tmp_path / "run").last_weights))  # the EMA
    net.eval()
    with torch.no_grad():
        right = sum(int((net(x).argmax(1) == y).sum()) for x, y in dm.val_dataloader())
    assert right / len(dm.val_set) == pytest.approx(metrics["val/acc"], abs=1e-6)


@pytest.mark.slow
def test_early_stopping_stops_when_the_metric_stalls(make_cfg, tmp_path):
    cfg = make_cfg(
        "optimizer.lr=0.0",  # nothing learns: val/acc never improves after the first epoch
        "optimizer.momentum=0.0",
        "trainer.max_epochs=20",
        "callbacks.early_stopping.enabled=true",
        "callbacks.early_stopping.patience=2",
        "logger=none",
    )
    train(cfg)
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["epochs"] == 3


def test_one_cycle_runs_however_few_the_steps():
    # a warm-up of exactly one step (6 steps, warmup 1/6 of the run) made torch divide by 0
    from experiments.models.schedules import one_cycle

    for steps in range(1, 13):
        for warmup in (0.0, 0.5, 1.0, 3.0):
            optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
            schedule = one_cycle(optimizer, total_steps=steps, total_epochs=6, warmup_epochs=warmup)
            for _ in range(steps):
                optimizer.step()
                schedule.step()


def test_warmup_cosine_and_one_cycle_schedules_have_the_right_shape():
    from experiments.models.schedules import one_cycle, warmup_cosine

    def lrs(make):
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        sched = make(opt)
        out = []
        for _ in range(100):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    cosine = lrs(lambda o: warmup_cosine(o, total_steps=100, total_epochs=10, warmup_epochs=2))
    assert cosine[0] == pytest.approx(0.05) and cosine[19] == pytest.approx(1.0)
    assert cosine == sorted(cosine[:20]) + sorted(cosine[20:], reverse=True)
    assert cosine[-1] < 0.01
    cycle = lrs(lambda o: one_cycle(o, total_steps=100, total_epochs=10, warmup_epochs=3))
    assert max(cycle) == pytest.approx(1.0) and cycle.index(max(cycle)) in (29, 30)
    assert cycle[0] == pytest.approx(1 / 25) and cycle[-1] < 1e-3


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["augment=nope"], "augment=nope"),
        (["model.ema_decay=1.5"], "model.ema_decay"),
        (["model.ema_decay=0"], "model.ema_decay"),
        (["model.label_smoothing=1.0"], "model.label_smoothing"),
        (["scheduler=warmup_cosine", "scheduler.warmup_epochs=30"], "scheduler.warmup_epochs"),
        (["data.split=sorted"], "data.split"),
        (["data.mixup_alpha=-1"], "data.mixup_alpha"),
    ],
)
def test_bad_knob_values_are_refused_before_hydra(tmp_path, monkeypatch, overrides, named):
    from experiments.cli.check import precheck
    from experiments.config import CONF_DIR

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as err:
        precheck(overrides, str(CONF_DIR))
    assert named in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("lr, warned", [("2", True), ("0.1", False)])
def test_an_exploding_first_val_loss_names_a_lower_learning_rate(make_cfg, caplog, lr, warned):
    cfg = make_cfg("model=cnn", f"optimizer.lr={lr}", "trainer.max_epochs=1", "logger=none")
    with caplog.at_level("WARNING", logger="experiments.callbacks.fault_tolerance"):
        train(cfg)
    hints = [r.getMessage() for r in caplog.records if "likely diverging" in r.getMessage()]
    assert bool(hints) == warned
    if warned:
        assert "try optimizer.lr=0.2 (it is 2)" in hints[0]
