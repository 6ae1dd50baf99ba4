"""scripts/subset_csv.py: balanced subsets and long-tailed sets of a CSV-indexed image folder."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers import REPO, run_process

SCRIPT = REPO / "scripts" / "subset_csv.py"
NAMES = ["t-shirt", "trouser", "pullover", "dress", "coat"]  # deliberately not sorted


def _write(path: Path, per_class: int = 50, k: int = 10, names: bool = False) -> Path:
    """``per_class * k`` rows, classes interleaved; labels are integers or class names."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["filename", "label"])
        for i in range(per_class * k):
            writer.writerow([f"img_{i:05d}.png", NAMES[i % k] if names else str(i % k)])
    return path


def _run(*args: object) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SCRIPT), *map(str, args)]
    return run_process(cmd)


def _read(path: Path) -> list[tuple[str, str]]:
    with open(path, newline="") as f:
        return [(r["filename"], r["label"]) for r in csv.DictReader(f)]


def _sizes(path: Path, k: int = 10) -> list[int]:
    counts = Counter(label for _, label in _read(path))
    return [counts[str(c)] for c in range(k)]


def test_per_class_subset_is_exact_in_file_order_and_references_input_files(tmp_path):
    src = _write(tmp_path / "train.csv")
    res = _run(src, "--per-class", 7)
    out = tmp_path / "train_per7.csv"
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines() == [
        f"{out}: 70 rows (" + ", ".join(f"{c}=7" for c in range(10)) + ")"
    ]
    rows = _read(out)
    assert _sizes(out) == [7] * 10
    source = _read(src)
    assert set(rows) <= set(source)  # same filename with the same label
    positions = [source.index(row) for row in rows]
    assert positions == sorted(positions)
    assert not list(tmp_path.glob(".*tmp"))  # no temporary file left behind


def test_per_class_with_named_labels(tmp_path):
    src = _write(tmp_path / "train.csv", per_class=20, k=5, names=True)
    out = tmp_path / "sub.csv"
    res = _run(src, "--per-class", 3, "--out", out)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"{out}: 15 rows (coat=3, dress=3, pullover=3, t-shirt=3,")
    assert Counter(label for _, label in _read(out)) == dict.fromkeys(NAMES, 3)


def test_same_seed_same_file_other_seed_other_rows(tmp_path):
    src = _write(tmp_path / "train.csv")
    for name, seed in (("a.csv", 0), ("b.csv", 0), ("c.csv", 1)):
        assert _run(src, "--per-class", 7, "--seed", seed, "--out", tmp_path / name).returncode == 0
    a, b, c = ((tmp_path / n).read_bytes() for n in ("a.csv", "b.csv", "c.csv"))
    assert a == b and a != c
    assert _read(tmp_path / "c.csv") != _read(tmp_path / "a.csv")


def test_exp_profile_k10_r10(tmp_path):
    src = _write(tmp_path / "train.csv", per_class=100)
    res = _run(src, "--imbalance", 10)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("max/min 10.00"), res.stdout
    sizes = _sizes(tmp_path / "train_lt10_exp.csv")
    assert sizes[0] == 100 and sizes[-1] == round(100 / 10)
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 10
    assert sizes == [round(100 * 10 ** (-c / 9)) for c in range(10)]


def test_exp_profile_uses_smallest_class_as_n_max_and_follows_order(tmp_path):
    src = _write(tmp_path / "train.csv", per_class=100)
    with open(src, "a", newline="") as f:  # class 0 gets 30 more rows; n_max stays 100
        csv.writer(f).writerows([f"extra_{i}.png", "0"] for i in range(30))
    order = ",".join(str(c) for c in reversed(range(10)))
    res = _run(src, "--imbalance", 4, "--order", order, "--out", tmp_path / "lt.csv")
    assert res.returncode == 0, res.stderr
    sizes = _sizes(tmp_path / "lt.csv")
    assert sizes[9] == 100 and sizes[0] == 25 and sizes == sorted(sizes)
    assert "max/min 4.00" in res.stdout


def test_step_profile(tmp_path):
    src = _write(tmp_path / "train.csv", per_class=100)
    res = _run(src, "--imbalance", 10, "--profile", "step")
    assert res.returncode == 0, res.stderr
    assert _sizes(tmp_path / "train_lt10_step.csv") == [100] * 5 + [10] * 5
    assert "max/min 10.00" in res.stdout
    res = _run(src, "--imbalance", 10, "--profile", "step", "--order", "9,8,7,6,5,4,3,2,1,0")
    assert res.returncode == 0, res.stderr
    assert _sizes(tmp_path / "train_lt10_step.csv") == [10] * 5 + [100] * 5


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["{dir}/missing.csv", "--per-class", 3], "CSV file not found"),
        (["{bad}", "--per-class", 3], "lacks the column(s) label"),
        (["{src}", "--per-class", 80], "--per-class 80: too few rows: class '0' has 50"),
        (["{src}", "--per-class", 0], "--per-class must be >= 1"),
        (["{src}", "--imbalance", 0.5], "--imbalance must be a number >= 1, got 0.5"),
        (["{src}"], "give exactly one of --per-class"),
        (["{src}", "--per-class", 3, "--imbalance", 2], "give exactly one of --per-class"),
        (["{src}", "--imbalance", 2, "--order", "0,1,2,3,4,5,6,7,8,9,x"], "unknown x"),
        (["{src}", "--imbalance", 2, "--order", "0,1"], "missing 2,3,4,5,6,7,8,9"),
        (["{src}", "--imbalance", 2, "--order", "0,1,1,2,3,4,5,6,7,8,9"], "repeated 1"),
        (["{src}", "--per-class", "ten"], "invalid int value: 'ten'"),
        (["{src}", "--per-class", 3, "--out", "{dir}/no/such/out.csv"], "output folder not found"),
        (["{src}", "--per-class", 3, "--out", "{src}"], "would overwrite the input"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, args, named):
    src = _write(tmp_path / "train.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("filename,class\na.png,0\n")
    fill = {"{src}": str(src), "{bad}": str(bad), "{dir}": str(tmp_path)}
    res = _run(*(_fill(a, fill) for a in args))
    assert res.returncode == 2, res
    assert res.stderr.startswith("error: ") and named in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "train.csv"]


def _fill(arg: object, fill: dict[str, str]) -> str:
    text = str(arg)
    for key, value in fill.items():
        text = text.replace(key, value)
    return text


def test_classes_keeps_only_the_named_classes_before_subsetting(tmp_path):
    src = _write(tmp_path / "train.csv", per_class=40, k=5, names=True)
    out = tmp_path / "four.csv"
    res = _run(src, "--classes", "coat,t-shirt,dress", "--imbalance", 4, "--out", out)
    assert res.returncode == 0, res.stderr
    # the default order of the kept classes is by name: coat, dress, t-shirt -> 40, 20, 10
    assert Counter(label for _, label in _read(out)) == {"coat": 40, "dress": 20, "t-shirt": 10}
    bad = _run(src, "--classes", "coat,hat", "--per-class", 5, "--out", out)
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "error: --classes coat,hat: unknown hat (classes: coat,dress,pullover,t-shirt,trouser)"
    )
