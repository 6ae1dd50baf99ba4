"""Weights-only checkpoints: exact reload, atomic under SIGKILL, safe loading, no NaN best."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import pickle
import random
import signal
import time

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from torch import nn

from experiments.callbacks import StateDictCheckpoint
from experiments.errors import UserError
from experiments.runs.weights import load_state_dict_file, read_state_dict, save_state_dict
from experiments.training.pipeline import train
from tests.helpers import Payload


@pytest.mark.slow
def test_best_safetensors_reproduces_logged_val_acc(make_cfg, tmp_path):
    from safetensors.torch import load_file

    cfg = make_cfg("trainer.max_epochs=4")
    train(cfg)
    ckpt = tmp_path / "run" / "checkpoints"
    names = {p.name for p in ckpt.iterdir()}
    assert {"best.safetensors", "best.json", "last.safetensors", "last.json"} <= names
    assert not names & {"best.pt", "last.pt"}  # weights are never pickled any more
    side = json.loads((ckpt / "best.json").read_text())
    assert side["monitor"] == "val/acc" and side["net"]["_target_"] == "experiments.models.MLP"
    assert side["in_shape"] == [1, 8, 8] and len(side["class_names"]) == 10
    assert side["file"] == "best.safetensors"

    state = load_file(ckpt / "best.safetensors")  # tensors only: no unpickler at all
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    net = instantiate(cfg.model.net, in_shape=(1, 8, 8), num_classes=10)
    net.load_state_dict(state)
    net.eval()
    dm = instantiate(cfg.data)
    dm.setup()
    correct = total = 0
    with torch.no_grad():
        for x, y in dm.val_dataloader():
            correct += int((net(x).argmax(1) == y).sum())
            total += len(y)
    assert correct / total == pytest.approx(side["value"], abs=1e-6)


def _state(i: int) -> dict:
    # 8 x 10k floats (~320 KB): small tensors keep ops single-threaded (safe after fork)
    return {
        **{f"w{j}": torch.full((100, 100), float(i)) for j in range(8)},
        "step": torch.tensor(i),
    }


def _write_forever(path, saved):
    torch.set_num_threads(1)
    i = 0
    while True:
        i += 1
        save_state_dict(_state(i), path)
        saved.set()  # the parent kills only a writer that has written (an event, not a sleep)


# last.safetensors: what runs write; last.pt: the torch.save format save_state_dict still writes
@pytest.mark.parametrize("name", ["last.safetensors", "last.pt"])
def test_sigkill_never_leaves_a_broken_weights_file(tmp_path, name):
    path = tmp_path / name
    save_state_dict(_state(0), path)
    ctx = mp.get_context("fork")
    rng = random.Random(0)
    steps = []
    for _ in range(20):
        saved = ctx.Event()
        proc = ctx.Process(target=_write_forever, args=(path, saved))
        proc.start()
        assert saved.wait(timeout=300), "the writer never saved"
        time.sleep(rng.uniform(0.0, 0.1))  # where in the next write the kill lands
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        state = read_state_dict(path)  # raises if torn
        assert torch.equal(state["w7"], torch.full((100, 100), float(state["step"])))
        steps.append(int(state["step"]))
    assert max(steps) > 0  # the writer really was overwriting the file when killed


def test_compiled_keys_are_stripped_on_save_and_load(tmp_path):
    net = nn.Sequential(nn.Linear(3, 2))
    compiled = torch.compile(net)  # a wrapper: its state_dict keys start with _orig_mod.
    assert all(k.startswith("_orig_mod.") for k in compiled.state_dict())
    save_state_dict(compiled.state_dict(), tmp_path / "a.pt")
    assert set(torch.load(tmp_path / "a.pt", weights_only=True)) == {"0.weight", "0.bias"}
    torch.save(compiled.state_dict(), tmp_path / "elsewhere.pt")  # written by other code
    fresh = nn.Sequential(nn.Linear(3, 2))
    load_state_dict_file(fresh, tmp_path / "elsewhere.pt")
    assert torch.equal(fresh[0].weight, net[0].weight)


def test_bad_files_give_one_line_errors_and_never_run_code(tmp_path):
    good = tmp_path / "good.pt"
    save_state_dict(nn.Linear(4, 4).state_dict(), good)
    data = good.read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    (tmp_path / "empty.pt").write_bytes(b"")
    torch.save([1, 2, 3], tmp_path / "list.pt")
    canary = tmp_path / "pwned"
    with open(tmp_path / "payload.pt", "wb") as f:
        pickle.dump({"w": Payload(str(canary))}, f)
    torch.save({"w": Payload(str(canary))}, tmp_path / "payload_zip.pt")
    assert not canary.exists()
    for name in (
        "truncated.pt",
        "empty.pt",
        "list.pt",
        "payload.pt",
        "payload_zip.pt",
        "missing.pt",
    ):
        with pytest.raises(UserError) as info:
            load_state_dict_file(nn.Linear(4, 4), tmp_path / name)
        message = str(info.value)
        assert name in message and "\n" not in message, message
    assert not canary.exists()
    with pytest.raises(UserError, match="does not fit"):
        load_state_dict_file(nn.Linear(4, 5), good)


class NanAtEpoch1(L.LightningModule):
    """Logs val/acc 0.5, then NaN, then 0.4."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(2, 2)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.log("val/acc", [0.5, math.nan, 0.4][self.current_epoch])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_non_finite_value_never_replaces_best(tmp_path):
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)), 2)
    cb = StateDictCheckpoint(dirpath=str(tmp_path))
    trainer = L.Trainer(
        max_epochs=3,
        callbacks=[cb],
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(NanAtEpoch1(), data, data)
    side = json.loads((tmp_path / "best.json").read_text())
    assert (side["epoch"], side["value"]) == (1, 0.5)  # 1-based, as the console counts
    assert json.loads((tmp_path / "last.json").read_text())["epoch"] == 3


def test_safetensors_weights_round_trip_and_a_corrupt_file_is_one_line(tmp_path):
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(3))
    net(torch.randn(2, 1, 8, 8))
    state = {f"_orig_mod.{k}": v for k, v in net.state_dict().items()}  # as torch.compile names
    path = save_state_dict(state, tmp_path / "best.safetensors")
    assert path.read_bytes()[8:9] == b"{"  # a JSON header, no pickle
    loaded = read_state_dict(path)
    assert set(loaded) == set(net.state_dict())
    assert all(torch.equal(loaded[k], v) for k, v in net.state_dict().items())
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(data[: len(data) // 2]))  # truncated
    with pytest.raises(UserError, match="cannot be loaded"):
        read_state_dict(path)


class Averaged(L.LightningModule):
    """A net and a running average of it; ``export_prefix`` names the one that is saved.
    val/acc rises every epoch, so the best weights are the last epoch's."""

    def __init__(self, export_prefix: str):
        super().__init__()
        self.net, self.ema = nn.Linear(3, 2), nn.Linear(3, 2)
        self.export_prefix = export_prefix

    def training_step(self, batch, batch_idx):
        return (self.net(batch[0]) ** 2).mean()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        with torch.no_grad():
            for mine, avg in zip(self.net.parameters(), self.ema.parameters(), strict=True):
                avg.mul_(0.5).add_(mine, alpha=0.5)

    def validation_step(self, batch, batch_idx):
        self.log("val/acc", float(self.current_epoch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("prefix", ["net.", "ema."])
def test_the_safetensors_saved_equal_the_weights_trained(tmp_path, prefix):
    from safetensors.torch import load_file

    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3)), 4)
    module = Averaged(prefix)
    trainer = L.Trainer(
        max_epochs=3, callbacks=[StateDictCheckpoint(dirpath=str(tmp_path))], logger=False,
        enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(module, data, data)
    trained = getattr(module, prefix.rstrip(".")).state_dict()
    other = (module.ema if prefix == "net." else module.net).state_dict()
    for name in ("best", "last"):
        saved = load_file(tmp_path / f"{name}.safetensors")
        assert set(saved) == set(trained)
        assert all(torch.equal(saved[k], trained[k]) for k in trained)
        assert not all(torch.equal(saved[k], other[k]) for k in other)  # the named weights
    assert not list(tmp_path.glob("*.pt"))
