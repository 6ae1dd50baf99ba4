"""The suite's warm start (tests/warm_server.py) changes nothing a run does: the same command
forked from the warm server and started in a fresh interpreter prints the same lines, exits
the same way and writes the same weights, bit for bit."""

from __future__ import annotations

import json
import re

import pytest

from experiments.runs.layout import RunDir
from tests import warm
from tests.conftest import run_cli

TIMES = re.compile(r"\d\d:\d\d:\d\d|done in [\d.]+ s|\b(cold|warm)\b")


def _run(tmp_path, data_dir, name: str, *args: str, cold: bool):
    res = run_cli(
        "-m", "experiments.train", *args, f"paths.data_dir={data_dir}",
        f"hydra.run.dir={tmp_path / name}", cwd=tmp_path, cold=cold,
    )  # fmt: skip
    return res.returncode, TIMES.sub("", res.stdout), TIMES.sub("", res.stderr)


@pytest.mark.slow
@pytest.mark.skipif(warm.COLD, reason="EXPERIMENTS_TEST_COLD=1: every run is cold")
def test_a_warm_run_is_the_run_a_fresh_interpreter_makes(tmp_path, data_dir):
    args = ("trainer.max_epochs=2", "logger=csv", "seed=3")
    cold = _run(tmp_path, data_dir, "cold", *args, cold=True)
    hot = _run(tmp_path, data_dir, "warm", *args, cold=False)
    assert cold[0] == hot[0] == 0, cold[2][-2000:] + hot[2][-2000:]
    assert cold[1] == hot[1]  # stdout
    assert cold[2] == hot[2]  # stderr: Lightning's notices stay off the console either way
    weights = [RunDir(tmp_path / n).best_weights.read_bytes() for n in ("cold", "warm")]
    assert weights[0] == weights[1]
    metrics = [json.loads((tmp_path / n / "metrics.json").read_text()) for n in ("cold", "warm")]
    for m in metrics:
        m.pop("wall_time_s"), m.pop("run_dir")
    assert metrics[0] == metrics[1]

    # a user's mistake: the same one line and exit code
    bad = [_run(tmp_path, data_dir, f"bad{c}", "model=nope", cold=c) for c in (True, False)]
    assert bad[0] == bad[1] and bad[0][0] == 2 and "model=nope" in bad[0][2]
