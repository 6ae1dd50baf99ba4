"""The command line as users type it, in real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import run_cli


@pytest.mark.slow
def test_two_runs_at_once_get_their_own_dirs(tmp_path, data_dir):
    cmd = [sys.executable, "-m", "experiments.train", "debug=fast", f"paths.data_dir={data_dir}"]
    procs = [
        subprocess.Popen(
            cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    runs = sorted((tmp_path / "outputs" / "debug" / "runs").iterdir())
    assert len(runs) == 2
    for run in runs:
        metrics = json.loads((run / "metrics.json").read_text())
        assert 0.0 <= metrics["test/acc"] <= 1.0 and metrics["run_dir"] == str(run.resolve())
    assert "val/acc=" in outs[0] and "test/acc=" in outs[0]


@pytest.mark.slow
def test_multirun_makes_one_dir_per_job(tmp_path, data_dir):
    res = run_cli(
        "-m",
        "experiments.train",
        "-m",
        "optimizer.lr=0.01,0.1",
        "debug=fast",
        f"paths.data_dir={data_dir}",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    sweeps = list((tmp_path / "outputs" / "debug" / "multiruns").iterdir())
    assert len(sweeps) == 1
    jobs = sorted(p.name for p in sweeps[0].iterdir() if p.is_dir() and not p.name.startswith("."))
    assert jobs == ["0", "1"]
    for job in jobs:
        assert (sweeps[0] / job / "metrics.json").is_file()


def test_a_data_error_inside_training_is_one_line(tmp_path, data_dir):
    # config errors are checked before Hydra runs (see test_reliability's table); this one
    # surfaces only when the data is opened, after torch is loaded
    res = run_cli(
        "-m",
        "experiments.train",
        "data=image_csv",
        "data.csv_file=missing.csv",
        "data.image_dir=.",
        f"paths.data_dir={data_dir}",
        cwd=tmp_path,
    )
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2  # found before training
    assert lines[-1].startswith("error: CSV file not found") and "missing.csv" in lines[-1]
    assert "Traceback" not in res.stderr + res.stdout
    assert not list(tmp_path.rglob("metrics.json"))


def test_help_lists_every_group_and_option_without_composing_or_importing_torch(tmp_path):
    from experiments.config import CONF_DIR

    code = (
        "import sys, runpy\nsys.argv = ['train', '--help']\ntry:\n"
        "    runpy.run_module('experiments.train', run_name='__main__')\n"
        "except SystemExit as e:\n    print('exit', e.code, 'torch' in sys.modules)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert res.stdout.strip().endswith("exit 0 False"), res.stdout + res.stderr
    for path in CONF_DIR.rglob("*.yaml"):
        group = str(path.parent.relative_to(CONF_DIR))
        if group in (".", "paths") or path.stem.startswith("_"):  # _x.yaml: a shared fragment
            continue
        row = next(ln for ln in res.stdout.splitlines() if ln.split()[:1] == [group])
        assert path.stem in row, (group, path.stem)
    assert "--hydra-help" in res.stdout
