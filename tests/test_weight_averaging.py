"""``callbacks.weight_averaging``: an EMA or the mean of the last k epochs' weights is what
is validated, saved as best/last weights and tested, for any LightningModule; the raw
weights train on untouched, a resume continues both bit for bit, ``model.ema_decay`` is the
same mechanism (an older run's checkpoint included), and bad values are one line."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from experiments.callbacks import StateDictCheckpoint, WeightAveraging
from experiments.runs.files import read_json
from experiments.runs.layout import RunDir
from experiments.runs.weights import read_state_dict
from experiments.training.pipeline import train
from tests.helpers import (
    EXACT,
    assert_one_line_error,
    assert_same_training_state,
    run_inproc,
    train_cli,
)


class Own(L.LightningModule):
    """A module of your own: layers beside any ``net``, a BatchNorm (buffers, an integer
    counter), plain SGD; it logs ``val/loss``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        return self.out(self.body(x)).squeeze(1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _loader(seed: int) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1) + 0.1 * torch.randn(64, generator=g)), 16)


class EpochWeights(L.Callback):
    """The module's weights at each training epoch's end (a run without averaging: raw)."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, torch.Tensor]] = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.epochs.append({k: v.clone() for k, v in pl_module.state_dict().items()})


def assert_same_average(a: dict, b: dict) -> None:
    """Two ``WeightAveraging`` checkpoint states equal bit for bit."""
    assert {k: v for k, v in a.items() if k not in ("average", "window")} == {
        k: v for k, v in b.items() if k not in ("average", "window")
    }
    torch.testing.assert_close([a["average"], *a["window"]], [b["average"], *b["window"]],
                               rtol=0, atol=0)  # fmt: skip


def _fit(folder: Path, epochs: int, *callbacks, resume: Path | None = None, **kw) -> L.Trainer:
    module = Own()
    trainer = L.Trainer(
        max_epochs=epochs,
        **kw,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        callbacks=[*callbacks, StateDictCheckpoint(str(folder), monitor="val/loss", mode="min")],
    )
    trainer.fit(module, _loader(1), _loader(2), ckpt_path=resume)
    trainer.save_checkpoint(folder / "last.ckpt")  # after fit: the module holds the average
    return trainer


def test_last_k_is_the_mean_of_the_last_k_epochs_and_training_is_untouched(tmp_path):
    # epochs cut short (3 of 4 batches): the epoch's end is where the limit ends it
    raw = EpochWeights()
    _fit(tmp_path / "raw", 3, raw, limit_train_batches=3)
    trainer = _fit(tmp_path / "avg", 3, WeightAveraging(kind="last_k", k=2), limit_train_batches=3)
    mean = {
        k: torch.stack([raw.epochs[1][k], raw.epochs[2][k]]).mean(0)
        if v.dtype.is_floating_point
        else v
        for k, v in raw.epochs[2].items()
    }
    module = trainer.lightning_module
    for name, value in module.state_dict().items():  # tested after fit: the average
        assert torch.equal(value, mean[name]), name
    # last.safetensors (a module of your own: the whole module's keys) is the average too
    saved = read_state_dict(tmp_path / "avg" / "last.safetensors")
    assert saved.keys() == mean.keys()
    assert all(torch.equal(saved[k], mean[k]) for k in saved)
    # validated: the average (the last epoch's val/loss is the averaged module's)
    module.eval()
    with torch.no_grad():
        loss = sum(nn.functional.mse_loss(module(x), y) for x, y in _loader(2)) / 4
    assert float(trainer.callback_metrics["val/loss"]) == pytest.approx(float(loss), rel=1e-6)
    # the full checkpoint keeps the raw weights: the averaging never changed training
    ckpt = torch.load(tmp_path / "avg" / "last.ckpt", weights_only=True)
    assert all(torch.equal(ckpt["state_dict"][k], raw.epochs[2][k]) for k in mean)
    assert any(not torch.equal(mean[k], raw.epochs[2][k]) for k in mean)


@pytest.mark.parametrize("kind", ["ema", "last_k"])
def test_a_resumed_run_continues_the_average_bit_for_bit(tmp_path, kind):
    def averaging():
        return WeightAveraging(kind=kind, decay=0.9, k=2)

    _fit(tmp_path / "A", 4, averaging())
    _fit(tmp_path / "B", 2, averaging())
    _fit(tmp_path / "B", 4, averaging(), resume=tmp_path / "B" / "last.ckpt")
    a, b = (torch.load(tmp_path / n / "last.ckpt", weights_only=True) for n in "AB")
    torch.testing.assert_close(a["state_dict"], b["state_dict"], rtol=0, atol=0)
    torch.testing.assert_close(
        a["optimizer_states"][0]["state"], b["optimizer_states"][0]["state"], rtol=0, atol=0
    )
    sa, sb = a["callbacks"]["WeightAveraging"], b["callbacks"]["WeightAveraging"]
    assert_same_average(sa, sb)
    assert sa["last_step"] == (16 if kind == "ema" else 0) and len(sa["window"]) == (
        0 if kind == "ema" else 2
    )
    for name in ("best", "last"):
        wa, wb = (read_state_dict(tmp_path / n / f"{name}.safetensors") for n in "AB")
        torch.testing.assert_close(wa, wb, rtol=0, atol=0)


@pytest.mark.slow
def test_ema_decay_is_the_ema_callback_and_an_older_checkpoint_resumes(make_cfg, tmp_path):
    """``model.ema_decay=0.9`` trains exactly as ``callbacks.weight_averaging.kind=ema`` with
    decay 0.9; a checkpoint as this module wrote it before (the EMA as ``ema.*`` keys of
    ``state_dict``) resumes and continues that average bit for bit; eval opens the run."""

    def run(name, *extra):
        return train(make_cfg(*EXACT, f"paths.output_dir={tmp_path / name}", *extra))

    new = ["callbacks.weight_averaging.kind=ema", "callbacks.weight_averaging.decay=0.9"]
    run("A", *new, "trainer.max_epochs=3")
    run("B", "model.ema_decay=0.9", "trainer.max_epochs=2")
    last = RunDir(tmp_path / "B").last_ckpt
    ckpt = torch.load(last, weights_only=True)  # rewritten as the older module wrote it
    state = ckpt["callbacks"].pop("WeightAveraging")
    ckpt["state_dict"].update(
        {"ema." + k.removeprefix("net."): v for k, v in state["average"].items()}
    )
    torch.save(ckpt, last)
    run("B", "model.ema_decay=0.9", "trainer.max_epochs=3", f"resume={tmp_path / 'B'}")
    a, b = RunDir(tmp_path / "A"), RunDir(tmp_path / "B")
    assert_same_training_state(a.last_ckpt, b.last_ckpt)
    ca, cb = (torch.load(r.last_ckpt, weights_only=True)["callbacks"] for r in (a, b))
    assert_same_average(ca["WeightAveraging"], cb["WeightAveraging"])
    for path in ("best_weights", "last_weights"):
        wa, wb = read_state_dict(getattr(a, path)), read_state_dict(getattr(b, path))
        torch.testing.assert_close(wa, wb, rtol=0, atol=0)
    average = ca["WeightAveraging"]["average"]
    assert all(torch.equal(wa[k], average["net." + k]) for k in wa)  # last: the EMA


@pytest.mark.slow
def test_a_run_with_ema_decay_opens_in_eval_and_scores_as_trained(tmp_path, data_dir):
    """A run whose config says ``model.ema_decay`` (as every older EMA run's does) rebuilds
    in eval, and its best weights (the EMA) score what training's test scored."""
    run = train_cli(tmp_path / "run", data_dir, "model.ema_decay=0.9", "trainer.max_epochs=1",
                    "logger=none")  # fmt: skip
    res = run_inproc("-m", "experiments.eval", str(run), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    trained = read_json(run / "metrics.json")["test/acc"]
    assert read_json(run / "eval_metrics.json")["test/acc"] == pytest.approx(trained, abs=1e-6)


@pytest.mark.slow
def test_regression_validates_and_exports_the_average(make_cfg, tmp_path):
    cfg = make_cfg(
        "experiment=diabetes",
        "trainer.max_epochs=3",
        "logger=none",
        "callbacks.weight_averaging.kind=last_k",
        "callbacks.weight_averaging.k=2",
    )
    metrics = train(cfg)
    run = RunDir(tmp_path / "run")
    ckpt = torch.load(run.last_ckpt, weights_only=True)  # plain data (hidden_sizes a list)
    average = ckpt["callbacks"]["WeightAveraging"]["average"]
    saved = read_state_dict(run.last_weights)
    prefix = "net." if all(k.startswith("net.") for k in average) else ""
    assert saved and all(torch.equal(saved[k], average[prefix + k]) for k in saved)
    assert any(not torch.equal(saved[k], ckpt["state_dict"][prefix + k]) for k in saved)
    assert "test/mae" in metrics


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("callbacks.weight_averaging.kind=swa", "callbacks.weight_averaging.kind"),
        ("callbacks.weight_averaging.decay=1.5", "callbacks.weight_averaging.decay"),
        ("callbacks.weight_averaging.decay=0", "callbacks.weight_averaging.decay"),
        ("callbacks.weight_averaging.k=0", "callbacks.weight_averaging.k"),
    ],
)
def test_bad_values_are_one_line(tmp_path, override, named):
    res = run_inproc("-m", "experiments.train", override, "logger=none", cwd=tmp_path)
    assert_one_line_error(res, named)


def test_the_callback_refuses_bad_values_when_built_in_code():
    for kwargs in ({"kind": "swa"}, {"kind": "ema", "decay": 1.0}, {"kind": "last_k", "k": 0}):
        with pytest.raises(Exception, match="callbacks.weight_averaging") as err:
            WeightAveraging(**kwargs)
        assert "\n" not in str(err.value)


@pytest.mark.slow
def test_ema_decay_and_the_callback_together_are_one_line(tmp_path, data_dir):
    res = run_inproc(
        "-m", "experiments.train", "model.ema_decay=0.9", "callbacks.weight_averaging.kind=ema",
        "logger=none", f"paths.data_dir={data_dir}", f"hydra.run.dir={tmp_path / 'r'}",
        cwd=tmp_path,
    )  # fmt: skip
    assert_one_line_error(res, "model.ema_decay", "callbacks.weight_averaging.kind")
