"""The hand-written reference: a plain PyTorch training loop.

``work=False`` is the bare minimum (zero_grad / forward / loss / backward / step).
``work=True`` does by hand what the default stack does: a device-side accuracy metric
and loss sum per step, the step loss written out every ``log_every`` steps, and every
epoch a validation pass (loss, accuracy, confusion matrix), a CSV row, a full
checkpoint (model + optimizer) and weights-only ``last.pt`` / ``best.pt`` with JSON sidecars,
all written atomically and durably (as the framework does).
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

import torch
from torch import nn
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from experiments.runs.files import atomic_write, write_json


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hand_loop(
    net: nn.Module,
    train_loader,
    val_loader,
    num_classes: int,
    epochs: int,
    out_dir: Path,
    work: bool = True,
    log_every: int = 10,
    lr: float = 0.1,
    momentum: float = 0.9,
    skip: int = 1,
    device: str = "cpu",
    precision: str = "32",
) -> float:
    """Train ``net``; return seconds per training step over epochs ``skip..epochs-1``."""
    dev = torch.device(device)
    net = net.to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    loss_fn = nn.CrossEntropyLoss()
    autocast = precision == "bf16-mixed"
    train_acc = MulticlassAccuracy(num_classes, average="micro").to(dev)
    val_acc = MulticlassAccuracy(num_classes, average="micro").to(dev)
    confmat = MulticlassConfusionMatrix(num_classes).to(dev)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, step_log = [], []
    best = None
    t0, steps = None, 0
    global_step = 0
    for epoch in range(epochs):
        if epoch == skip:
            _sync(dev)
            t0 = time.perf_counter()
        net.train()
        loss_sum = torch.zeros((), device=dev)
        seen = 0
        for x, y in train_loader:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
                logits = net(x)
                loss = loss_fn(logits, y)
            loss.backward()
            opt.step()
            global_step += 1
            if t0 is not None:
                steps += 1
            if not work:
                continue
            train_acc.update(logits.detach(), y)
            loss_sum += loss.detach() * len(y)
            seen += len(y)
            if global_step % log_every == 0:
                step_log.append((global_step, float(loss.detach())))  # the logger's one host sync
        if not work:
            continue
        net.eval()
        val_loss, val_seen = torch.zeros((), device=dev), 0
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
                    logits = net(x)
                    val_loss += loss_fn(logits, y) * len(y)
                val_seen += len(y)
                val_acc.update(logits, y)
                confmat.update(logits.argmax(dim=1), y)
        acc = float(val_acc.compute())
        row = {
            "epoch": epoch,
            "train/loss": float(loss_sum / max(seen, 1)),
            "train/acc": float(train_acc.compute()),
            "val/loss": float(val_loss / max(val_seen, 1)),
            "val/acc": acc,
        }
        confmat.compute()
        for metric in (train_acc, val_acc, confmat):
            metric.reset()
        rows.append(row)
        with open(out_dir / "metrics.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(row))
            writer.writeheader()
            writer.writerows(rows)
        # durable like the framework's (temp file + fsync + rename): the same work, so the
        # ratio measures framework overhead, not the price of not losing checkpoints
        state = {"model": net.state_dict(), "optimizer": opt.state_dict()}
        atomic_write(out_dir / "last.ckpt", lambda f, state=state: torch.save(state, f))
        atomic_write(out_dir / "last.pt", lambda f: torch.save(net.state_dict(), f))
        write_json(out_dir / "last.json", {"epoch": len(rows), "value": acc})
        if best is None or acc > best:
            best = acc
            atomic_write(out_dir / "best.pt", lambda f: torch.save(net.state_dict(), f))
            write_json(out_dir / "best.json", {"epoch": len(rows), "value": acc})
    _sync(dev)
    return (time.perf_counter() - t0) / steps if t0 is not None and steps else float("nan")
