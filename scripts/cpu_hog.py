"""Run a command with a CPU hog on every core beside it: ``python scripts/cpu_hog.py -- CMD``.

One busy-looping process per core (``os.cpu_count()``, or ``--procs``) for as long as CMD
runs; the hogs stop when it ends (and by themselves after ``--max-s`` seconds, or when this
process dies). Exits with CMD's status. ``make test-stress`` runs the suite this way, to
show that no test depends on how busy the machine is.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import time


def _burn(parent: int, max_s: float) -> None:
    end = time.monotonic() + max_s
    x = 0
    while time.monotonic() < end:
        for _ in range(200_000):  # pure Python arithmetic: one core, no memory traffic
            x = (x * 31 + 7) % 1_000_003
        if os.getppid() != parent:  # the runner died: stop
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-s", type=float, default=3 * 3600)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    hogs = [
        mp.Process(target=_burn, args=(os.getpid(), args.max_s), daemon=True)
        for _ in range(args.procs)
    ]
    for hog in hogs:
        hog.start()
    print(f"cpu_hog: {len(hogs)} busy process(es) beside: {' '.join(command)}", flush=True)
    try:
        return subprocess.call(command)
    finally:
        for hog in hogs:
            hog.terminate()
        for hog in hogs:
            hog.join()


if __name__ == "__main__":
    sys.exit(main())
