"""Where a run came from: code version, command, library versions, machine."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.runs.files import atomic_write, write_json

REPO = Path(__file__).resolve().parents[3]  # the checkout the package runs from


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def start_git_probe() -> Callable[[], dict[str, Any]]:
    """Ask git for commit, dirty flag and diff in a background thread (~0.1 s of
    subprocesses that then overlap the torch/lightning import); call the result to get them."""
    result: dict[str, Any] = {}

    def probe() -> None:
        commit = _git("rev-parse", "HEAD")
        status = _git("status", "--porcelain", "--untracked-files=no")
        result["git_commit"] = commit.strip() if commit else None
        result["git_dirty"] = bool(status.strip()) if status is not None else None
        result["diff"] = (_git("diff", "HEAD") or "") if result["git_dirty"] else None

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()

    def get() -> dict[str, Any]:
        thread.join(timeout=15)
        return result

    return get


def environment(seed: Any, device: str, git: dict[str, Any] | None = None) -> dict[str, Any]:
    """Provenance of this process: git state, command line, versions, host, device, seed."""
    import hydra
    import lightning
    import torch

    from experiments.secrets import redact_argv

    if git is None:
        git = start_git_probe()()
    argv = redact_argv(sys.argv)
    return {
        "git_commit": git.get("git_commit"),
        "git_dirty": git.get("git_dirty"),
        "command": [sys.executable, *argv],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "hydra": hydra.__version__,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "device": device,
        "seed": seed,
        # a requeued SLURM job finds its run dir again by this id
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }


def write_environment(
    run_dir: Path, seed: Any, device: str, git: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write ``env.json`` (and ``git.diff`` when the checkout has uncommitted changes)."""
    git = git if git is not None else start_git_probe()()
    env = environment(seed, device, git)
    write_json(run_dir / "env.json", env)
    if env["git_dirty"]:
        diff = git.get("diff") or ""
        atomic_write(run_dir / "git.diff", lambda f: f.write(diff.encode()))
    return env
