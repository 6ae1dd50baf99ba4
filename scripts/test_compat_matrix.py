"""`make test-compat`: the compat tests and a short end-to-end run on each end of our ranges.

Each row of MATRIX gets its own venv under .compat/<name>/ holding only the releases under test;
everything else comes from the project venv through a .pth file that adds the project venv's
site-packages *after* the row's own (so the row's release wins, and torch is not installed
again). The project venv is never written to. Rows install by version from the package index
without hash checking (they are not in the lock by design), and a row whose pins hit
security/known-bad.toml is refused before anything is installed.

    python scripts/test_compat_matrix.py [ROW ...]   # all rows, or the named ones

Prints one line per row (versions, `pip check`, pytest's result, seconds) and exits 1 if a row
that should pass failed. Rows marked `expect="outside"` test a release outside pyproject's
range (a range we might widen to); their failure is reported, not fatal.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".venv"
COMPAT = REPO / ".compat"
_spec = importlib.util.spec_from_file_location("supply_chain", REPO / "scripts/supply_chain.py")
supply_chain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(supply_chain)

# the compat tests, then train + resume, an Optuna sweep that resumes, eval of a trained run,
# and Optuna's importance (the evaluator changed in optuna 5)
TESTS = [
    "tests/test_compat.py",
    "tests/test_faults.py::test_csv_history_and_curves_survive_any_number_of_resumes",
    "tests/test_sweeps.py::test_optuna_search_runs_trials_and_resumes",
    "tests/test_eval.py::test_reproduces_the_runs_test_acc_exactly",
    "tests/test_importance.py::test_an_optuna_search_shows_fanova_importance",
]


@dataclass(frozen=True)
class Row:
    name: str
    pins: tuple[str, ...]
    why: str
    expect: str = "inside"  # "outside": a release pyproject does not admit (yet)


MATRIX = [
    # lightning>=2.6.6,<2.7: 2.6.6 is both the oldest and the newest allowed release (2.6.6 is
    # the newest on the index), so the project venv's own run is that row
    Row("base", (), "the lock: lightning 2.6.6 (oldest = newest allowed), optuna 5.x, hydra 1.3.8"),
    Row("optuna-4.0", ("optuna==4.0.0",), "oldest allowed optuna"),
    Row("optuna-4.9", ("optuna==4.9.0",), "newest optuna 4.x"),
    Row("hydra-1.3.7", ("hydra-core==1.3.7",), "oldest allowed hydra-core"),
    # 1.4.0rc3 needs omegaconf>=2.4.1rc1 (2.3's private _validation_context is gone)
    Row(
        "hydra-1.4.0rc3",
        ("hydra-core==1.4.0rc3", "omegaconf==2.4.1rc1"),
        "newest 1.4 candidate (outside our range)",
        expect="outside",
    ),
]


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def _site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def make_venv(row: Row) -> Path:
    """The row's venv: its pins, then the project venv's packages behind them."""
    venv = COMPAT / row.name
    python = venv / "bin" / "python"
    stamp = venv / ".pins"
    if stamp.exists() and stamp.read_text() == "\n".join(row.pins):
        return python
    if not python.exists():
        _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # addsitedir (not a bare path) so the project venv's own .pth files run too (the editable
    # install of `experiments`); it appends, so this venv's packages come first
    (_site_packages(venv) / "zz_project_venv.pth").write_text(
        f"import site; site.addsitedir({str(_site_packages(VENV))!r})\n"
    )
    if row.pins:
        # the project venv's pip, run as this venv's interpreter: installs into this venv only
        cmd = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        cmd += ["--no-deps", *(["--pre"] if row.expect == "outside" else []), *row.pins]
        done = _run(cmd)
        if done.returncode:
            raise RuntimeError(f"{row.name}: pip install failed: {done.stderr.strip()[-500:]}")
    stamp.write_text("\n".join(row.pins))
    return python


def versions(python: Path) -> str:
    code = (
        "import importlib.metadata as m; "
        "print(' '.join(f'{n} {m.version(n)}' for n in "
        "('lightning', 'optuna', 'hydra-core', 'omegaconf', 'torch')))"
    )
    return _run([str(python), "-c", code]).stdout.strip()


def run_row(row: Row) -> tuple[bool, str]:
    entries = supply_chain.load_known_bad()
    refused = [line for pin in row.pins for line in supply_chain.admitted_bad(pin, entries)]
    if refused:
        return False, f"refused, known bad: {refused[0]}"
    start = time.monotonic()
    python = make_venv(row)
    setup = time.monotonic() - start
    check = _run([str(python), "-m", "pip", "check", "--disable-pip-version-check"])
    deps = "pip check ok" if check.returncode == 0 else f"pip check: {check.stdout.strip()}"
    start = time.monotonic()
    # one worker: the machine is shared; these are the slow end-to-end tests
    test = _run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *TESTS],
        cwd=REPO,
    )
    took = time.monotonic() - start
    summary = (test.stdout.strip().splitlines() or ["(no output)"])[-1]
    ok = test.returncode == 0
    line = f"{versions(python)} | {deps} | {summary} | setup {setup:.0f} s, tests {took:.0f} s"
    if not ok:
        failed = [x for x in test.stdout.splitlines() if x.startswith(("FAILED", "ERROR"))]
        tail = (test.stdout + test.stderr).strip().splitlines()[-20:]
        line += "\n    " + "\n    ".join(failed[:8] or tail)
    return ok, line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", help=f"rows to run: {[r.name for r in MATRIX]}")
    args = parser.parse_args(argv)
    known = {r.name: r for r in MATRIX}
    unknown = [n for n in args.rows if n not in known]
    if unknown:
        print(f"error: no matrix row {unknown[0]!r}; rows: {', '.join(known)}", file=sys.stderr)
        return 2
    rows = [known[n] for n in args.rows] or MATRIX
    fatal = False
    for row in rows:
        try:
            ok, line = run_row(row)
        except RuntimeError as e:
            ok, line = False, str(e)
        tag = "pass" if ok else ("FAIL" if row.expect == "inside" else "fails (outside range)")
        print(f"{row.name:16} {tag:22} {row.why}\n    {line}", flush=True)
        fatal |= not ok and row.expect == "inside"
    return 1 if fatal else 0


if __name__ == "__main__":
    sys.exit(main())
