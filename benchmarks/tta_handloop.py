"""``experiment=digits`` as a plain PyTorch script: the time-to-accuracy baseline.
:func:`recipe_spec` reads the recipe from the composed config (so the script cannot drift from
``conf/``); :func:`run` trains it by hand with the framework's own split, shuffle order, net
class and schedule function (files that import only torch: no Lightning import is paid),
appending ``epoch, step, train/loss, val/loss, val/acc`` to ``<out>/metrics.csv`` and saving
``<out>/last.pt`` after each validation.

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
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset


def _name(node: dict | None) -> str | None:
    return None if node is None else str(node["_target_"]).rsplit(".", 1)[-1]


def recipe_spec(cfg) -> dict:
    """The parts of the composed config ``cfg`` that :func:`run` reads, resolved to JSON data.

    Raises:
        ValueError: the recipe uses something this script does not do (each named).
    """
    from omegaconf import OmegaConf  # here: the script itself does not pay its import

    spec = {"seed": cfg.seed, "max_epochs": cfg.trainer.max_epochs}
    for key in ("data", "model", "optimizer", "scheduler"):
        node = cfg.get(key)
        spec[key] = OmegaConf.to_container(node, resolve=True) if node is not None else None
    data, model, trainer, sched = spec["data"], spec["model"], cfg.trainer, spec["scheduler"]
    steps = data["train_transform"].get("transforms", [data["train_transform"]])
    names = [_name(s) for s in steps]
    ok = {
        f"data={data['_target_']}": data["_target_"] == "experiments.data.DigitsData"
        and data.get("dataset") is None,
        f"the transform {names}": names[:2] == ["ToImage", "ToDtype"]
        and names[2:] in ([], ["Normalize"]) and steps[1].get("scale"),
        "a separate eval_transform": data["eval_transform"] == data["train_transform"],
        f"data.augment={_name(data.get('augment'))}": data.get("augment") is None,
        "MixUp / CutMix": not data.get("mixup_alpha") and not data.get("cutmix_alpha"),
        f"data.sampler={data.get('sampler')}": data.get("sampler", "shuffle") == "shuffle",
        "data.mean=auto": data.get("mean") != "auto",
        f"model.loss={model['loss']}": model["loss"] in ("cross_entropy", "auto"),
        "model.class_weights / label_smoothing / ema_decay": model.get("class_weights") is None
        and not model.get("label_smoothing") and model.get("ema_decay") is None,
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
    return spec


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


def _args(node: dict) -> dict:
    return {k: v for k, v in node.items() if k not in ("_target_", "_partial_")}


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
    data, root = spec["data"], Path(spec["data"]["root"])
    with open(root / "labels.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    pixels = []
    for row in rows:
        with Image.open(root / "images" / row["filename"]) as im:
            pixels.append(np.asarray(im.convert("L"), dtype=np.uint8))
    x = torch.from_numpy(np.stack(pixels)).unsqueeze(1).float() / 255.0  # (N, 1, 8, 8)
    for step in data["train_transform"].get("transforms", []):
        if _name(step) == "Normalize":
            x = (x - torch.tensor(step["mean"]).view(-1, 1, 1)) / torch.tensor(step["std"]).view(
                -1, 1, 1
            )
    y = torch.tensor([int(row["label"]) for row in rows])
    train_idx, val_idx, _ = framework_file("data/splits.py").split_indices(
        len(y),
        data["val_fraction"],
        data["test_fraction"],
        data["split_seed"],
        targets=y.tolist() if data["split"] == "stratified" else None,
    )
    workers = data["num_workers"]
    common = {"batch_size": data["batch_size"], "num_workers": workers}
    common["persistent_workers"] = data["persistent_workers"] and workers > 0
    # own generators: a DataLoader draws a base seed per epoch, which must not move the
    # global RNG (dropout's); the framework's stored splits draw none
    order = EpochOrder(len(train_idx), spec["seed"])
    generator = torch.Generator().manual_seed(spec["seed"])
    train_set = TensorDataset(x[train_idx], y[train_idx])
    train = DataLoader(train_set, sampler=order, generator=generator, **common)
    val = DataLoader(TensorDataset(x[val_idx], y[val_idx]), generator=torch.Generator(), **common)
    return train, val, int(y.max()) + 1


def run(spec: dict, out: Path) -> None:
    """Train the recipe for its epochs, one metrics row and checkpoint per epoch."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    random.seed(spec["seed"])  # what seed_everything does for one process
    np.random.seed(spec["seed"])
    torch.manual_seed(spec["seed"])
    train_loader, val_loader, num_classes = loaders(spec)
    net_spec = spec["model"]["net"]
    net_class = getattr(framework_file("models/nets.py"), _name(net_spec))
    in_shape = tuple(val_loader.dataset[0][0].shape)
    net = net_class(in_shape=in_shape, num_classes=num_classes, **_args(net_spec)).to(device)
    opt_class = getattr(torch.optim, _name(spec["optimizer"]))
    opt = opt_class(net.parameters(), **_args(spec["optimizer"]))
    epochs, sched = spec["max_epochs"], spec["scheduler"]
    if sched is not None:  # the framework's own function, stepped every optimizer step
        total = {"total_steps": epochs * len(train_loader), "total_epochs": epochs}
        schedules = framework_file("models/schedules.py")
        sched = getattr(schedules, _name(sched))(opt, **total, **_args(sched))
    loss_fn = nn.CrossEntropyLoss()
    mean, std = spec["data"].get("mean"), spec["data"].get("std")
    if mean is not None:  # per-batch normalization on the device
        mean, std = (torch.tensor(s, device=device).view(1, -1, 1, 1) for s in (mean, std))
    out.mkdir(parents=True, exist_ok=True)
    step = 0
    with open(out / "metrics.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["epoch", "step", "train/loss", "val/loss", "val/acc"])
        for epoch in range(epochs):
            row = [epoch]
            for training, loader in ((True, train_loader), (False, val_loader)):
                net.train(training)
                loss_sum, right, seen = torch.zeros((), device=device), 0, 0
                for x, y in loader:
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    x = x if mean is None else (x - mean) / std
                    with torch.set_grad_enabled(training):
                        logits = net(x)
                        loss = loss_fn(logits, y)
                    if training:
                        opt.zero_grad(set_to_none=True)
                        loss.backward()
                        opt.step()
                        step += 1
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
