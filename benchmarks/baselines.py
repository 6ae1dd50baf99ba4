"""What the framework is measured against (:func:`hand_loop`, :class:`BareModule`), the
:class:`StepTimer` that times them all, and :func:`tensor_sets`, the samples they all read.
As a script, the start-up reference: the default run by hand with Lightning's defaults,
``python -m benchmarks.baselines DIGITS_DIR FIRST_STEP_FILE OUT_DIR``.
"""

from __future__ import annotations

import csv
import os
import sys
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from experiments.runs.files import atomic_write, write_json


def tensor_sets(transform=None, target_transform=None, n=2000, shape=(1, 8, 8)):
    """``(train, test)``: noise of ``shape`` with a class-dependent mean (so there is something
    to learn), ``.targets`` and ``.classes``; the transforms are not needed on tensors."""
    return in_memory(n, shape, 0), in_memory(max(n // 8, 1), shape, 1)


def in_memory(n: int, shape, seed: int, num_classes: int = 10) -> TensorDataset:
    targets = torch.arange(n) % num_classes
    x = torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed))
    dataset = TensorDataset(x + targets.view(-1, 1, 1, 1) * 0.1, targets)
    dataset.targets, dataset.classes = targets, [str(i) for i in range(num_classes)]
    return dataset


class StepTimer(L.Callback):
    """Seconds per training step over whole epochs from epoch ``skip`` to the end of fit (so
    validation, logging and checkpoints count, as in the hand loop). ``first_step_file``:
    write ``time.time()`` there at the first step; ``exit_after_first``: then leave."""

    last: StepTimer | None = None  # the newest instance: train() builds its own

    def __init__(self, skip=1, first_step_file: str | None = None, exit_after_first=False):
        self.skip, self.first_step_file, self.exit = skip, first_step_file, exit_after_first
        self.t0, self.t1, self.steps = None, None, 0
        StepTimer.last = self

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.first_step_file and trainer.global_step == 0 and batch_idx == 0:
            Path(self.first_step_file).write_text(repr(time.time()))
            if self.exit:
                os._exit(0)  # without teardown: the process was timed up to here

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.skip:
            self.t0 = _now(pl_module.device)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps += self.t0 is not None

    def on_train_end(self, trainer, pl_module) -> None:
        self.t1 = _now(pl_module.device)

    @property
    def step_s(self) -> float:
        done = self.t0 is not None and self.t1 is not None and self.steps
        return (self.t1 - self.t0) / self.steps if done else float("nan")


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def hand_loop(net: nn.Module, dm, trainer, optimizer, out_dir: Path, work: bool = True) -> float:
    """Train ``net`` with SGD on ``dm``'s loaders as the composed ``trainer`` and ``optimizer``
    configs say; seconds per training step over epochs ``1..max_epochs-1``.

    ``work=False`` is the bare minimum: zero_grad / forward / loss / backward / step. With
    ``work=True`` it also does by hand what the default stack does: device-side accuracy and
    loss sums, the step loss fetched every ``log_every_n_steps``, and every epoch validation
    (loss, accuracy, confusion matrix), a CSV of the epoch rows, a model+optimizer checkpoint
    and weights-only last.pt/best.pt with JSON sidecars, written atomically as ours are.
    """
    dev = torch.device("cuda" if trainer.accelerator == "gpu" else "cpu")
    net, bf16 = net.to(dev), trainer.precision == "bf16-mixed"
    opt = torch.optim.SGD(net.parameters(), lr=optimizer.lr, momentum=optimizer.momentum)
    loss_fn = nn.CrossEntropyLoss()
    accs = {
        s: MulticlassAccuracy(dm.num_classes, average="micro").to(dev) for s in ("train", "val")
    }
    confmat = MulticlassConfusionMatrix(dm.num_classes).to(dev)
    loaders = {"train": dm.train_dataloader(), "val": dm.val_dataloader()}
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, losses, best, t0, steps, step = [], [], -1.0, None, 0, 0
    for epoch in range(trainer.max_epochs):
        t0 = _now(dev) if epoch == 1 else t0
        row = {"epoch": epoch}
        for split in ("train", "val") if work else ("train",):
            net.train(split == "train")
            total, seen = torch.zeros((), device=dev), 0
            for x, y in loaders[split]:
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
                with (
                    torch.set_grad_enabled(split == "train"),
                    torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16),
                ):
                    logits = net(x)
                    loss = loss_fn(logits, y)
                if split == "train":
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    step, steps = step + 1, steps + (t0 is not None)
                    if work and step % trainer.log_every_n_steps == 0:
                        losses.append(float(loss.detach()))  # the logger's one host sync
                elif work:
                    confmat.update(logits.argmax(dim=1), y)
                if work:
                    accs[split].update(logits.detach(), y)
                    total, seen = total + loss.detach() * len(y), seen + len(y)
            if work:
                row[f"{split}/loss"] = float(total / max(seen, 1))
                row[f"{split}/acc"] = float(accs[split].compute())
                accs[split].reset()
        if not work:
            continue
        confmat.compute()
        confmat.reset()
        rows.append(row)
        with open(out_dir / "metrics.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(row))
            writer.writeheader()
            writer.writerows(rows)
        # durable as the framework's (temp file + fsync + rename): the same work, so the
        # ratio measures overhead, not the price of not losing checkpoints
        state = {"model": net.state_dict(), "optimizer": opt.state_dict()}
        atomic_write(out_dir / "last.ckpt", lambda f, state=state: torch.save(state, f))
        for name in ("last", "best") if row["val/acc"] > best else ("last",):
            atomic_write(out_dir / f"{name}.pt", lambda f: torch.save(net.state_dict(), f))
            write_json(out_dir / f"{name}.json", {"epoch": epoch + 1, "value": row["val/acc"]})
        best = max(best, row["val/acc"])
    return (_now(dev) - t0) / steps if t0 is not None and steps else float("nan")


class BareModule(L.LightningModule):
    def __init__(self, net: nn.Module, lr: float = 0.1, momentum: float = 0.9) -> None:
        super().__init__()
        self.net, self.lr, self.momentum = net, lr, momentum

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=self.lr, momentum=self.momentum)


def bare_trainer(trainer, callbacks: list, out_dir: Path) -> L.Trainer:
    """The composed ``trainer`` config's device, precision and epochs; nothing else."""
    return L.Trainer(
        accelerator=trainer.accelerator, devices=1, precision=trainer.precision,
        max_epochs=trainer.max_epochs, logger=False, callbacks=callbacks,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, default_root_dir=str(out_dir),
    )  # fmt: skip


if __name__ == "__main__":
    # what a user would write by hand for the default run: the digits PNGs decoded into
    # memory, the default MLP and SGD, everything else Lightning's defaults
    root, first_step_file, out_dir = (Path(a) for a in sys.argv[1:4])
    with open(root / "labels.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    images = np.stack([np.asarray(Image.open(root / "images" / r["filename"])) for r in rows])
    x = (torch.from_numpy(images).float().div(255).unsqueeze(1) - 0.3) / 0.35  # (N, 1, 8, 8)
    y = torch.tensor([int(r["label"]) for r in rows])
    train, val, _ = random_split(TensorDataset(x, y), [0.7, 0.15, 0.15])
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64),
                        nn.ReLU(), nn.Linear(64, 10))  # fmt: skip
    timer = StepTimer(first_step_file=str(first_step_file), exit_after_first=True)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=[timer],
                        default_root_dir=out_dir)  # fmt: skip
    trainer.fit(BareModule(net), DataLoader(train, 64, shuffle=True), DataLoader(val, 64))
