"""Rules that keep the suite from flaking on a busy machine: no test waits a guessed time,
and every process a test starts is bounded and reported (``helpers.run_process``)."""

from __future__ import annotations

import re

from tests.helpers import REPO

TESTS = REPO / "tests"
# file -> calls allowed there, each with why it does not wait for a guessed duration
ALLOWED = {
    "slurm_cluster.py": {
        "subprocess.run": "the cluster's daemons and commands, each with a time limit",
        "time.sleep": "polls a job's state against a deadline (wait_job)",
    },
    "test_slurm.py": {
        "subprocess.Popen": "a reference run in the background, waited for with a limit",
        "time.sleep": "polls for a job's first checkpoint against a deadline",
    },
    "test_faults.py": {"subprocess.Popen": "a lock holder that waits on its stdin until killed"},
    "test_unwritable.py": {"subprocess.run": "mount/umount a tmpfs, each with a time limit"},
    "helpers.py": {
        "subprocess.Popen": "run_process itself: communicate with a time limit",
        "subprocess.run": "named in run_process's docstring",
        "time.sleep": "Rendezvous polls for other runs' files against a deadline; Started "
        "makes a job's step slow on purpose, to be killed in",
    },
    "test_reliability.py": {"time.sleep": "after the writer has saved: where a kill lands"},
    "test_state_dict_checkpoint.py": {
        "time.sleep": "after the writer has saved: where a kill lands"
    },
    "test_sweep_faults.py": {"time.sleep": "polls for a worker's files/exit against a deadline"},
    "test_ray.py": {"time.sleep": "polls for the running jobs before SIGTERM, against a deadline"},
    "test_supply_chain.py": {"subprocess.run": "pip --no-index on a local wheel, time-limited"},
}
WATCHED = ("subprocess.run", "subprocess.Popen", "time.sleep")


def test_waits_and_processes_only_where_reviewed():
    files = sorted(TESTS.glob("*.py"))
    assert len(files) > 20
    found = {}
    for path in files:
        text = path.read_text()
        calls = {c for c in WATCHED if re.search(re.escape(c) + r"\(", text)}
        if path.name == "test_suite_rules.py":
            continue
        unexpected = calls - set(ALLOWED.get(path.name, {}))
        if unexpected:
            found[path.name] = sorted(unexpected)
    assert found == {}, "use helpers.run_process / wait on an event instead"


def test_no_test_asserts_a_rate_or_a_duration():
    # numbers that move with load are compared with a bound nowhere (benchmarks measure them);
    # the profiling tests compare fractions of virtual time, fixed by construction
    pattern = re.compile(r"(_per_s|wall_time|elapsed|duration|_frac)\W*\s*[<>]=?\s*(?!0\b)\d")
    hits = [
        f"{p.name}:{i}"
        for p in sorted(TESTS.glob("test_*.py"))
        if p.name not in ("test_suite_rules.py", "test_profiling.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []
