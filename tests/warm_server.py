"""A warm start for the suite's CLI runs: ``python tests/warm_server.py SOCKET``.

Every ``python -m experiments.*`` run of the suite used to pay 5 s of imports (torch,
torchvision and the torch._dynamo it pulls in, torchmetrics, Lightning) before doing a second
of work. This server imports those once and then forks one process per request: the child
takes the request's working dir, environment, ``sys.path`` and arguments, and runs the module
as ``__main__`` exactly as ``python -m`` would. It is the same fork a DataLoader worker is made
with, from a process that has only imported libraries (no tensors, no CUDA, no thread of its
own). ``experiments`` itself is never imported here, so every child imports the code as it is
on disk (a test may run a modified copy of ``src/``).

What a fresh interpreter would differ in, and how the child matches it:
- environment variables that libraries read when they are imported (``OMP_NUM_THREADS``,
  ``TORCH*``, ...): the client (tests/warm.py) runs such a command cold instead;
- random state: Python's, NumPy's and torch's global generators are re-seeded from the OS;
- the end of the process: non-daemon threads are joined, atexit functions run and the
  streams are flushed, in the interpreter's order.

Protocol: one JSON request per connection (``args``, ``cwd``, ``env``, ``stdout``,
``stderr`` file paths), answered by two lines: the child's pid, then its exit code (negative:
killed by that signal), as ``subprocess`` reports it."""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import sys
import traceback

PRELOAD = ("numpy", "torch", "torchvision", "torchmetrics", "lightning.pytorch", "hydra",
           "omegaconf", "PIL.Image")  # fmt: skip


def _exit_code(err: SystemExit) -> int:
    if err.code is None:
        return 0
    if isinstance(err.code, int):
        return err.code
    print(err.code, file=sys.stderr)
    return 1


def _reseed() -> None:
    import random

    import numpy as np
    import torch

    random.seed()
    np.random.seed(int.from_bytes(os.urandom(4), "little"))
    torch.seed()


def run_child(req: dict, base_path: list[str]) -> None:
    """In the forked child: become the requested ``python -m`` process; never returns."""
    code = 1
    try:
        os.setsid()  # its own process group, as the cold path's start_new_session
        stdin = os.open(os.devnull, os.O_RDONLY)
        out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for fd, target in ((stdin, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.getcwd(), *extra, *base_path]
        importlib.invalidate_caches()
        _reseed()
        flag, module, *args = req["args"]
        assert flag == "-m", req["args"]
        sys.argv = [module, *args]
        import runpy

        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except KeyboardInterrupt:
            traceback.print_exc()
            code = 128 + signal.SIGINT
        except BaseException:
            traceback.print_exc()
            code = 1
        import atexit
        import threading

        getattr(threading, "_shutdown", lambda: None)()  # join non-daemon threads first
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: S110 - a closed stream at exit, as the interpreter's
                pass
        os._exit(code)


def serve(conn: socket.socket, base_path: list[str]) -> None:
    """In a runner forked per request: fork the child, report its pid and exit code."""
    try:
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                os._exit(0)
            data += chunk
        req = json.loads(data)
        pid = os.fork()
        if pid == 0:
            conn.close()
            run_child(req, base_path)
        conn.sendall(f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    finally:
        os._exit(0)


def main(path: str) -> None:
    # what a fresh `python -m` gets after its working dir and PYTHONPATH entries
    own = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in sys.path[1:] if p not in own]
    for name in PRELOAD:
        importlib.import_module(name)
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    server.settimeout(2.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # runners are reaped by the kernel
    print("ready", flush=True)
    while os.getppid() == parent:  # the test process is gone: so is the server
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            conn.settimeout(None)
            serve(conn, base_path)
        conn.close()


if __name__ == "__main__":
    main(sys.argv[1])
