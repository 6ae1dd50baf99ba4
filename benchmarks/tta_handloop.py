"""One ``experiment=`` recipe as a plain PyTorch script: the time-to-accuracy baseline.

:func:`recipe_spec` reads the recipe from the config the framework composes (so this script
cannot drift from ``conf/``) and names what it does not reproduce. The script then trains it
by hand on the same files (the digits export, torchvision's MNIST) with the framework's own
split, shuffle order, net class (built after seeding: the same initial weights), schedule
and EMA functions, which import only torch, so it pays no Lightning import. After each
validation it appends ``epoch, step, train/loss, val/loss, val/acc`` to ``<out>/metrics.csv``
and flushes it (watched as the framework's CSV logger is), then saves ``<out>/last.pt``.

    python -m benchmarks.tta_handloop --spec spec.json --out /tmp/hand
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import random
import signal
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler, Subset, TensorDataset


def _name(node: dict | None) -> str | None:
    return None if node is None else str(node["_target_"]).rsplit(".", 1)[-1]


def recipe_spec(cfg) -> dict:
    """What :func:`run` needs of the composed config ``cfg``, as plain JSON data.

    Raises:
        ValueError: the recipe uses something this script does not do (each named).
    """
    from omegaconf import OmegaConf

    def plain(node):
        return None if node is None else OmegaConf.to_container(node, resolve=True)

    data, model, trainer = cfg.data, cfg.model, cfg.trainer
    transform, augment, sched = plain(data.train_transform), plain(data.get("augment")), None
    steps = transform["transforms"] if _name(transform) == "Compose" else [transform]
    names = [_name(s) for s in steps]
    if cfg.get("scheduler") is not None:
        sched = {k: v for k, v in plain(cfg.scheduler).items() if k != "_partial_"}
    ok = {
        f"data.dataset={data.dataset}": data.dataset in ("digits", "mnist"),
        f"the transform {names}": names[:2] == ["ToImage", "ToDtype"]
        and names[2:] in ([], ["Normalize"]) and steps[1].get("scale"),
        "a separate eval_transform": transform == plain(data.get("eval_transform")),
        f"data.augment={_name(augment)}": augment is None or _name(augment) == "RandomShift",
        "MixUp / CutMix": not data.get("mixup_alpha") and not data.get("cutmix_alpha"),
        f"data.sampler={data.get('sampler')}": data.get("sampler", "shuffle") == "shuffle",
        "data.mean=auto": data.get("mean") != "auto",
        f"model.loss={model.loss}": model.loss in ("cross_entropy", "auto"),
        "model.class_weights": model.get("class_weights") is None,
        "fine-tuning": not model.get("freeze") and not model.get("freeze_backbone_epochs")
        and model.get("init_from") is None and model.get("backbone_lr_scale", 1) == 1,
        "model.channels_last": not model.get("channels_last"),
        f"scheduler {_name(sched)}": _name(sched) in (None, "warmup_cosine", "one_cycle"),
        f"trainer.precision={trainer.precision}": str(trainer.precision) in ("32", "32-true"),
        "gradient accumulation / clipping": trainer.accumulate_grad_batches == 1
        and trainer.get("gradient_clip_val") is None,
        "validation other than once per whole epoch": trainer.check_val_every_n_epoch == 1
        and trainer.get("limit_train_batches") is None
        and trainer.get("limit_val_batches") is None,
        "cross-validation": not OmegaConf.select(cfg, "cv.folds"),
    }  # fmt: skip
    bad = [what for what, fine in ok.items() if not fine]
    if bad:
        raise ValueError(f"the hand loop does not reproduce: {', '.join(bad)}")
    keys = ("dataset", "root", "batch_size", "num_workers", "persistent_workers", "split_seed")
    keys += ("split", "val_fraction", "test_fraction", "mean", "std")
    return {
        "seed": cfg.seed,
        "max_epochs": trainer.max_epochs,
        "data": {k: v for k, v in plain(data).items() if k in keys},
        "normalize": [steps[2]["mean"], steps[2]["std"]] if len(steps) == 3 else None,
        "shift": augment and augment.get("padding", 4),
        "net": plain(model.net),
        "optimizer": {k: v for k, v in plain(cfg.optimizer).items() if k != "_partial_"},
        "scheduler": sched,
        "label_smoothing": model.get("label_smoothing", 0.0),
        "ema_decay": model.get("ema_decay"),
    }


def framework_file(relative: str):
    """One file of the ``experiments`` package (``models/nets.py``...) loaded on its own:
    importing ``experiments.models`` would import Lightning (~3 s), which a plain PyTorch
    script does not pay. These files import only torch and light framework modules."""
    package = importlib.util.find_spec("experiments")
    path = Path(package.submodule_search_locations[0]) / relative
    spec = importlib.util.spec_from_file_location("_hand_" + path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class EpochOrder(Sampler[int]):
    """A fresh permutation every epoch from ``seed`` and the epoch number: the order of the
    framework's training loader, so both runs see the same batches."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def __iter__(self):
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) % (2**63 - 1))
        self.epoch += 1
        return iter(torch.randperm(self.n, generator=gen).tolist())

    def __len__(self) -> int:
        return self.n


def loaders(spec: dict) -> tuple[DataLoader, DataLoader, int]:
    """Shuffled train loader and sequential val loader of the recipe's split; class count."""
    data, norm = spec["data"], spec["normalize"]
    root = Path(data["root"])
    if data["dataset"] == "digits":
        from PIL import Image

        with open(root / "labels.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        pixels = []
        for row in rows:
            with Image.open(root / "images" / row["filename"]) as im:
                pixels.append(np.asarray(im.convert("L"), dtype=np.uint8))
        x = torch.from_numpy(np.stack(pixels)).unsqueeze(1).float() / 255.0  # (N, 1, 8, 8)
        if norm is not None:
            x = (x - torch.tensor(norm[0]).view(-1, 1, 1)) / torch.tensor(norm[1]).view(-1, 1, 1)
        targets = [int(row["label"]) for row in rows]
        full = augmented = TensorDataset(x, torch.tensor(targets))
    else:  # MNIST: torchvision's training set (its test set is the framework's test split)
        from torchvision import datasets
        from torchvision.transforms import v2

        def mnist(shift: int | None):
            steps = [v2.RandomCrop(28, padding=shift)] if shift else []
            steps += [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
            steps += [v2.Normalize(*norm)] if norm is not None else []
            return datasets.MNIST(str(root), train=True, transform=v2.Compose(steps))

        full, augmented = mnist(None), mnist(spec["shift"])
        targets = full.targets.tolist()
    train_idx, val_idx, _ = framework_file("data/splits.py").split_indices(
        len(targets),
        data["val_fraction"],
        data["test_fraction"] if data["dataset"] == "digits" else 0.0,
        data["split_seed"],
        targets=targets if data["split"] == "stratified" else None,
    )
    workers = data["num_workers"]
    common = {"batch_size": data["batch_size"], "num_workers": workers}
    common["persistent_workers"] = data["persistent_workers"] and workers > 0
    # own generators: a DataLoader draws a base seed per epoch, which must not move the
    # global RNG (dropout's, the augmentation's); the framework's stored splits draw none
    order = EpochOrder(len(train_idx), spec["seed"])
    generator = torch.Generator().manual_seed(spec["seed"])
    train = DataLoader(Subset(augmented, train_idx), sampler=order, generator=generator, **common)
    val = DataLoader(Subset(full, val_idx), generator=torch.Generator(), **common)
    return train, val, max(targets) + 1


def run(spec: dict, out: Path) -> None:
    """Train the recipe for its epochs, one metrics row and checkpoint per epoch."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    random.seed(spec["seed"])  # what seed_everything does for one process
    np.random.seed(spec["seed"])
    torch.manual_seed(spec["seed"])
    train_loader, val_loader, num_classes = loaders(spec)
    x0, _ = val_loader.dataset[0]  # not a training sample: its augmentation would draw
    net_args = {k: v for k, v in spec["net"].items() if k != "_target_"}
    net_class = getattr(framework_file("models/nets.py"), _name(spec["net"]))
    net = net_class(in_shape=tuple(x0.shape), num_classes=num_classes, **net_args).to(device)
    ema_file = framework_file("models/ema.py")
    ema = ema_file.ema_copy(net, spec["ema_decay"])
    opt_args = {k: v for k, v in spec["optimizer"].items() if k != "_target_"}
    opt = getattr(torch.optim, _name(spec["optimizer"]))(net.parameters(), **opt_args)
    epochs, sched = spec["max_epochs"], spec["scheduler"]
    if sched is not None:  # the framework's own function, stepped every optimizer step
        kwargs = {k: v for k, v in sched.items() if k != "_target_"}
        total = {"total_steps": epochs * len(train_loader), "total_epochs": epochs}
        sched = getattr(framework_file("models/schedules.py"), _name(sched))(opt, **total, **kwargs)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=spec["label_smoothing"])
    mean = spec["data"]["mean"]
    if mean is not None:  # per-batch normalization on the device
        stats = (mean, spec["data"]["std"])
        mean, std = (torch.tensor(s, device=device).view(1, -1, 1, 1) for s in stats)
    out.mkdir(parents=True, exist_ok=True)
    step = 0
    with open(out / "metrics.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["epoch", "step", "train/loss", "val/loss", "val/acc"])
        for epoch in range(epochs):
            row = [epoch]
            for training, loader in ((True, train_loader), (False, val_loader)):
                model = net if training or ema is None else ema
                model.train(training)
                loss_sum, right, seen = torch.zeros((), device=device), 0, 0
                for x, y in loader:
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    x = x if mean is None else (x - mean) / std
                    with torch.set_grad_enabled(training):
                        logits = model(x)
                        loss = loss_fn(logits, y)
                    if training:
                        opt.zero_grad(set_to_none=True)
                        loss.backward()
                        opt.step()
                        step += 1
                        if ema is not None:
                            ema_file.update_ema(ema, net, spec["ema_decay"], step)
                        if sched is not None:
                            sched.step()
                    else:
                        right += (logits.argmax(dim=1) == y).sum()
                    loss_sum += loss.detach() * len(y)
                    seen += len(y)
                row += [step] if training else []
                row += [float(loss_sum) / max(seen, 1)] + ([] if training else [int(right) / seen])
            writer.writerow(row)
            f.flush()
            print(f"epoch {epoch + 1}/{epochs} val/acc={row[-1]:.4f}", flush=True)
            state = {"net": net.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}
            state["ema"] = ema.state_dict() if ema is not None else None
            state["scheduler"] = sched.state_dict() if sched is not None else None
            torch.save(state, out / "last.pt")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, required=True, help="recipe JSON (recipe_spec)")
    parser.add_argument("--out", type=Path, required=True, help="folder of metrics.csv, last.pt")
    args = parser.parse_args()
    # SIGTERM (the parent, once the target is reached): exit normally, so that DataLoader
    # worker processes are shut down rather than orphaned
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    run(json.loads(args.spec.read_text()), args.out)
