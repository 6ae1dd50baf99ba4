"""The suite's one helper module: how a test runs a command (in this process, or as a process
where the process is what is tested), small data on disk and read back (images, an offline W&B
run's records), and the datasets, nets and callbacks that configs name by ``_target_``
(importable from a run's own process too)."""

from __future__ import annotations

import contextlib
import csv
import gc
import importlib
import io
import itertools
import logging
import os
import runpy
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from lightning.pytorch import Callback
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

from experiments.callbacks.profiling import Profiling
from experiments.errors import UserError

REPO = Path(__file__).resolve().parents[1]
# generous: a subprocess test waits for an event (an exit), never for a guessed duration, and
# the limit only decides how long a hung one is left before it is killed and reported; under
# `make test-stress` (a CPU hog on every core) a CLI start costs several times its idle time
SUBPROCESS_TIMEOUT = 600.0


def run_process(
    cmd: list[str],
    timeout: float = SUBPROCESS_TIMEOUT,
    env: dict | None = None,
    cwd: Path | str | None = None,
    check: bool = False,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)`` for tests: past ``timeout`` the
    process and everything it started (its own session) are killed, and the test fails with
    the command and the tail of its output instead of hanging or losing what it printed. The
    output goes to files, so the wait ends at the process's exit even while processes it
    started (a sweep's workers) still hold them open."""
    files = [tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") for _ in "oe"]
    with files[0], files[1]:
        proc = subprocess.Popen(
            [str(c) for c in cmd], cwd=cwd, env=env, text=True, start_new_session=True,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=files[0], stderr=files[1],
        )  # fmt: skip
        try:
            proc.communicate(input=input, timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            timed_out = True
        for f in files:
            f.seek(0)
        out, err = (f.read() for f in files)
    if timed_out:
        pytest.fail(
            f"timed out after {timeout:.0f}s and killed: {' '.join(map(str, cmd))}\n"
            f"---- stdout (tail)\n{out[-3000:]}\n---- stderr (tail)\n{err[-3000:]}"
        )
    res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check and res.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {res.returncode}:\n{err[-3000:]}")
    return res


def run_cli(
    *args: str, cwd: Path, timeout: float = SUBPROCESS_TIMEOUT, env_extra: dict | None = None
) -> subprocess.CompletedProcess:
    """``python -m experiments.train ...`` (or another module via args) as a process of its
    own, for what only a process shows: exit on a signal, DDP/SLURM/Ray launches, start-up, a
    crash's traceback. ``tests.helpers`` is importable there (``_target_``s of test data)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **(env_extra or {})}
    return run_process([sys.executable, *args], cwd=cwd, env=env, timeout=timeout)


@contextlib.contextmanager
def _restored(cwd: Path, env_extra: dict | None):
    """Gives a test process back what a command may change in its process."""
    saved = (os.getcwd(), list(sys.argv), list(sys.path), dict(os.environ), gc.isenabled())
    loggers = {n: (lg.level, list(lg.handlers), lg.propagate, lg.disabled) for n, lg in
               [("", logging.root), *logging.root.manager.loggerDict.items()]
               if isinstance(lg, logging.Logger)}  # fmt: skip
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    hydra, deterministic = Singleton.get_state(), torch.are_deterministic_algorithms_enabled()
    frozen, modules = gc.get_freeze_count(), set(sys.modules)
    logging.root.handlers[:] = []  # a fresh process's root: no handler (pytest's are back after)
    logging.root.setLevel(logging.WARNING)
    os.chdir(cwd)
    os.environ.update(env_extra or {})
    sys.path.insert(0, str(cwd))  # as `python -m`: a user's module in cwd is importable
    try:
        with warnings.catch_warnings():  # a fresh interpreter's filters, shown on its stderr
            warnings.resetwarnings()
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                             ResourceWarning):  # fmt: skip
                warnings.simplefilter("ignore", category)
            warnings.showwarning = lambda *a, **_: sys.stderr.write(warnings.formatwarning(*a[:4]))
            yield
    finally:
        os.chdir(saved[0])
        sys.argv[:], sys.path[:] = saved[1], saved[2]
        os.environ.clear()
        os.environ.update(saved[3])
        for name, lg in [("", logging.root), *logging.root.manager.loggerDict.items()]:
            if not isinstance(lg, logging.Logger):
                continue
            level, kept, propagate, disabled = loggers.get(name, (0, [], True, False))
            for handler in set(lg.handlers) - set(kept):
                handler.close()  # a run's train.log
            lg.handlers[:], lg.propagate, lg.disabled = kept, propagate, disabled
            lg.setLevel(level)
        logging.disable(logging.NOTSET)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        Singleton.set_state(hydra)
        # a sweep holds its dir's lock until its process exits (runs/sweep.py): this one won't
        held = getattr(sys.modules.get("experiments.runs.sweep"), "_held", [])
        while held:
            held.pop().release()
        torch.use_deterministic_algorithms(deterministic)
        if gc.get_freeze_count() > frozen:
            gc.unfreeze()
        if saved[4]:
            gc.enable()
        for name in set(sys.modules) - modules:  # a module of this cwd: the next cwd has its own
            if str(getattr(sys.modules[name], "__file__", "")).startswith(str(cwd)):
                del sys.modules[name]


def run_inproc(
    *args: str, cwd: Path, env_extra: dict | None = None, **_: object
) -> subprocess.CompletedProcess:
    """``run_cli`` without a process: ``python -m <module> args`` as a call of the module's
    ``main`` (or the module run as ``__main__``) in this process (no 5 s of imports), with its
    exit code, stdout and stderr captured, and the process state it touched restored. Not for
    signals, launches of other processes, start-up, or environment that a library reads when
    it is imported; pytest's timeout bounds a hung one (``timeout=`` is accepted and unused)."""
    assert args[0] == "-m", args
    module, argv = args[1], list(args[2:])
    out, err = (io.TextIOWrapper(io.BytesIO(), "utf-8", write_through=True) for _ in "oe")
    code = 0
    redirect = contextlib.redirect_stdout(out), contextlib.redirect_stderr(err)
    with _restored(cwd, env_extra), redirect[0], redirect[1]:
        sys.argv[:] = [module, *argv]
        try:
            entry = None
            with contextlib.suppress(ImportError):
                entry = getattr(importlib.import_module(module), "main", None)
            if entry is None:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                entry()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
            if not isinstance(exc.code, int | None):
                print(exc.code, file=sys.stderr)
        except Exception:  # what the interpreter prints for an uncaught one, and its exit 1
            traceback.print_exc()
            code = 1
    texts = [s.buffer.getvalue().decode("utf-8", "replace") for s in (out, err)]
    return subprocess.CompletedProcess([sys.executable, *args], code, *texts)


def train_cli(run: Path, data_dir: Path, *overrides: str) -> Path:
    """A finished run in ``run``: ``python -m experiments.train`` with ``overrides``."""
    res = run_inproc(
        "-m", "experiments.train", *overrides, f"paths.data_dir={data_dir}",
        f"hydra.run.dir={run}", cwd=run.parent,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return run


def write_image_folder(
    root: Path, n: int = 40, classes=("cat", "dog"), size=(12, 10), mode="RGB", vary=False
) -> tuple[Path, Path]:
    """A folder of random images + ``labels.csv`` with string labels. Returns (csv, dir)."""
    rng = np.random.default_rng(0)
    image_dir = root / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        label = classes[i % len(classes)]
        h, w = size if not vary or i % 3 else (size[0] + 5, size[1] + 3)
        shape = (h, w, 3) if mode == "RGB" else (h, w)
        base = 60 + 120 * (i % len(classes))  # class-dependent brightness: something to learn
        pixels = np.clip(rng.normal(base, 30, shape), 0, 255).astype("uint8")
        Image.fromarray(pixels, mode=mode).save(image_dir / f"img_{i:03d}.png")
        rows.append((f"img_{i:03d}.png", label))
    csv_file = root / "labels.csv"
    with open(csv_file, "w", newline="") as f:
        csv.writer(f).writerows([("filename", "label"), *rows])
    return csv_file, image_dir


def wandb_records(path: str | Path):
    """The ``wandb_internal_pb2.Record``s of an offline run's ``run-<id>.wandb`` file (offline
    mode writes no summary JSON: the run lives only here). The format is LevelDB's log: a
    7-byte ``:W&B`` header, then 32 KiB blocks of chunks, each behind a 7-byte crc/length/type
    header; a record is one FULL chunk or a FIRST, MIDDLEs and a LAST."""
    from wandb.proto import wandb_internal_pb2 as pb  # lazy: most tests never import wandb

    block, full, first, last = 32 * 1024, 1, 2, 4
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little left in the block for a header: padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == length == 0:
            break
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pending = chunk if kind in (full, first) else pending + chunk
        if kind in (full, last):
            rec = pb.Record()
            rec.ParseFromString(pending)
            yield rec


class VirtualTime:
    """Seconds of slow work that stand-ins "spent" without spending them, added to the real
    clock by ``VirtualClockProfiling``: slow by construction, however busy the machine is (a
    real sleep competes with real load)."""

    extra = 0.0


class VirtualClockProfiling(Profiling):
    """The profiling callback reading the real clock plus ``VirtualTime``."""

    def now(self) -> float:
        return time.perf_counter() + VirtualTime.extra


class RandomImages(Dataset):
    """Seeded random ``(C, H, W)`` tensors with labels. Each read costs ``delay`` seconds of
    virtual time (slow decoding or remote storage); past ``fail_after`` reads it raises (a job
    that dies mid-fit), past ``nan_after`` it returns NaN images (corrupt input). With
    ``record_dir``, each index read is appended to ``reads-<pid>-<k>.txt`` there (k: the order
    in which recording sets were made; 0 is the first train set): who read what, on disk."""

    made = itertools.count()

    def __init__(
        self, n: int, shape: Sequence[int], num_classes: int, delay: float, seed: int,
        fail_after: int = -1, nan_after: int = -1, record_dir: str | None = None,
    ):  # fmt: skip
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, *shape, generator=gen)
        self.targets = torch.arange(n) % num_classes
        self.delay, self.fail_after, self.nan_after = delay, fail_after, nan_after
        self.record_dir, self.instance = record_dir, next(self.made) if record_dir else None
        self.reads = 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.record_dir:
            with open(f"{self.record_dir}/reads-{os.getpid()}-{self.instance}.txt", "a") as f:
                f.write(f"{i}\n")
        self.reads += 1
        if 0 <= self.fail_after < self.reads:
            raise RuntimeError(f"disk error reading sample {i}")
        VirtualTime.extra += self.delay
        if 0 <= self.nan_after < self.reads:
            return torch.full_like(self.x[i], float("nan")), self.targets[i]
        return self.x[i], self.targets[i]


def random_sets(
    transform=None, target_transform=None, n: int = 400, shape=(1, 8, 8), num_classes: int = 4,
    delay: float = 0.0, fail_after: int = -1, nan_after: int = -1, record_dir: str | None = None,
):  # fmt: skip
    """Train and test sets of RandomImages (transforms are ignored: these are tensors); the
    faults (``fail_after``, ``nan_after``) are the train set's."""
    return (
        RandomImages(n, shape, num_classes, delay, 0, fail_after, nan_after, record_dir),
        RandomImages(n // 4, shape, num_classes, delay, 1, record_dir=record_dir),
    )


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


class SlowNet(nn.Module):
    """A linear classifier whose every forward costs ``seconds`` of virtual time: a step
    that is slow by construction."""

    def __init__(self, in_shape: Sequence[int], num_classes: int, seconds: float = 0.0) -> None:
        super().__init__()
        self.flat = nn.Flatten()
        self.fc = nn.Linear(int(torch.tensor(in_shape).prod()), num_classes)
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        VirtualTime.extra += self.seconds
        return self.fc(self.flat(x))


class BranchyNet(SlowNet):
    """A net with a data-dependent ``if``: torch.compile must break the graph there."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = super().forward(x)
        return h * 2 if h.sum() > 0 else h  # depends on the values: Dynamo cannot trace it


class Payload:
    """Pickles to a call that creates ``target``: proof, if the file appears, that loading
    a checkpoint ran code."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


class SignalAt(Callback):
    """Sends ``signum`` to this very process after training step ``step``: an interruption at
    a known point, not a signal sent after a guessed sleep. With ``marker``, in sweep job
    ``job`` only and the first time only (the marker records it): a sweep stopped at a known
    point whose re-run, with the very same command, is not stopped again."""

    def __init__(self, step: int, signum: int = 15, marker: str | None = None, job: int = 0):
        self.step, self.signum, self.marker, self.job = step, signum, marker, job

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step != self.step:
            return
        if self.marker:
            if Path(self.marker).exists() or not HydraConfig.initialized():
                return
            if HydraConfig.get().job.num != self.job:
                return
            Path(self.marker).touch()
        os.kill(os.getpid(), self.signum)


class GcProbe(Callback):
    """Appends ``<collector enabled> <objects frozen>`` to ``path`` at each fit's first step."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_start(self, trainer, pl_module) -> None:
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
        if trainer.max_epochs != self.wait_epochs:
            return
        deadline = time.monotonic() + self.timeout
        while len(list(Path(self.folder).glob("ended-*"))) < self.count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Rendezvous: {self.count} other runs never ended")
            time.sleep(0.05)

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.max_epochs != self.wait_epochs:
            Path(self.folder, f"ended-{os.getpid()}-{time.time_ns()}").touch()


class FillDiskOnce(Callback):
    """At the start of training epoch ``epoch``, the first time only (``marker``), writes
    ``ballast`` until its file system is full: a disk that fills up mid-run."""

    def __init__(self, epoch: int, ballast: str, marker: str) -> None:
        self.epoch, self.ballast, self.marker = epoch, ballast, marker

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch != self.epoch or Path(self.marker).exists():
            return
        Path(self.marker).touch()
        with contextlib.suppress(OSError), open(self.ballast, "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()


class OomAbove(Callback):
    """Out of memory for a training batch larger than ``max_batch``: torch's CUDA error, what
    a GPU does when the batch does not fit, faked on a CPU; or, with ``allocator``, a request
    of 1 PiB from the CPU allocator, whose real ``can't allocate memory`` RuntimeError is what
    a too-large batch on a CPU ends in."""

    def __init__(self, max_batch: int, allocator: bool = False) -> None:
        self.max_batch, self.allocator = max_batch, allocator

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch[0].shape[0] <= self.max_batch:
            return
        if self.allocator:
            torch.empty(2**50, dtype=torch.uint8)  # more than any address space
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


class RefuseValue(Callback):
    """A callback whose ``value`` may not be ``refused``: a one-line user error that only
    the grid job with that value meets, as it builds its callbacks."""

    def __init__(self, value: int, refused: int) -> None:
        if value == refused:
            raise UserError(f"callbacks.refuse.value={value} is not valid: expected not {refused}")


class Started(Callback):
    """Marks that training started (``<folder>/started-<pid>``, holding the pid of this
    process's parent), then makes each step take ``step_s`` seconds: a job that is still
    training long after the test has seen it start."""

    def __init__(self, folder: str, step_s: float = 0.5) -> None:
        self.folder, self.step_s = folder, step_s

    def on_train_start(self, trainer, pl_module) -> None:
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        marker = Path(self.folder, f"started-{os.getpid()}")
        marker.with_suffix(".tmp").write_text(str(os.getppid()))
        marker.with_suffix(".tmp").rename(marker)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.step_s)
