"""Places results cannot go: a read-only file system, a file in the way, a full disk at the
start or in the middle of a run. Each is one line naming the path and the cause, exit 2; a
disk that fills mid-run leaves the last checkpoint whole, and a resume after freeing space
finishes the run (trust round 3). Real file systems: small tmpfs mounts."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest
from lightning.pytorch import Callback

from tests.helpers import REPO, run_inproc


@contextlib.contextmanager
def tmpfs(path, size: str, read_only: bool = False):
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=60)


def _one_line_exit_2(res, *named: str) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stderr + res.stdout, res.stderr[-3000:]
    assert lines and lines[-1].startswith("error: "), lines
    for text in named:
        assert text in lines[-1], lines[-1]
    return lines[-1]


def _train(tmp_path, data_dir, *args):
    return run_inproc(
        *("-m", "experiments.train", "logger=csv", "trainer.max_epochs=3"),
        f"paths.data_dir={data_dir}",
        *args,
        cwd=tmp_path,
    )


def test_read_only_run_dir_file_in_the_way_and_data_dir_a_file(tmp_path, data_dir):
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as ro:
        res = _train(tmp_path, data_dir, f"hydra.run.dir={ro / 'run'}")
        _one_line_exit_2(res, f"hydra.run.dir={ro / 'run'}", "read-only file system")
    (tmp_path / "in_the_way").write_text("a file")
    res = _train(tmp_path, data_dir, f"hydra.run.dir={tmp_path / 'in_the_way'}")
    _one_line_exit_2(res, "in_the_way", "a file is in the way")
    res = _train(tmp_path, tmp_path / "in_the_way")
    _one_line_exit_2(res, "paths.data_dir=", "is a file, not a folder")
    res = run_inproc(
        "-m", "experiments.train", "-m", "optimizer.lr=0.1,0.2",
        f"hydra.sweep.dir={tmp_path / 'in_the_way' / 'sweep'}", cwd=tmp_path,
    )  # fmt: skip
    _one_line_exit_2(res, "hydra.sweep.dir=", "a file is in the way")


def test_a_full_disk_at_the_start_is_one_line(tmp_path, data_dir):
    with tmpfs(tmp_path / "full", "256k") as full:
        with contextlib.suppress(OSError), open(full / "ballast", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        res = _train(tmp_path, data_dir, f"hydra.run.dir={full / 'run'}")
        _one_line_exit_2(res, "no space left on the device")


@pytest.mark.slow
def test_a_disk_filling_mid_run_keeps_the_checkpoint_and_resume_finishes(tmp_path, data_dir):
    with tmpfs(tmp_path / "disk", "32m") as disk:
        run = disk / "run"
        fill = [
            "+callbacks.fill._target_=tests.test_unwritable.FillDiskOnce",
            "+callbacks.fill.epoch=1",
            f"+callbacks.fill.ballast={disk / 'ballast'}",
            f"+callbacks.fill.marker={tmp_path / 'filled'}",
        ]
        res = _train(tmp_path, data_dir, f"hydra.run.dir={run}", "seed=0", *fill)
        line = _one_line_exit_2(res, "no space left on the device", f"resume={run}")
        assert not (run / "metrics.json").exists(), line
        import torch

        from experiments.runs.checkpoint_io import newest_valid_checkpoint

        path, ckpt = newest_valid_checkpoint(run / "checkpoints")
        assert ckpt["epoch"] == 0 and torch.load(path, weights_only=True)["state_dict"]
        (disk / "ballast").unlink()  # space freed
        res = run_inproc(
            "-m", "experiments.train", f"resume={run}", cwd=tmp_path,
            env_extra={"PYTHONPATH": str(REPO), "EXPERIMENTS_TRUSTED_MODULES": __name__},
        )  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["epochs"] == 3 and "test/acc" in metrics


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
