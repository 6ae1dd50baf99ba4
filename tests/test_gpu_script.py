"""The GPU check (benchmarks/gpu.py) runs end to end on the CPU in its --dry-run mode and
writes the gpu.md it writes on a GPU: the device, every step setting, every recipe."""

from __future__ import annotations

import re

import pytest
import torch

from tests.helpers import REPO, run_inproc

NUMBER = r"\d+\.\d+"


@pytest.mark.slow  # a fresh training process a recipe: 25-45 s on 2 shared cores
def test_gpu_check_dry_run_writes_every_row(tmp_path):
    threads = torch.get_num_threads()  # the script sets its own; the test process keeps its
    try:
        res = run_inproc("-m", "benchmarks.gpu", "--dry-run", "--out", str(tmp_path), cwd=REPO)
    finally:
        torch.set_num_threads(threads)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    report = (tmp_path / "gpu.md").read_text()
    assert re.search(r"^\| \S+ CPU \(dry run\) \| 3\.\d+", report, re.M), report
    for setting in ("32-true, eager", "bf16-mixed, eager"):
        row = rf"^\| {re.escape(setting)} \| MLP b64 \(overhead-bound\) \|"
        assert re.search(row + rf"( {NUMBER} \|){{6}}$", report, re.M), setting
    for setting in ("32-true, compiled", "bf16-mixed, compiled"):
        assert f"| {setting} | skipped in --dry-run |" in report
    # speedrun_mnist: reached 1/1, then times, whole-run seconds and test accuracy
    mnist = rf"^\| speedrun_mnist \| val/acc>=0\.0 \| 1/1 \|( {NUMBER} \|){{4}}$"
    assert re.search(mnist, report, re.M), report
    fashion = re.search(r"^\| speedrun_fashion_mnist \| .*$", report, re.M)
    assert fashion, report  # measured, or "not run" naming the missing config
    assert "not run: no conf/experiment" in fashion[0] or "| 1/1 |" in fashion[0]
    assert re.search(r"^\| speedrun_cifar10 \| .* \| not run: ", report, re.M), report
    assert (
        not (REPO / "benchmarks" / "gpu.md").exists()
        or "dry run" not in (REPO / "benchmarks" / "gpu.md").read_text()
    )


def test_gpu_check_refuses_a_dry_run_over_the_committed_table(capsys):
    from benchmarks.gpu import parse_args

    with pytest.raises(SystemExit) as exc:
        parse_args(["--dry-run"])
    assert exc.value.code == 2 and "--dry-run needs --out" in capsys.readouterr().err
