"""A sweep's job processes end with the sweep: when the process that runs a sweep dies (even
by ``kill -9``, which it cannot catch), the worker processes its launcher started for the
jobs (joblib's loky workers, local submitit jobs) stop too, instead of training on as
orphans that nobody collects and that hold their run dirs against the next run.

The sweep's process puts its pid in the environment (:func:`mark_sweep_process`) before the
launcher starts workers, so they inherit it; each job started in such a worker watches that
its parent is still that process (:func:`end_with_sweep_process`). When it is gone the job
gets SIGTERM, the signal Lightning already turns into a checkpoint and a recorded
``interrupted`` job (the same command again resumes it), and SIGKILL if it has not ended
``grace_s`` later. A parent's pid is polled rather than ``prctl(PR_SET_PDEATHSIG)`` asked
for: that signal follows the *thread* that forked the worker, and loky forks from threads
that end while the sweep runs on. Imports no torch.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

log = logging.getLogger(__name__)

SWEEP_PID_ENV = "EXPERIMENTS_SWEEP_PID"
POLL_S = 0.5
GRACE_S = 30.0

_watching: list[int] = []  # the sweep process this process watches, once


def mark_sweep_process() -> None:
    """In the process that runs a sweep: its workers, started later, inherit its pid."""
    os.environ[SWEEP_PID_ENV] = str(os.getpid())


def end_with_sweep_process(poll_s: float = POLL_S, grace_s: float = GRACE_S) -> None:
    """In a job's process that the sweep's process started: end with it (see above). Nothing
    in the sweep's own process (the basic launcher) or one someone else started (a Ray worker)."""
    sweep = os.environ.get(SWEEP_PID_ENV, "")
    if _watching or not sweep.isdigit() or int(sweep) == os.getpid():
        return
    sweep_pid = int(sweep)
    if os.getppid() != sweep_pid and alive(sweep_pid):
        return  # started by another process (a Ray raylet): not the sweep's worker
    _watching.append(sweep_pid)
    threading.Thread(
        target=_watch, args=(sweep_pid, poll_s, grace_s), name="sweep-process-watch", daemon=True
    ).start()


def exit_if_orphaned(code: int) -> None:
    """End this process at once (``code``) when the sweep's process that started it is gone:
    called once the job's state is recorded, since nobody waits for its result and a
    launcher's worker loop would otherwise wait out the grace period."""
    if _watching and os.getppid() != _watching[0]:
        logging.shutdown()  # flush the job's log file
        os._exit(code)


def _watch(sweep_pid: int, poll_s: float, grace_s: float) -> None:
    while os.getppid() == sweep_pid:
        time.sleep(poll_s)
    log.error(
        "the sweep's process (pid %d) is gone: this job stops (a checkpoint is saved when it "
        "can be; the same sweep command again resumes it)",
        sweep_pid,
        extra={"sweep_line": True},
    )
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os.kill(os.getpid(), signal.SIGKILL)  # SIGTERM was ignored, or saving hung


def alive(pid: int) -> bool:
    """Whether process ``pid`` lives here (someone else's, or a pid no process can have, as
    a hostile lock file may give: assumed alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        pass
    return True
