"""Every run can be reproduced (reproduce.sh) and verified (experiments-verify)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from importlib.metadata import version

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers import REPO, run_inproc, run_process, train_cli

VOLATILE = ("wall_time_s", "run_dir")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):
    root = tmp_path_factory.mktemp("reproduce")
    return train_cli(root / "run", data_dir, "trainer.max_epochs=1", "seed=7")


@pytest.mark.slow
def test_verify_passes_on_the_run_and_fails_once_its_weights_are_edited(finished, tmp_path):
    res = run_inproc("-m", "experiments.verify", f"run_dir={finished}", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    assert "best.safetensors (6 tensors), last.safetensors (6 tensors) match bit for bit" in (
        res.stdout
    )
    edited = tmp_path / "edited"
    shutil.copytree(finished, edited)
    state = load_file(edited / "checkpoints" / "best.safetensors")
    key = next(iter(state))
    state[key] = state[key] + 1e-6
    save_file(state, edited / "checkpoints" / "best.safetensors")
    res = run_inproc("-m", "experiments.verify", f"run_dir={edited}", cwd=tmp_path)
    assert res.returncode == 1
    assert f"best.safetensors {key}: differs" in res.stdout and "NOT verified" in res.stdout
    # an older run's best.pt is compared with the best.safetensors training writes now
    old = tmp_path / "old"
    shutil.copytree(finished, old)
    for name in ("best", "last"):
        path = old / "checkpoints" / f"{name}.safetensors"
        torch.save(load_file(path), path.with_suffix(".pt"))
        path.unlink()
    res = run_inproc("-m", "experiments.verify", f"run_dir={old}", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    assert "best.pt (6 tensors), last.pt (6 tensors) match bit for bit" in res.stdout
    res = run_inproc(
        "-m", "experiments.verify", f"run_dir={finished}", "--steps", "20", cwd=tmp_path
    )
    assert res.returncode == 0 and "train/loss_step at 2 steps match" in res.stdout


@pytest.mark.slow
def test_verify_of_a_run_that_saved_no_weights_says_it_compared_its_metrics(tmp_path, data_dir):
    run = train_cli(tmp_path / "fast", data_dir, "debug=fast")  # one batch, no checkpoints
    assert not list(run.glob("checkpoints/*"))
    res = run_inproc("-m", "experiments.verify", str(run), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    assert "the run's config saves no weights" in res.stdout and "missing" not in res.stdout
    assert res.stdout.strip().splitlines()[-1].startswith("verified: metrics.json (")
    res = run_inproc("-m", "experiments.verify", str(run), "--integrity", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith(f"intact: {run} (")


def test_verify_refuses_a_run_it_cannot_rerun(finished, tmp_path):
    res = run_inproc("-m", "experiments.verify", f"run_dir={tmp_path}", cwd=tmp_path)
    assert res.returncode == 2 and "no saved command to verify" in res.stderr
    dirty = tmp_path / "dirty"
    shutil.copytree(finished, dirty)
    env = json.loads((dirty / "env.json").read_text())
    (dirty / "env.json").write_text(json.dumps({**env, "git_dirty": True}))
    (dirty / "git.diff").unlink(missing_ok=True)
    res = run_inproc("-m", "experiments.verify", f"run_dir={dirty}", cwd=tmp_path)
    assert res.returncode == 2 and "git.diff is missing" in res.stderr
    assert res.stderr.strip().count("\n") == 0


@pytest.mark.slow
def test_reproduce_sh_checks_out_the_commit_and_gets_the_same_metrics(finished, tmp_path):
    script = (finished / "reproduce.sh").read_text()
    assert "trainer.max_epochs=1 seed=7" in script and "hydra.run.dir" not in script.split("\n")[1]
    requirements = (finished / "requirements.txt").read_text()
    assert f"torch=={version('torch')}" in requirements
    clone = tmp_path / "clone"
    assert run_process(["git", "clone", "-q", str(REPO), str(clone)], cwd=tmp_path).returncode == 0
    out = tmp_path / "again"
    env = {**os.environ, "REPRODUCE_PYTHON": sys.executable}
    res = run_process(["bash", str(finished / "reproduce.sh"), str(clone), str(out)],
                      cwd=tmp_path, env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    first = json.loads((finished / "metrics.json").read_text())
    again = json.loads((out / "metrics.json").read_text())
    for key, value in first.items():
        if isinstance(value, int | float) and key not in VOLATILE:
            assert again[key] == value, key
    head = run_process(["git", "-C", str(clone), "rev-parse", "HEAD"], cwd=tmp_path).stdout.strip()
    assert head == json.loads((finished / "env.json").read_text())["git_commit"]
