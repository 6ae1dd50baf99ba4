"""scripts/subset_csv.py: balanced subsets and long-tailed sets of a CSV-indexed image folder."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "subset_csv.py"


def _write(path: Path, per_class: int = 50, k: int = 10) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["filename", "label"])
        for i in range(per_class * k):
            writer.writerow([f"img_{i:05d}.png", str(i % k)])
    return path


def _run(*args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True
    )


def _read(path: Path) -> list[tuple[str, str]]:
    with open(path, newline="") as f:
        return [(r["filename"], r["label"]) for r in csv.DictReader(f)]


def test_per_class_subset_is_exact_deterministic_and_in_file_order(tmp_path):
    src = _write(tmp_path / "train.csv")
    assert _run(src, "--per-class", 7).returncode == 0
    rows = _read(tmp_path / "train_per7.csv")
    assert Counter(label for _, label in rows) == {str(c): 7 for c in range(10)}
    names = [name for name, _ in rows]
    assert names == sorted(names) and set(names) <= {n for n, _ in _read(src)}
    _run(src, "--per-class", 7, "--out", tmp_path / "again.csv")
    assert _read(tmp_path / "again.csv") == rows
    _run(src, "--per-class", 7, "--seed", 1, "--out", tmp_path / "other.csv")
    assert _read(tmp_path / "other.csv") != rows


def test_long_tailed_profiles_reach_the_ratio(tmp_path):
    src = _write(tmp_path / "train.csv", per_class=100)
    res = _run(src, "--imbalance", 10)
    assert res.returncode == 0 and "max/min 10.00" in res.stdout, res.stderr
    counts = Counter(label for _, label in _read(tmp_path / "train_lt10_exp.csv"))
    sizes = [counts[str(c)] for c in range(10)]
    assert sizes[0] == 100 and sizes[-1] == 10 and sizes == sorted(sizes, reverse=True)
    _run(src, "--imbalance", 10, "--profile", "step", "--order", "9,8,7,6,5,4,3,2,1,0")
    counts = Counter(label for _, label in _read(tmp_path / "train_lt10_step.csv"))
    assert [counts[str(c)] for c in (9, 5, 4, 0)] == [100, 100, 10, 10]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["missing.csv", "--per-class", 3], "CSV file not found"),
        (["{src}", "--per-class", 80], "0 has 50"),
        (["{src}", "--imbalance", 0.5], "must be >= 1"),
        (["{src}"], "exactly one of"),
        (["{src}", "--imbalance", 2, "--order", "0,1"], "--order must name each class once"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, args, named):
    src = _write(tmp_path / "train.csv")
    res = _run(*[str(a).replace("{src}", str(src)) for a in args])
    assert res.returncode == 2 and named in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
