"""`make bench` runs end to end on a tiny setting and writes its report (timings unchecked)."""

from __future__ import annotations

import re
import sys

import pytest

from tests.conftest import REPO, run_cli


@pytest.mark.slow
def test_quick_bench_writes_every_section(tmp_path):
    res = run_cli("-m", "benchmarks.run", "--quick", "--out", str(tmp_path), cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    report = (tmp_path / "results.md").read_text()
    headings = ("1. Step time", "2. Start-up", "3. Data", "4. torch.compile", "5. Time to accuracy")
    for heading in (*headings, "Targets"):
        assert heading in report, heading
    for row in (
        "CNN b64",
        "MLP b64",
        "train to first step",
        "--help",
        "--cfg job",
        "bad override",
        "cache=tensors",
        "in-memory tensors",
        "batch-level path (TensorStore)",
        "compiled step",
        "digits: val/acc ≥ 0.97",
        "| hand loop |",
        "framework / hand loop, time to target",
    ):
        assert row in report, row
    assert "| machine |" in report and "torch" in report
    assert (tmp_path / "results.png").stat().st_size > 1000
    assert not re.search(r"\bnan\b", report.lower()), "a measurement came back NaN"


def test_bench_rejects_an_unknown_section(tmp_path):
    from benchmarks.run import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--only", "step,nope"])
    assert parse_args(["--quick"]).quick and sys.executable
