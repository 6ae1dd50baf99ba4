"""Shared pieces of the benchmarks: in-memory data, timing statistics, the step-timer
callback, and the machine description. Imports torch lazily so ``--help`` stays fast."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field


def tensor_sets(
    transform=None,
    target_transform=None,
    n: int = 2000,
    shape: Sequence[int] = (1, 8, 8),
    num_classes: int = 10,
    seed: int = 0,
):
    """Seeded random tensors held in memory: ``(train, test)`` for ``data.dataset``.

    A ``_partial_`` target of ImageDataModule's ``dataset`` (transforms are ignored:
    these are already tensors), so the framework, bare Lightning and the hand-written
    loop all read the very same samples through the very same DataLoader.
    """
    return InMemory(n, shape, num_classes, seed), InMemory(max(n // 8, 1), shape, num_classes, 1)


def InMemory(n: int, shape: Sequence[int], num_classes: int, seed: int):  # noqa: N802
    """``(C, H, W)`` float tensors with integer labels in a TensorDataset (so the data
    module cuts its batches by index, as for any in-memory tensors of one's own), with
    ``.targets`` and ``.classes``."""
    import torch
    from torch.utils.data import TensorDataset

    gen = torch.Generator().manual_seed(seed)
    targets = torch.arange(n) % num_classes
    # class-dependent mean, so the nets have something to learn
    x = torch.randn(n, *shape, generator=gen) + targets.view(-1, 1, 1, 1) * 0.1
    dataset = TensorDataset(x, targets)
    dataset.targets, dataset.classes = targets, [str(i) for i in range(num_classes)]
    return dataset


@dataclass
class Stats:
    """Repeated measurements of one quantity."""

    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(float(value))

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def lo(self) -> float:
        return min(self.values) if self.values else float("nan")

    @property
    def hi(self) -> float:
        return max(self.values) if self.values else float("nan")

    def fmt(self, scale: float = 1.0, digits: int = 2) -> str:
        if not self.values:
            return "n/a"
        m, lo, hi = (v * scale for v in (self.median, self.lo, self.hi))
        return f"{m:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def machine() -> dict[str, str]:
    """Machine and library versions for the results header."""
    import lightning
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores (os.cpu_count)": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU)",
        "load average at start": " ".join(f"{v:.2f}" for v in os.getloadavg()),
    }


def now() -> float:
    return time.perf_counter()
