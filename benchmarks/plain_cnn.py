"""The hand-written baseline for ``data=image_csv``: a plain tutorial CNN (conv3x3 32 -> ReLU
-> maxpool -> conv3x3 64 -> ReLU -> maxpool -> flatten -> linear 128 -> ReLU -> linear),
trained with a hand-written loop on exactly the framework's split, statistics, optimizer,
batch size and epochs, for comparison with ``python -m experiments.train data=image_csv``.

    python -m benchmarks.plain_cnn data.csv_file=<csv> data.image_dir=<dir> trainer.max_epochs=3
"""

from __future__ import annotations

import sys
import time

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torch import nn

from experiments.config import CONF_DIR
from experiments.data.stats import normalize


def plain_cnn(in_shape, num_classes: int) -> nn.Module:
    c, h, w = in_shape
    return nn.Sequential(
        nn.Conv2d(c, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # (B, 32, h/2, w/2)
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # (B, 64, h/4, w/4)
        nn.Flatten(), nn.Linear(64 * (h // 4) * (w // 4), 128), nn.ReLU(),
        nn.Linear(128, num_classes),
    )  # fmt: skip


def main(overrides: list[str]) -> float:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=["data=image_csv", "optimizer=adamw", "paths.output_dir=outputs/plain_cnn",
                       "paths.sweep_group=null", "paths.job_name=null", *overrides],
        )  # fmt: skip
    torch.manual_seed(cfg.seed)
    dm = instantiate(cfg.data)
    dm.setup("fit")  # the framework's own split and training-split statistics
    net = plain_cnn(dm.input_shape, dm.num_classes)
    opt = instantiate(cfg.optimizer)(net.parameters())
    start = time.perf_counter()
    for epoch in range(int(cfg.trainer.max_epochs)):
        net.train()
        for x, y in dm.train_dataloader():
            loss = nn.functional.cross_entropy(net(normalize(x, *dm.stats)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"epoch {epoch + 1}: loss {loss.item():.4f}", flush=True)
    net.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in dm.test_dataloader():
            right += int((net(normalize(x, *dm.stats)).argmax(1) == y).sum())
            total += len(y)
    acc = right / total
    took = time.perf_counter() - start
    print(f"plain CNN test/acc={acc:.4f} ({total} test images, {took:.0f} s)")
    return acc


USAGE = __doc__.strip().splitlines()[-1].strip()


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(f"usage: {USAGE}\n\n" + __doc__.split("\n\n")[0])
        sys.exit(0)
    main(sys.argv[1:])
