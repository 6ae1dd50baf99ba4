"""A real one-node SLURM cluster, started once per session by ``scripts/slurm-local.sh`` and
stopped (checked gone, by PID) at the end. Where it cannot run (not root, no apt-get, ports
6817/6818 taken) its tests are skipped with the script's reason; any other failure fails them."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "slurm-local.sh"
CANNOT_START = 3  # the script's exit code for "this machine cannot run the cluster"
# states after which a job will not run again (unless requeued by someone)
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE", "PREEMPTED"}  # fmt: skip


@dataclass
class SlurmCluster:
    """A running cluster: its environment and the SLURM commands run against it."""

    env: dict[str, str]  # SLURM_CONF and PATH (with the sacct stand-in): add to a child's env
    partition: str

    def environ(self, **extra: str) -> dict[str, str]:
        """A child process's environment: ``os.environ``, this cluster's, then ``extra``."""
        return {**os.environ, **self.env, **extra}

    def cmd(self, *args: str, check: bool = True, timeout: float = 30, env: dict | None = None):
        """A SLURM command's stdout; ``env`` (default :meth:`environ`) is what a job gets."""
        env = env or self.environ()
        res = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise RuntimeError(f"{shlex.join(args)} failed ({res.returncode}): {res.stderr}")
        return res.stdout

    def sbatch(self, *args: str, env: dict | None = None) -> str:
        """Submits a job (``env`` as in :meth:`cmd`); returns its id."""
        return self.cmd("sbatch", "--parsable", *args, env=env).strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, ExitCode, StdOut...); {} for no such job."""
        out = self.cmd("scontrol", "show", "job", "-o", str(job_id), check=False).strip()
        return parse_scontrol(out.splitlines()[0]) if out else {}

    def wait_job(
        self, job_id: str, timeout: float = 600,
        done: Callable[[dict[str, str]], bool] | None = None, files: Iterable[Path] = (),
    ) -> dict[str, str]:  # fmt: skip
        """Polls until ``done(job)`` (default: a final state); past ``timeout`` fails the test
        with the job's record and output ``files``."""
        done = done or (lambda job: job.get("JobState") in FINAL_STATES)
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job and done(job):
                return job
            if time.monotonic() > deadline:
                pytest.fail(
                    f"job {job_id} not done in {timeout:.0f}s\n{self.describe(job_id, files)}"
                )
            time.sleep(0.25)

    def describe(self, job_id: str, files: Iterable[Path] = ()) -> str:
        """What to read when a job misbehaved: ``scontrol show job`` and the job's output."""
        shown = self.cmd("scontrol", "show", "job", str(job_id), check=False)
        parts = [f"---- scontrol show job {job_id}", shown.strip()]
        job = self.job(job_id)
        paths = [Path(p) for p in (job.get("StdOut"), job.get("StdErr")) if p]
        for path in dict.fromkeys([*paths, *map(Path, files)]):  # in order, no repeats
            if path.is_file():
                parts.append(f"---- {path} (tail)\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)


def parse_scontrol(line: str) -> dict[str, str]:
    """One ``scontrol show ... -o`` line (``Key=value ...``) as a dict; a value with spaces
    (JobName, Command) keeps the words that follow it."""
    out: dict[str, str] = {}
    key = None
    for token in line.split():
        name, sep, value = token.partition("=")
        if sep and name and name[0].isalpha() and " " not in name:
            key = name
            out[key] = value
        elif key is not None:
            out[key] += " " + token
    return out


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie has exited; it waits to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _skip(reason: str) -> None:
    # printed as well as given to pytest: `-rs` is not always on, and a skip must be seen
    print(f"slurm_cluster: SKIPPED: {reason}", file=sys.stderr)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> Iterable[SlurmCluster]:
    """The session's cluster (Slurm installed with apt if needed), stopped at the end with
    none of its daemons left."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        _skip("a real SLURM cluster needs root (scripts/slurm-local.sh runs the daemons as root)")
    state_dir = tmp_path_factory.mktemp("slurm")
    partition = "debug"
    start = time.monotonic()
    res = subprocess.run(  # the first time includes apt-get (an update and 8 packages)
        ["bash", str(SCRIPT), "up", str(state_dir)], capture_output=True, text=True,
        timeout=600, env={**os.environ, "SLURM_LOCAL_PARTITION": partition},
    )  # fmt: skip
    if res.returncode == CANNOT_START:
        print(res.stderr, file=sys.stderr)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        _skip(lines[-1] if lines else "scripts/slurm-local.sh up: cannot start")
    if res.returncode != 0:
        pytest.fail(f"scripts/slurm-local.sh up failed ({res.returncode}):\n{res.stderr}")
    print(f"slurm_cluster: up in {time.monotonic() - start:.1f}s", file=sys.stderr)
    # `up` prints `export NAME=value` lines; $PATH in them means the current PATH
    cluster_env = {}
    for line in res.stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            name, value = line[len("export ") :].split("=", 1)
            cluster_env[name] = value.replace("$PATH", os.environ.get("PATH", ""))
    assert "SLURM_CONF" in cluster_env, res.stdout
    pid_files = {"slurmctld": state_dir / "slurmctld.pid", "slurmd": state_dir / "slurmd.pid",
                 "munged": state_dir / "munge" / "munged.pid"}  # fmt: skip
    pids = {name: int(path.read_text()) for name, path in pid_files.items()
            if path.is_file() and path.read_text().strip().isdigit()}  # fmt: skip
    assert {"slurmctld", "slurmd"} <= pids.keys(), pids
    try:
        yield SlurmCluster(cluster_env, partition)
    finally:
        start = time.monotonic()
        cmd = ["bash", str(SCRIPT), "down", str(state_dir)]
        down = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        print(f"slurm_cluster: down in {time.monotonic() - start:.1f}s", file=sys.stderr)
        left = {name: pid for name, pid in pids.items() if _alive(pid)}
        assert down.returncode == 0, down.stderr
        assert not left, f"daemons still running after down: {left}\n{down.stderr}"
