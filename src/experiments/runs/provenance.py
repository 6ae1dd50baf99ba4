"""Where a run came from: code version, command, library versions, machine."""

from __future__ import annotations

import os
import platform
import shlex
import socket
import subprocess
import sys
import threading
import unicodedata
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from experiments.runs.files import write_json, write_text
from experiments.runs.layout import CONFIG_PATH_ENV, GIT_DIFF, REPRODUCE, REQUIREMENTS, RunDir
from experiments.secrets import redact_argv

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
        result["requirements"] = _installed()

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()

    def get() -> dict[str, Any]:
        thread.join(timeout=15)
        return result

    return get


_started: list[Callable[[], dict[str, Any]]] = []


def prestart_git_probe() -> None:
    """Start the probe for the next ``git_probe()`` (the command line: before torch imports)."""
    _started.append(start_git_probe())


def git_probe() -> Callable[[], dict[str, Any]]:
    """The probe ``prestart_git_probe`` started, or a new one."""
    return _started.pop() if _started else start_git_probe()


def _installed() -> list[str]:
    """``name==version`` of every installed distribution but this project (installed from
    the checkout that reproduce.sh checks out), from the ``<name>-<version>.dist-info``
    folders' names: reading every distribution's metadata costs a quarter of a second."""
    found = {}
    for entry in sys.path:
        folder = Path(entry or ".")
        if not folder.is_dir():
            continue
        for info in folder.glob("*.dist-info"):
            name, _, version = info.name[: -len(".dist-info")].partition("-")
            key = name.lower().replace("_", "-")
            if version and key != "experiments" and key not in found:
                found[key] = f"{name}=={version}"
    return sorted(found.values(), key=str.lower)


def write_environment(
    run_dir: Path, seed: Any, device: str, git: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write ``env.json`` (this process's git state, command line, versions, host, device,
    seed), ``git.diff`` when the checkout has uncommitted changes, ``requirements.txt`` and
    ``reproduce.sh``."""
    import torch  # lazy: the command line imports this module before the cheap check

    git = git if git is not None else start_git_probe()()
    env = {
        "git_commit": git.get("git_commit"),
        "git_dirty": git.get("git_dirty"),
        "command": [sys.executable, *redact_argv(sys.argv)],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": version("lightning"),
        "hydra": hydra.__version__,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "device": device,
        "seed": seed,
        # a requeued SLURM job finds its run dir again by this id
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }
    layout = RunDir(run_dir)
    write_json(layout.env, env)
    if env["git_dirty"]:
        write_text(layout.git_diff, git.get("diff") or "")
    write_text(layout.requirements, "\n".join(git.get("requirements") or []) + "\n")
    write_text(layout.reproduce_script, reproduce_script(env, run_overrides(), run_config_dirs()))
    layout.reproduce_script.chmod(0o755)
    return env


# overrides that say where a run went or what it resumed, not what it computed
NOT_REPRODUCED = ("hydra.run.dir=", "hydra.sweep.dir=", "paths.output_dir=", "resume=")


def run_overrides() -> list[str]:
    """This run's own overrides: Hydra's task overrides (a sweep job's are its own values),
    else the command line's ``key=value`` arguments; without output places and resume."""
    try:
        # as typed: an interpolation such as ${oc.env:TOKEN} stays one, never its value
        overrides = list(OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False))
    except Exception:  # not under Hydra's main
        overrides = [a for a in sys.argv[1:] if "=" in a]
    return [o for o in overrides if not o.lstrip("+~").startswith(NOT_REPRODUCED)]


def run_config_dirs() -> list[str]:
    """The folders of this run's ``hydra.searchpath`` (``file://`` entries: your own config
    folders, from ``EXPERIMENTS_CONFIG_PATH``, ``-cd`` or the command line); none when not
    under Hydra's main."""
    try:
        entries = list(HydraConfig.get().searchpath)
    except Exception:  # not under Hydra's main
        return []
    return [str(e).removeprefix("file://") for e in entries if str(e).startswith("file://")]


# bidirectional-text controls: they make a line read differently than it runs
BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")
_SHORT_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\'"}


def is_control(char: str) -> bool:
    """A character that ends a line, moves the cursor or hides text: C0/C1 controls, DEL,
    line/paragraph separators, invisible format characters, bidi overrides, and lone
    surrogates (command-line bytes that were not UTF-8)."""
    return char in BIDI or unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs")


def _escape(char: str) -> str:
    """``char`` as bash ``$'...'`` escapes of its UTF-8 bytes: the same bytes once bash reads
    it, whatever the locale."""
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape): that byte
        return f"\\x{code - 0xDC00:02x}"
    return "".join(f"\\x{b:02x}" for b in char.encode("utf-8", "surrogatepass"))


def shell_word(text: str) -> str:
    """``text`` as one bash word that bash reads back as exactly ``text``: ``shlex.quote``,
    or, when it holds a control character, ANSI-C quoting (``$'a\\nb'``) with every control
    character escaped, so the script's lines stay the lines it was written with."""
    if not any(is_control(c) for c in text):
        return shlex.quote(text)
    return "$'" + "".join(_escape(c) if is_control(c) or c in "\\'" else c for c in text) + "'"


def printable(text: str) -> str:
    """``text`` with each control character escaped (``\\n``, ``\\x1b``): for a comment."""
    return "".join(_escape(c) if is_control(c) else c for c in text)


def reproduce_script(
    env: dict[str, Any], overrides: list[str], config_dirs: list[str] | tuple = ()
) -> str:
    """``reproduce.sh``: check out the commit, apply git.diff, rebuild the environment from
    requirements.txt, run the same overrides into a new folder. A run that composed configs
    of your own (``config_dirs``) sets ``EXPERIMENTS_CONFIG_PATH`` to those folders unless it
    is set already (your package must still be importable, and trusted for eval).

    Every value is written as one shell word (``shell_word``): the script runs exactly
    these overrides, and no text of theirs (a newline, ``$(...)``, a backtick, ``;``) can
    end a line or become a command, in the comments too."""
    args = " ".join(shell_word(a) for a in redact_argv(overrides))
    commit = str(env.get("git_commit") or "")
    at = printable(commit) or "(unknown: not run from a git checkout)"
    at += f" with {GIT_DIFF}" if env.get("git_dirty") else ""
    versions = printable(f"python {env.get('python')}, torch {env.get('torch')}")
    diff = f'"$RUN_DIR/{GIT_DIFF}"'
    own = ""
    if config_dirs:  # the folders the run composed from, unless the caller names others
        folders = os.pathsep.join(config_dirs)
        own = (
            f"# the run composed configs of your own from {printable(folders)}\n"
            f'if [ -z "${{{CONFIG_PATH_ENV}:-}}" ]; then '
            f"export {CONFIG_PATH_ENV}={shell_word(folders)}; fi\n"
        )
    return f"""#!/usr/bin/env bash
# Reproduce this run: python -m experiments.train {args}
# at commit {at}, {versions}.
#   bash {REPRODUCE} <a clone of the repository> [<output folder>]
# It checks out the commit in that clone (which must have no changes of its own), applies
# {GIT_DIFF} when there is one, installs {REQUIREMENTS} into <clone>/.venv-reproduce (set
# REPRODUCE_PYTHON=<python> to use an environment you already have), and trains into
# <output folder> (default: <this run>/reproduced). Compare with experiments-verify.
set -euo pipefail
RUN_DIR="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
REPO="$(cd "${{1:?usage: bash {REPRODUCE} <a clone of the repository> [<output folder>]}}" && pwd)"
OUT="${{2:-$RUN_DIR/reproduced}}"
COMMIT={shell_word(commit)}
cd "$REPO"
if [ -n "$COMMIT" ]; then git checkout --quiet --detach "$COMMIT"; fi
if [ -f {diff} ] && [ -s {diff} ]; then git apply {diff}; fi
PY="${{REPRODUCE_PYTHON:-}}"
if [ -z "$PY" ]; then
  python3 -m venv .venv-reproduce
  .venv-reproduce/bin/pip install -q -r "$RUN_DIR/{REQUIREMENTS}"
  .venv-reproduce/bin/pip install -q --no-deps -e .
  PY=.venv-reproduce/bin/python
fi
{own}PYTHONPATH="$REPO/src${{PYTHONPATH:+:$PYTHONPATH}}" \\
  "$PY" -m experiments.train {args} "hydra.run.dir=$OUT"
"""
