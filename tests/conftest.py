"""Shared fixtures: composed configs pointed at temp dirs, small image folders on disk."""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from PIL import Image

from experiments.config import CONF_DIR
from tests import warm

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """One data dir per test session (the digits export is made once and reused)."""
    path = tmp_path_factory.mktemp("data")
    from experiments.data import export_digits

    export_digits(path / "digits")
    return path


@pytest.fixture
def make_cfg(tmp_path, data_dir):
    """Compose ``train.yaml`` with overrides, data and outputs under temp dirs."""

    def _make(*overrides: str, config_name: str = "train") -> DictConfig:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(
                config_name,
                overrides=[
                    f"paths.data_dir={data_dir}",
                    f"paths.log_dir={tmp_path / 'outputs'}",
                    f"paths.output_dir={tmp_path / 'run'}",
                    "paths.sweep_group=null",
                    "paths.job_name=null",
                    *overrides,
                ],
            )
        return cfg

    return _make


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
        # class-dependent brightness, so there is something to learn
        base = 60 + 120 * (i % len(classes))
        pixels = np.clip(rng.normal(base, 30, shape), 0, 255).astype("uint8")
        Image.fromarray(pixels, mode=mode).save(image_dir / f"img_{i:03d}.png")
        rows.append((f"img_{i:03d}.png", label))
    csv_file = root / "labels.csv"
    with open(csv_file, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["filename", "label"])
        writer.writerows(rows)
    return csv_file, image_dir


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
    the command and the tail of its output instead of hanging or losing what it printed."""
    proc = subprocess.Popen(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(
            f"timed out after {timeout:.0f}s and killed: {' '.join(map(str, cmd))}\n"
            f"---- stdout (tail)\n{(out or '')[-3000:]}\n---- stderr (tail)\n{(err or '')[-3000:]}"
        )
    res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check and res.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {res.returncode}:\n{err[-3000:]}")
    return res


def run_cli(
    *args: str,
    cwd: Path,
    timeout: float = SUBPROCESS_TIMEOUT,
    env_extra: dict | None = None,
    cold: bool = False,
):
    """Run ``python -m experiments.train ...`` (or another module via args) in a subprocess;
    ``tests.helpers`` is importable there (``_target_``s of test datasets and callbacks).

    The process is forked from a server that has the heavy libraries imported already
    (tests/warm_server.py: the same ``python -m`` run without 5 s of imports); ``cold=True``
    (or ``EXPERIMENTS_TEST_COLD=1``) starts a fresh interpreter, for tests of what start-up
    itself does or prints."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **(env_extra or {})}
    server = None if cold or args[:1] != ("-m",) else warm.server()
    if server is not None and not server.cold_reason(env):
        try:
            code, out, err, timed_out = server.run(list(args), cwd, env, timeout)
        except warm.NotStarted:  # the server is gone: a fresh interpreter runs it below
            pass
        else:
            if timed_out:
                pytest.fail(
                    f"timed out after {timeout:.0f}s and killed: python {' '.join(args)}\n"
                    f"---- stdout (tail)\n{out[-3000:]}\n---- stderr (tail)\n{err[-3000:]}"
                )
            return subprocess.CompletedProcess([sys.executable, *args], code, out, err)
    return run_process([sys.executable, *args], cwd=cwd, env=env, timeout=timeout)


def train_cli(run: Path, data_dir: Path, *overrides: str) -> Path:
    """A finished run in ``run``: ``python -m experiments.train`` with ``overrides``."""
    res = run_cli(
        "-m", "experiments.train", *overrides, f"paths.data_dir={data_dir}",
        f"hydra.run.dir={run}", cwd=run.parent,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return run


# The longest test files start first: with ``--dist loadfile`` a long file started last
# keeps one worker busy while the other has nothing left to do (the order only; the
# durations of ``make test``'s --durations report show which files these are).
LONGEST_FIRST = ("test_ray.py", "test_sweeps.py", "test_docs_commands_guides.py", "test_bench.py",
                 "test_slurm.py")  # fmt: skip


def pytest_collection_modifyitems(items) -> None:
    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file's tests stay together, in their order
