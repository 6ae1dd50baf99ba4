"""`make bench` runs end to end on a tiny setting and writes its report (timings unchecked)."""

from __future__ import annotations

import re

import pytest

from tests.helpers import REPO, run_cli


@pytest.mark.slow
def test_quick_bench_writes_every_section(tmp_path):
    res = run_cli("-m", "benchmarks.run", "--quick", "--out", str(tmp_path), cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    report = (tmp_path / "results.md").read_text()
    headings = ("1. Step time", "2. Start-up", "3. Data", "Targets")
    rows = ("CNN b64", "MLP b64", "CNN b64, compile=true", "train to first step", "--help")
    rows += ("--cfg job", "bad override", "unknown option", "cache=tensors", "in-memory tensors")
    rows += ("batch-level path (TensorStore)",)
    for text in (*headings, *rows, "| python, torch, lightning |"):
        assert text in report, text
    assert not re.search(r"\bnan\b|n/a", report.lower()), "a measurement is missing"


def test_bench_rejects_an_unknown_section():
    from benchmarks.run import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--only", "step,nope"])
    args = parse_args(["--only", "step", "compile=true"])
    assert args.only == ["step"] and args.overrides == ["compile=true"]


def test_bench_writes_the_committed_tables_only_when_asked(tmp_path):
    from benchmarks.run import parse_args

    assert parse_args(["--quick"]).out == str(REPO / "outputs" / "bench")
    assert parse_args(["--update-docs"]).out == str(REPO / "benchmarks")
    assert parse_args(["--out", str(tmp_path)]).out == str(tmp_path)
    assert "benchmarks.run --update-docs" in (REPO / "Makefile").read_text()


def test_make_data_writes_the_png_folder_the_docs_use():
    rule = re.search(r"^data: .*\n\t(.+)$", (REPO / "Makefile").read_text(), flags=re.M)
    assert rule and "--image-csv fashion_mnist" in rule.group(1)
    assert "data/fashion_mnist_png" in (REPO / "docs" / "models.md").read_text()
