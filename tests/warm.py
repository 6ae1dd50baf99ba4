"""The client of tests/warm_server.py: run ``python -m <module> ...`` as a process forked
from a server that has already imported the heavy libraries (one server per test process,
started on first use). ``EXPERIMENTS_TEST_COLD=1`` runs every command in a fresh
interpreter instead; a command whose environment changes what a library reads when it is
imported runs cold too (see ``cold_reason``)."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# read by torch, NumPy's BLAS or OpenMP when they are loaded, not when a run starts
IMPORT_TIME_ENV = ("OMP_", "MKL_", "OPENBLAS_", "KMP_", "TORCH", "PYTORCH", "CUDA", "LD_",
                   "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONDONTWRITEBYTECODE")  # fmt: skip
COLD = os.environ.get("EXPERIMENTS_TEST_COLD") == "1"
SERVER_SCRIPT = Path(__file__).with_name("warm_server.py")
START_TIMEOUT = 300.0  # its imports, on a loaded machine


class NotStarted(Exception):
    """The server did not start the command (it is gone, or did not answer)."""


class Server:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="warm-")
        self.socket = os.path.join(self.dir, "s")
        self.env = dict(os.environ)
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER_SCRIPT), self.socket],
            env={**self.env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT)
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            self.close()
            raise RuntimeError(f"the warm server did not start in {START_TIMEOUT:.0f} s")
        atexit.register(self.close)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()

    def cold_reason(self, env: dict[str, str]) -> str | None:
        for key in env.keys() | self.env.keys():
            if env.get(key) != self.env.get(key) and key.startswith(IMPORT_TIME_ENV):
                return key
        return None

    def run(self, args: list[str], cwd, env: dict[str, str], timeout: float):
        """``(returncode, stdout, stderr, timed_out)`` of ``python *args``."""
        out_dir = tempfile.mkdtemp(prefix="run-", dir=self.dir)
        out, err = os.path.join(out_dir, "out"), os.path.join(out_dir, "err")
        request = {"args": args, "cwd": str(cwd or os.getcwd()), "env": env,
                   "stdout": out, "stderr": err}  # fmt: skip
        deadline = time.monotonic() + timeout
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            try:
                conn.settimeout(60)
                conn.connect(self.socket)
                conn.sendall(json.dumps(request).encode() + b"\n")
                reader = conn.makefile("r")
                pid = int(reader.readline())
            except (OSError, ValueError) as err:  # nothing started: the caller runs it cold
                raise NotStarted(str(err)) from err
            conn.settimeout(max(deadline - time.monotonic(), 1.0))
            try:
                line = reader.readline()
                code, timed_out = int(line), False
            except (TimeoutError, ValueError):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                code, timed_out = -signal.SIGKILL, True
        texts = [Path(p).read_text(errors="replace") if os.path.exists(p) else ""
                 for p in (out, err)]  # fmt: skip
        for p in (out, err):
            with contextlib.suppress(OSError):
                os.unlink(p)
        with contextlib.suppress(OSError):
            os.rmdir(out_dir)
        return code, texts[0], texts[1], timed_out


_server: Server | None = None


def server() -> Server | None:
    """This test process's server (started on first use); None with EXPERIMENTS_TEST_COLD=1."""
    global _server
    if COLD:
        return None
    if _server is None or _server.proc.poll() is not None:
        _server = Server()
    return _server
