"""A hand-written plain-PyTorch run of one ``experiment=`` recipe (time-to-accuracy baseline).

The recipe comes as a JSON spec that ``benchmarks.time_to_accuracy`` extracts from the
composed Hydra config, so this loop cannot drift from ``conf/``. It then does by hand what
the framework does with that recipe:

- data: the same files (the exported digits PNGs, or torchvision's MNIST), the same
  stratified train/val split (the framework's ``split_indices`` with the same fractions and
  ``split_seed``), the same per-sample transform (scale to [0, 1], optional ``Normalize``),
  the same augmentation (random shift = crop with zero padding, training samples only), the
  same per-batch ``(x - mean) / std`` on the device, the same batch size and loader workers;
- model: the framework's own net class from ``experiments/models/nets.py``, built after
  seeding with the recipe's seed, as ``train.py`` does (so the initial weights match);
- training: the recipe's optimizer, its schedule stepped after every optimizer step
  (linear warmup + cosine, or torch's one-cycle), cross-entropy with label smoothing, and
  an EMA of the weights (decay warmed up as ``(1 + t) / (10 + t)``) that is validated in
  place of the raw weights.

After each epoch's validation it appends ``epoch, train/loss, val/loss, val/acc`` to
``<out>/metrics.csv`` and flushes it (the parent watches that file as it watches the
framework's CSV logger), then saves ``<out>/last.pt`` (net, EMA, optimizer, scheduler), the
per-epoch checkpoint any script of one's own would keep.

    python -m benchmarks.tta_handloop --spec spec.json --out /tmp/hand
"""

from __future__ import annotations

import argparse
import copy
import csv
import importlib.util
import json
import math
import random
import signal
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler, Subset, TensorDataset


def framework_file(relative: str):
    """Load one file of the ``experiments`` package (e.g. ``models/nets.py``) on its own.

    ``import experiments.models.nets`` would run ``experiments/models/__init__.py`` first,
    which imports Lightning (~3 s); a plain-PyTorch script has no reason to pay that. The
    files loaded here import only torch and ``experiments.errors``.
    """
    package = importlib.util.find_spec("experiments")
    path = Path(package.submodule_search_locations[0]) / relative
    name = "_tta_" + relative.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- data ------------------------------------------------------------------------------


class EpochOrder(Sampler[int]):
    """A fresh permutation every epoch, from ``seed`` and the epoch number (the order the
    framework's training loader uses, so both runs see the same batches)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def __iter__(self):
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) % (2**63 - 1))
        self.epoch += 1
        return iter(torch.randperm(self.n, generator=gen).tolist())

    def __len__(self) -> int:
        return self.n


def split(targets: list[int], data: dict, has_test: bool) -> tuple[list[int], list[int]]:
    """Train and val indices, exactly as the framework's data module splits them."""
    splits = framework_file("data/splits.py")
    train_idx, val_idx, _ = splits.split_indices(
        len(targets),
        data["val_fraction"],
        0.0 if has_test else data["test_fraction"],
        data["split_seed"],
        targets=targets if data["stratified"] else None,
    )
    return train_idx, val_idx


def digits_tensors(root: Path, normalize: list | None) -> tuple[torch.Tensor, list[int]]:
    """The exported digits (``labels.csv`` + 8x8 PNGs) as one ``(N, 1, 8, 8)`` float tensor
    scaled to [0, 1] and normalized as the recipe's per-sample transform does."""
    from PIL import Image

    with open(root / "labels.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    images = []
    for row in rows:
        with Image.open(root / "images" / row["filename"]) as im:
            images.append(np.asarray(im.convert("L"), dtype=np.uint8))
    x = torch.from_numpy(np.stack(images)).unsqueeze(1).float() / 255.0  # (N, 1, 8, 8)
    if normalize is not None:
        mean, std = normalize
        x = (x - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)
    return x, [int(row["label"]) for row in rows]


def mnist_sets(root: Path, normalize: list | None, shift: int | None):
    """torchvision's MNIST train set twice: with the training transform (shift
    augmentation first) and with the eval transform; plus its targets."""
    from torchvision import datasets
    from torchvision.transforms import v2

    def transform(augment: bool):
        steps = [v2.RandomCrop(28, padding=shift)] if augment and shift else []
        steps += [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
        if normalize is not None:
            steps.append(v2.Normalize(*normalize))
        return v2.Compose(steps)

    train = datasets.MNIST(str(root), train=True, transform=transform(True))
    evaluation = datasets.MNIST(str(root), train=True, transform=transform(False))
    return train, evaluation, [int(t) for t in train.targets]


def loaders(data: dict, seed: int) -> tuple[DataLoader, DataLoader, int]:
    """Shuffled train loader, sequential val loader of the recipe's split, class count."""
    root = Path(data["root"])
    if data["dataset"] == "digits":
        x, targets = digits_tensors(root, data["normalize"])
        y = torch.tensor(targets)
        train_idx, val_idx = split(targets, data, has_test=False)
        train_set = TensorDataset(x[train_idx], y[train_idx])
        val_set = TensorDataset(x[val_idx], y[val_idx])
    elif data["dataset"] == "mnist":
        train_full, eval_full, targets = mnist_sets(root, data["normalize"], data["shift"])
        train_idx, val_idx = split(targets, data, has_test=True)
        train_set, val_set = Subset(train_full, train_idx), Subset(eval_full, val_idx)
    else:
        raise SystemExit(f"tta_handloop: no hand-written data path for {data['dataset']!r}")
    workers = data["num_workers"]
    common = {
        "batch_size": data["batch_size"],
        "num_workers": workers,
        "persistent_workers": data["persistent_workers"] and workers > 0,
    }
    # their own generators: a DataLoader draws a base seed per epoch, which must not move
    # the global RNG (dropout's, the augmentation's); the framework's stored splits draw none
    return (
        DataLoader(
            train_set,
            sampler=EpochOrder(len(train_set), seed),
            generator=torch.Generator().manual_seed(seed),
            **common,
        ),
        DataLoader(val_set, shuffle=False, generator=torch.Generator(), **common),
        max(targets) + 1,
    )


# --- optimization ----------------------------------------------------------------------


def schedule(opt: torch.optim.Optimizer, spec: dict | None, total_steps: int, epochs: int):
    """The recipe's per-step LR schedule over the whole run; None for a constant LR."""
    if spec is None:
        return None
    warmup_share = spec["warmup_epochs"] / epochs
    if spec["kind"] == "one_cycle":
        return torch.optim.lr_scheduler.OneCycleLR(
            opt,
            max_lr=[g["lr"] for g in opt.param_groups],
            total_steps=total_steps,
            pct_start=max(warmup_share, 1e-3),
            div_factor=spec["div_factor"],
            final_div_factor=spec["final_div_factor"],
        )
    warmup = round(total_steps * warmup_share)
    floor = spec["min_lr_ratio"]

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        done = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * done))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


@torch.no_grad()
def ema_step(ema: nn.Module, net: nn.Module, decay: float, step: int) -> None:
    """Move the EMA towards ``net``; ``step`` optimizer steps were done before this one."""
    weight = 1.0 - min(decay, (1 + step) / (10 + step))
    for avg, cur in zip(
        [*ema.parameters(), *ema.buffers()], [*net.parameters(), *net.buffers()], strict=True
    ):
        if avg.dtype.is_floating_point:
            avg.lerp_(cur, weight)
        else:
            avg.copy_(cur)


# --- the loop --------------------------------------------------------------------------


def batch_norm_fn(data: dict, device: torch.device):
    """The recipe's per-batch ``(x - mean) / std`` on the device, or the identity."""
    if data["batch_mean"] is None:
        return lambda x: x
    mean = torch.tensor(data["batch_mean"], device=device).view(1, -1, 1, 1)
    std = torch.tensor(data["batch_std"], device=device).view(1, -1, 1, 1)
    return lambda x: (x - mean) / std


def train_epoch(net, loader, opt, sched, loss_fn, prep, device, ema, decay, step) -> tuple:
    """One pass over the training data; returns ``(mean loss, optimizer steps so far)``."""
    net.train()
    loss_sum, seen = torch.zeros((), device=device), 0
    for x, y in loader:
        x, y = prep(x.to(device, non_blocking=True)), y.to(device, non_blocking=True)
        loss = loss_fn(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if ema is not None:
            ema_step(ema, net, decay, step)
        if sched is not None:
            sched.step()
        step += 1
        loss_sum += loss.detach() * len(y)
        seen += len(y)
    return float(loss_sum) / max(seen, 1), step


@torch.no_grad()
def evaluate(net, loader, loss_fn, prep, device) -> tuple[float, float]:
    """``(mean loss, accuracy)`` of ``net`` in eval mode over ``loader``."""
    net.eval()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    seen = 0
    for x, y in loader:
        x, y = prep(x.to(device, non_blocking=True)), y.to(device, non_blocking=True)
        logits = net(x)
        loss_sum += loss_fn(logits, y) * len(y)
        correct += (logits.argmax(dim=1) == y).sum()
        seen += len(y)
    return float(loss_sum) / max(seen, 1), int(correct) / max(seen, 1)


def build_net(spec: dict, in_shape: tuple, num_classes: int) -> nn.Module:
    """The framework's net class from ``nets.py`` with the recipe's arguments."""
    kwargs = dict(spec["net"])
    name = kwargs.pop("_target_").rsplit(".", 1)[-1]
    nets = framework_file("models/nets.py")
    if not hasattr(nets, name):
        raise SystemExit(f"tta_handloop: {name} is not a net of experiments/models/nets.py")
    return getattr(nets, name)(in_shape=in_shape, num_classes=num_classes, **kwargs)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def seed_all(seed: int) -> None:
    """What ``seed_everything`` does for one process: python, numpy and torch RNGs."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run(spec: dict, out: Path, device: torch.device, checkpoint: bool = True) -> None:
    """Train the recipe for its epochs, one metrics row (+ checkpoint) per epoch."""
    seed_all(spec["seed"])
    train_loader, val_loader, num_classes = loaders(spec["data"], spec["seed"])
    x0, _ = val_loader.dataset[0]  # not a training sample: its augmentation would draw
    net = build_net(spec, tuple(x0.shape), num_classes).to(device)
    ema = copy.deepcopy(net).requires_grad_(False) if spec["ema_decay"] else None
    opt_spec = dict(spec["optimizer"])
    opt = getattr(torch.optim, opt_spec.pop("name"))(net.parameters(), **opt_spec)
    epochs = spec["max_epochs"]
    sched = schedule(opt, spec["schedule"], epochs * len(train_loader), epochs)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=spec["label_smoothing"])
    prep = batch_norm_fn(spec["data"], device)
    out.mkdir(parents=True, exist_ok=True)
    print(f"torch threads {torch.get_num_threads()}, device {device}", flush=True)
    step = 0
    with open(out / "metrics.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["epoch", "step", "train/loss", "val/loss", "val/acc"])
        f.flush()
        for epoch in range(epochs):
            train_loss, step = train_epoch(
                net, train_loader, opt, sched, loss_fn, prep, device, ema, spec["ema_decay"], step
            )
            val_loss, val_acc = evaluate(ema or net, val_loader, loss_fn, prep, device)
            writer.writerow([epoch, step, train_loss, val_loss, val_acc])
            f.flush()
            print(f"epoch {epoch + 1}/{epochs} val/acc={val_acc:.4f}", flush=True)
            if checkpoint:
                state = {"net": net.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}
                state["ema"] = ema.state_dict() if ema is not None else None
                state["scheduler"] = sched.state_dict() if sched is not None else None
                torch.save(state, out / "last.pt")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", type=Path, required=True, help="recipe JSON (time_to_accuracy)")
    p.add_argument("--out", type=Path, required=True, help="folder of metrics.csv / last.pt")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--seed", type=int, default=None, help="instead of the recipe's seed")
    p.add_argument("--no-checkpoint", action="store_true", help="skip the per-epoch last.pt")
    args = p.parse_args(argv)
    # SIGTERM (the parent, once the target is reached): exit normally, so that the
    # DataLoader worker processes are shut down rather than orphaned
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    spec = json.loads(args.spec.read_text())
    if args.seed is not None:
        spec["seed"] = args.seed
    run(spec, args.out, pick_device(args.device), checkpoint=not args.no_checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
