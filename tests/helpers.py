"""Small datasets and nets for tests, importable by Hydra ``_target_`` paths."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from lightning.pytorch import Callback
from torch import nn
from torch.utils.data import Dataset

from experiments.callbacks.profiling import Profiling


class VirtualTime:
    """Seconds of slow work that stand-ins "spent" without spending them: added to the real
    clock by ``VirtualClockProfiling``, so a slow dataset or a slow step is slow by
    construction, however busy the machine is (a real sleep competes with real load)."""

    extra = 0.0

    @classmethod
    def spend(cls, seconds: float) -> None:
        cls.extra += seconds


class VirtualClockProfiling(Profiling):
    """The profiling callback reading the real clock plus ``VirtualTime``."""

    def now(self) -> float:
        return time.perf_counter() + VirtualTime.extra


class RandomImages(Dataset):
    """Seeded random ``(C, H, W)`` tensors with labels; each read costs ``delay`` seconds of
    virtual time (``VirtualTime``), standing in for slow decoding or remote storage."""

    def __init__(
        self,
        n: int,
        shape: Sequence[int],
        num_classes: int,
        delay: float,
        seed: int,
        fail_after: int = -1,
        nan_after: int = -1,
    ):
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, *shape, generator=gen)
        self.targets = torch.arange(n) % num_classes
        self.delay = delay
        self.fail_after = fail_after
        self.nan_after = nan_after
        self.reads = 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        self.reads += 1
        if 0 <= self.fail_after < self.reads:
            raise RuntimeError(f"disk error reading sample {i}")  # a job that dies mid-fit
        if self.delay:
            VirtualTime.spend(self.delay)
        if 0 <= self.nan_after < self.reads:
            return torch.full_like(self.x[i], float("nan")), self.targets[i]  # corrupt input
        return self.x[i], self.targets[i]


def random_sets(
    transform=None,
    target_transform=None,
    n: int = 400,
    shape=(1, 8, 8),
    num_classes: int = 4,
    delay: float = 0.0,
    fail_after: int = -1,
    nan_after: int = -1,
):
    """Train and test sets of RandomImages (transforms are ignored: these are tensors).

    ``fail_after`` >= 0 makes the train set raise after that many reads; ``nan_after``
    makes it return NaN images after that many reads.
    """
    return (
        RandomImages(n, shape, num_classes, delay, 0, fail_after, nan_after),
        RandomImages(n // 4, shape, num_classes, delay, 1),
    )


class SlowNet(nn.Module):
    """A linear classifier whose every forward costs ``seconds`` of virtual time: a step
    that is slow by construction (``VirtualTime``)."""

    def __init__(self, in_shape: Sequence[int], num_classes: int, seconds: float = 1.0) -> None:
        super().__init__()
        self.flat = nn.Flatten()
        self.fc = nn.Linear(int(torch.tensor(in_shape).prod()), num_classes)
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        VirtualTime.spend(self.seconds)
        return self.fc(self.flat(x))


class BranchyNet(nn.Module):
    """A net with a data-dependent ``if``: torch.compile must break the graph there."""

    def __init__(self, in_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        self.flat = nn.Flatten()
        self.fc = nn.Linear(int(torch.tensor(in_shape).prod()), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(self.flat(x))
        if h.sum() > 0:  # depends on the values: Dynamo cannot trace through it
            return h * 2
        return h


_instances = 0


class RecordingImages(RandomImages):
    """RandomImages that appends every index it serves to ``<record_dir>/reads-<pid>-<k>.txt``
    (k: the order in which instances were created; 0 is the first train set built)."""

    def __init__(self, record_dir: str, *args, **kwargs) -> None:
        global _instances
        super().__init__(*args, **kwargs)
        self.record_dir = record_dir
        self.instance = _instances
        _instances += 1

    def __getitem__(self, i: int):
        import os

        with open(f"{self.record_dir}/reads-{os.getpid()}-{self.instance}.txt", "a") as f:
            f.write(f"{i}\n")
        return super().__getitem__(i)


def recording_sets(transform=None, target_transform=None, record_dir: str = ".", n: int = 400):
    """Train/test RecordingImages: which process read which sample, on disk."""
    return (
        RecordingImages(record_dir, n, (1, 8, 8), 4, 0.0, 0),
        RecordingImages(record_dir, n // 4, (1, 8, 8), 4, 0.0, 1),
    )


class Payload:
    """Pickles to a call that creates ``target``: proof, if the file appears, that loading
    a checkpoint ran code."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


class SignalAt(Callback):
    """Sends ``signum`` to this very process after training step ``step``: a test's
    interruption at a known point, instead of a signal sent after a guessed sleep."""

    def __init__(self, step: int, signum: int = 15) -> None:
        self.step = step
        self.signum = signum

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            import os

            os.kill(os.getpid(), self.signum)


class Untargeted(Dataset):
    """Samples and ``.classes`` but no ``.targets``: labels known only by reading samples."""

    def __init__(self, n: int, seed: int) -> None:
        self.inner = RandomImages(n, (1, 8, 8), 4, 0.0, seed)
        self.classes = ["a", "b", "c", "d"]

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int):
        return self.inner[i]


def untargeted_sets(transform=None, target_transform=None, n: int = 200):
    return Untargeted(n, 0), Untargeted(n // 4, 1)


class GcProbe(Callback):
    """Appends ``<collector enabled> <objects frozen>`` to ``path`` at each fit's first step."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_start(self, trainer, pl_module) -> None:
        import gc

        with open(self.path, "a") as f:
            f.write(f"{gc.isenabled()} {gc.get_freeze_count()}\n")


class Rendezvous(Callback):
    """Orders the trials of a parallel sweep by events, not by how long they take: a run with
    ``max_epochs == wait_epochs`` starts training only once ``count`` other runs have ended
    (each leaves a file in ``folder``); it fails after ``timeout`` seconds of waiting, which
    is what a sweep with a batch barrier would make it do."""

    def __init__(self, folder: str, wait_epochs: int, count: int, timeout: float = 300) -> None:
        self.folder = folder
        self.wait_epochs, self.count, self.timeout = wait_epochs, count, timeout

    def on_train_start(self, trainer, pl_module) -> None:
        from pathlib import Path

        if trainer.max_epochs != self.wait_epochs:
            return
        deadline = time.monotonic() + self.timeout
        while len(list(Path(self.folder).glob("ended-*"))) < self.count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Rendezvous: {self.count} other runs never ended")
            time.sleep(0.05)

    def on_train_end(self, trainer, pl_module) -> None:
        import os
        from pathlib import Path

        if trainer.max_epochs != self.wait_epochs:
            Path(self.folder, f"ended-{os.getpid()}-{time.time_ns()}").touch()


class SignalOnce(Callback):
    """Sends ``signum`` to this process after training step ``step`` of sweep job ``job``,
    the first time only (``marker`` records that it did): a sweep stopped at a known point
    whose re-run, with the very same command, is not stopped again."""

    def __init__(self, step: int, marker: str, job: int = 0, signum: int = 2) -> None:
        self.step, self.marker, self.job, self.signum = step, marker, job, signum

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        import os
        from pathlib import Path

        from hydra.core.hydra_config import HydraConfig

        if trainer.global_step != self.step or Path(self.marker).exists():
            return
        if HydraConfig.initialized() and HydraConfig.get().job.num == self.job:
            Path(self.marker).touch()
            os.kill(os.getpid(), self.signum)


class FillDiskOnce(Callback):
    """At the start of training epoch ``epoch``, the first time only (``marker``), writes
    ``ballast`` until its file system is full: a disk that fills up mid-run."""

    def __init__(self, epoch: int, ballast: str, marker: str) -> None:
        self.epoch, self.ballast, self.marker = epoch, ballast, marker

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        from pathlib import Path

        if trainer.current_epoch != self.epoch or Path(self.marker).exists():
            return
        import contextlib

        Path(self.marker).touch()
        with contextlib.suppress(OSError), open(self.ballast, "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()


class OomAbove(Callback):
    """Raise torch's out-of-memory error for a training batch larger than ``max_batch``:
    what a GPU does when the batch does not fit, faked on a CPU."""

    def __init__(self, max_batch: int) -> None:
        self.max_batch = max_batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch[0].shape[0] > self.max_batch:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory (simulated): batch of {batch[0].shape[0]} > {self.max_batch}"
            )


class NanAboveLr(Callback):
    """Make the training diverge (NaN weights, so a NaN loss) while the learning rate is
    above ``max_lr``: what too high a learning rate does, made certain."""

    def __init__(self, max_lr: float, at_step: int = 2) -> None:
        self.max_lr, self.at_step = max_lr, at_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        if trainer.global_step == self.at_step and lr > self.max_lr:
            with torch.no_grad():
                next(pl_module.net.parameters()).fill_(float("nan"))
