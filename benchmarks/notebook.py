"""The lab notebook's index on 1,000 synthetic run folders (the real format, written by
tests/test_notebook.py): cold (no cache), warm (nothing changed), one folder changed,
the worst case of 1,000 distinct configs, and the size of the HTML report.

    python benchmarks/notebook.py [N]     # prints one line per measure; writes under outputs/
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.test_notebook import write_runs  # noqa: E402

from experiments import find_runs  # noqa: E402
from experiments.analysis.notebook.index import INDEX_FILE  # noqa: E402
from experiments.analysis.notebook.report import write_report  # noqa: E402


def timed(what: str, call) -> float:
    start = time.perf_counter()
    result = call()
    seconds = time.perf_counter() - start
    print(f"{what:44} {seconds:6.2f} s  ({len(result)} runs)")
    return seconds


def main(n: int = 1000) -> None:
    root = REPO / "outputs" / "bench_notebook"
    shutil.rmtree(root, ignore_errors=True)
    write_runs(root / "sweeps", n)  # sweeps of 20 jobs: lr x seed, as real sweeps share configs
    find_runs(root / "sweeps", limit=1, cache=False)  # imports (pandas) out of the timing
    timed(f"cold: {n} folders, no cache", lambda: find_runs(root / "sweeps"))
    timed(f"warm: {n} folders, cache, nothing changed", lambda: find_runs(root / "sweeps"))
    changed = root / "sweeps" / "sweep_000" / "0" / "metrics.json"
    changed.write_text(changed.read_text() + " ")
    timed("warm: one folder changed", lambda: find_runs(root / "sweeps"))
    write_runs(root / "distinct", n, jobs_per_sweep=1)  # every run its own sweep
    for i, config in enumerate(sorted((root / "distinct").glob("*/0/.hydra/config.yaml"))):
        text = config.read_text().replace("weight_decay: 0.0", f"weight_decay: {i}.0e-6")
        config.write_text(text)  # 1,000 distinct texts
    timed(f"cold: {n} folders, {n} distinct configs", lambda: find_runs(root / "distinct"))
    (root / "sweeps" / INDEX_FILE).unlink()
    start = time.perf_counter()
    out, runs, size = write_report(root / "sweeps", root / "runs.html")
    print(f"{'report: ' + str(runs) + ' runs':44} {time.perf_counter() - start:6.2f} s  "
          f"{size / 1e6:.2f} MB ({out})")  # fmt: skip


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
