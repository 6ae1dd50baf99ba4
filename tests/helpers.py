"""The suite's one helper module (no test file imports from another): running a command (in
this process, or as a process) and checking its answer, small data and run folders on disk, and
the datasets, nets and callbacks that configs name by ``_target_`` (importable by a run too)."""

from __future__ import annotations

import contextlib
import csv
import gc
import importlib
import io
import itertools
import json
import logging
import os
import pickle
import re
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
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from lightning.pytorch import Callback
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

REPO = Path(__file__).resolve().parents[1]
# generous: a test waits for an event (an exit), never a guessed duration; the limit only ends
# a hung one (under `make test-stress`, a CPU hog on every core, a start costs several times more)
SUBPROCESS_TIMEOUT = 600.0


def run_process(
    cmd: list, timeout: float = SUBPROCESS_TIMEOUT, env: dict | None = None,
    cwd: Path | str | None = None, check: bool = False,
) -> subprocess.CompletedProcess:  # fmt: skip
    """``subprocess.run(cmd, capture_output=True, text=True)``; past ``timeout`` its session is
    killed and the test fails with the output's tail (in files: children may hold them open)."""
    files = [tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") for _ in "oe"]
    with files[0], files[1]:
        proc = subprocess.Popen(
            [str(c) for c in cmd], cwd=cwd, env=env, text=True, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=files[0], stderr=files[1],
        )  # fmt: skip
        try:
            proc.wait(timeout=timeout)
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


# docs/own_task.md's worked example: a block whose first line names its file (`# mypkg/task.py`)
GUIDE_FILE = re.compile(r"```(?:python|yaml)\n# ((?:mypkg|conf)/[\w/]+\.\w+)\n(.*?)```", re.S)


def guide_project(root: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The guide's package and config folder written under ``root``: its files by path, and
    the variables its commands set (``mypkg`` and ``tests.helpers`` importable and trusted)."""
    files = {m[1]: m[2] for m in GUIDE_FILE.finditer((REPO / "docs/own_task.md").read_text())}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return files, {
        "EXPERIMENTS_CONFIG_PATH": str(root / "conf"),
        "EXPERIMENTS_TRUSTED_MODULES": "mypkg,tests.helpers",
        "PYTHONPATH": os.pathsep.join([str(root), str(REPO)]),
    }


def run_cli(
    *args: str, cwd: Path, timeout: float = SUBPROCESS_TIMEOUT, env_extra: dict | None = None
) -> subprocess.CompletedProcess:
    """``python -m <module> ...`` as a process, for what only a process shows (signals, launches,
    start-up); ``tests.helpers`` is importable there (``_target_``s of test data)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **(env_extra or {})}
    return run_process([sys.executable, *args], cwd=cwd, env=env, timeout=timeout)


@contextlib.contextmanager
def _restored(cwd: Path, env_extra: dict | None):
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
    """``run_cli`` in this process (no 5 s of imports): the module's ``main`` (or the module as
    ``__main__``), its exit code and output captured, the process state it touched restored.
    Not for signals, launches, start-up or import-time environment (``timeout=`` is unused)."""
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
    args = [*overrides, f"paths.data_dir={data_dir}", f"hydra.run.dir={run}"]
    res = run_inproc("-m", "experiments.train", *args, cwd=run.parent)
    assert res.returncode == 0, res.stderr[-2000:]
    return run


def assert_one_line_error(res, *named: str) -> str:
    """Exit 2 and one line ``error: ...`` naming each of ``named``, no traceback; the line."""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2, (res.returncode, res.stdout[-1000:], res.stderr[-2000:])
    assert "Traceback" not in res.stderr + res.stdout
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for name in named:
        assert name in lines[0], lines[0]
    return lines[0]


EXACT = ["seed=0", "logger=none", "test=false", "data.num_workers=2", "model.net.dropout=0.3"]


def assert_same_training_state(a: Path, b: Path) -> None:
    """Two checkpoints at the same step with equal weights and optimizer state, bit for bit."""
    ca, cb = (torch.load(p, weights_only=True) for p in (a, b))
    assert (ca["epoch"], ca["global_step"]) == (cb["epoch"], cb["global_step"])
    for part in (lambda c: c["state_dict"], lambda c: c["optimizer_states"][0]["state"]):
        torch.testing.assert_close(part(ca), part(cb), rtol=0, atol=0)  # keys too; no tolerance


def data_position(checkpoint: Path) -> dict:
    """The train loader's state that Lightning saved in the checkpoint."""
    loops = torch.load(checkpoint, weights_only=True)["loops"]
    return loops["fit_loop"]["state_dict"]["combined_loader"][0]


def edit_config(run_dir: Path, edit) -> None:
    path = run_dir / ".hydra" / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    edit(cfg)
    path.write_text(yaml.safe_dump(cfg))


def saved_config(lr: float = 0.01, seed: int = 0, **extra) -> dict:
    """A small config shaped like a saved one (interpolations unresolved); ``a__b=v`` sets a.b."""
    cfg = {
        "task_name": "train", "seed": seed, "tags": [], "resume": None,
        "optimized_metric": "val/acc",
        "data": {"root": "${paths.data_dir}/digits", "batch_size": 64,
                 "stats_file": "${paths.output_dir}/data_stats.json"},
        "model": {"monitor": "${optimized_metric}", "net": {"channels": [16, 32]}},
        "optimizer": {"_target_": "torch.optim.SGD", "lr": lr},
        "trainer": {"max_epochs": 2, "default_root_dir": "${paths.output_dir}"},
        "callbacks": {"ckpt": {"dirpath": "${paths.output_dir}/checkpoints"}},
        "logger": {"csv": {"save_dir": "${paths.output_dir}", "name": "csv"}},
        "paths": {"output_dir": "${hydra:runtime.output_dir}", "data_dir": "/data"},
    }  # fmt: skip
    for key, value in extra.items():
        *parents, last = key.split("__")
        node = cfg
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return cfg


def write_run(path: Path, cfg: dict, metrics: dict, curve: list[float] | None = None) -> Path:
    """A finished run's files as compare reads them: config, metrics and a val/acc ``curve``."""
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    (path / ".hydra" / "overrides.yaml").write_text("[]\n")
    (path / "metrics.json").write_text(json.dumps({"run_dir": str(path), **metrics}))
    if curve:
        (path / "csv").mkdir()
        with open(path / "csv" / "metrics.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["epoch", "step", "train/loss", "val/acc", "val/loss"])
            for epoch, acc in enumerate(curve):
                w.writerow(["", epoch * 10, 0.5, "", ""])
                w.writerow([epoch, epoch * 10 + 9, "", acc, 1 - acc])
    return path


def prediction_rows(path: Path) -> list[dict]:
    """A classifier's ``predictions.csv`` as rows (its columns checked)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == ["file", "predicted", "probability"]
        return list(reader)


def table_rows(md: str) -> list[list[str]]:
    """The cells of compare.md's table's group rows."""
    rows = [line for line in md.splitlines() if re.match(r"\| g\d", line)]
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in rows]


def table_header(md: str) -> list[str]:
    line = next(ln for ln in md.splitlines() if ln.startswith("| group"))
    return [c.strip() for c in line.strip("|").split(" | ")]


def payload_targets(marker: Path) -> dict[str, dict]:
    """Config nodes that create ``marker`` when instantiated (write bytes, a shell, ``open``,
    an unpickling checkpoint load)."""
    uint8 = {"_target_": "hydra.utils.get_object", "path": "torch.uint8"}
    data = {"_target_": "torch.tensor", "data": [112, 119, 110], "dtype": uint8}
    return {
        "write_file": {"_target_": "torchvision.io.write_file", "filename": str(marker),
                       "data": data},
        "shell": {"_target_": "torch.utils.collect_env.run", "command": f"touch {marker}"},
        "open": {"_target_": "builtins.open", "_args_": [str(marker), "w"]},
        "unpickle": {"_target_": "lightning.pytorch.LightningModule.load_from_checkpoint",
                     "checkpoint_path": str(marker.parent / "payload.ckpt"),
                     "weights_only": False},
    }  # fmt: skip


def no_account_env(tmp_path) -> dict:
    """An environment with no W&B key, no netrc and no WANDB_MODE: a fresh user's machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path / "home"), NETRC=str(tmp_path / "home" / ".netrc"))
    return env


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


def _idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">I", 0x0800 + array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist(root: Path, folder: str = "MNIST", n_train: int = 60, n_test: int = 20) -> None:
    """Random MNIST-shaped images in torchvision's on-disk format (nothing downloads)."""
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        _idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        _idx(raw / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10)


def write_cifar10(root: Path, per_batch: int = 10) -> None:
    """Random CIFAR-10 batches in torchvision's on-disk format (pickled dicts)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(2)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        batch = {"data": data, "labels": [i % 10 for i in range(per_batch)]}
        (folder / name).write_bytes(pickle.dumps(batch))
    names = "airplane automobile bird cat deer dog frog horse ship truck".split()
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": names}))


def wandb_records(path: str | Path):
    """The ``Record``s of an offline run's ``run-<id>.wandb`` (where alone an offline run
    lives): LevelDB's log, a 7-byte ``:W&B`` header, then 32 KiB blocks of chunks, each behind
    a 7-byte crc/length/type header; a record is one FULL chunk or a FIRST, MIDDLEs and a LAST."""
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
    """Seconds that stand-ins "spent" without spending them, added to the real clock by
    ``VirtualClockProfiling``: slow by construction, however busy the machine is."""

    extra = 0.0


class RandomImages(Dataset):
    """Seeded random ``(C, H, W)`` tensors with labels. A read costs ``delay`` s of virtual
    time; past ``fail_after`` reads it raises, past ``nan_after`` it gives NaN images. With
    ``record_dir``, each index read is appended to ``reads-<pid>-<k>.txt`` there (k: the order
    in which recording sets were made; 0 is the first train set): who read what, on disk."""

    made = itertools.count()

    def __init__(
        self, n: int, shape: Sequence[int], num_classes: int, delay: float, seed: int,
        fail_after: int = -1, nan_after: int = -1, record_dir: str | None = None,
    ):  # fmt: skip
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, *shape, generator=gen)
        self.targets = self.labels = torch.arange(n) % num_classes
        self.delay, self.fail_after, self.nan_after, self.reads = delay, fail_after, nan_after, 0
        self.record_dir, self.instance = record_dir, next(self.made) if record_dir else None

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
            return torch.full_like(self.x[i], float("nan")), self.labels[i]
        return self.x[i], self.labels[i]


def random_sets(
    transform=None, target_transform=None, n: int = 400, shape=(1, 8, 8), num_classes: int = 4,
    delay: float = 0.0, fail_after: int = -1, nan_after: int = -1, record_dir: str | None = None,
):  # fmt: skip
    """Train and test RandomImages (tensors: no transform); the faults are the train set's."""
    return (
        RandomImages(n, shape, num_classes, delay, 0, fail_after, nan_after, record_dir),
        RandomImages(n // 4, shape, num_classes, delay, 1, record_dir=record_dir),
    )


class Payload:
    """Pickles to a call that creates ``target``: if the file appears, loading ran code."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


class SignalAt(Callback):
    """Sends ``signum`` to this very process after training step ``step``: an interruption at
    a known point, not after a guessed sleep. With ``marker``, in sweep job ``job`` only and
    the first time only: a sweep whose re-run, with the same command, is not stopped again."""

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


class Rendezvous(Callback):
    """Orders a parallel sweep's trials by events: a run with ``max_epochs == wait_epochs``
    trains only once ``count`` other runs have ended (each leaves a file in ``folder``); past
    ``timeout`` s of waiting (what a sweep with a batch barrier would cause) it fails."""

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


class Started(Callback):
    """Marks that training started (``<folder>/started-<pid>`` holds the parent's pid), then
    takes ``step_s`` s a step: a job still training long after the test saw it start."""

    def __init__(self, folder: str, step_s: float = 0.5) -> None:
        self.folder, self.step_s = folder, step_s

    def on_train_start(self, trainer, pl_module) -> None:
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        marker = Path(self.folder, f"started-{os.getpid()}")
        marker.with_suffix(".tmp").write_text(str(os.getppid()))
        marker.with_suffix(".tmp").rename(marker)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.step_s)


class SlowNet(nn.Module):
    """A linear classifier whose every forward costs ``seconds`` of virtual time."""

    def __init__(self, in_shape: Sequence[int], num_classes: int, seconds: float = 0.0) -> None:
        super().__init__()
        self.flat = nn.Flatten()
        self.fc = nn.Linear(int(torch.tensor(in_shape).prod()), num_classes)
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        VirtualTime.extra += self.seconds
        return self.fc(self.flat(x))
