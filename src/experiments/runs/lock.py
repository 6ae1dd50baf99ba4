"""One trainer per run dir: the process that trains in a run folder holds an exclusive lock
on ``<run>/.lock``; a second one is refused in one line naming the holder.

The lock is an ``fcntl`` lock, so the kernel releases it when its process dies, however it
dies: a lock left by a killed process is simply taken over by the next one.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

from experiments.errors import UserError
from experiments.runs.layout import RunDir

log = logging.getLogger(__name__)


class RunLock:
    """Hold ``<run_dir>/.lock`` while training (``with RunLock(run_dir): ...``).

    Raises:
        UserError: another live process holds the lock (its pid, host and start time).
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.path = RunDir(run_dir).lock_file
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise UserError(
                f"{self.path.parent} is in use by another trainer ({holder}); wait for it to "
                f"finish or stop it, or train in another run dir"
            ) from None
        previous = _read_holder(fd)
        if previous != "unknown holder":
            log.info("took over the lock of %s (left by %s)", self.path.parent, previous)
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv[:1] + sys.argv[1:4]),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)  # an empty file: nobody holds it
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def check_free(run_dir: str | Path) -> None:
    """Refuse early (before Hydra rewrites anything in it) when a run dir is being trained."""
    lock = RunLock(run_dir)
    if lock.path.is_file():
        lock.acquire().release()


def _read_holder(fd: int) -> str:
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"null")
    except ValueError:
        record = None
    if not isinstance(record, dict):
        return "unknown holder"
    return f"pid {record.get('pid')} on {record.get('host')}, since {record.get('started')}"
