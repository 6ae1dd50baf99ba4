"""The command line as users type it, in real subprocesses."""

from __future__ import annotations

import gc
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from lightning.pytorch import Callback

from tests.helpers import REPO, run_inproc, run_process


@pytest.mark.slow
def test_two_runs_at_once_get_their_own_dirs(tmp_path, data_dir):
    cmd = [sys.executable, "-m", "experiments.train", "debug=fast", f"paths.data_dir={data_dir}"]
    with ThreadPoolExecutor(2) as pool:  # both started at once, each with run_process's limit
        done = list(pool.map(lambda _: run_process(cmd, cwd=tmp_path), range(2)))
    outs = [r.stdout + r.stderr for r in done]
    assert [r.returncode for r in done] == [0, 0], outs
    runs = sorted((tmp_path / "outputs" / "debug" / "runs").iterdir())
    assert len(runs) == 2
    for run in runs:
        metrics = json.loads((run / "metrics.json").read_text())
        assert 0.0 <= metrics["test/acc"] <= 1.0 and metrics["run_dir"] == str(run.resolve())
    assert "val/acc=" in outs[0] and "test/acc=" in outs[0]


@pytest.mark.slow
def test_multirun_makes_one_dir_per_job(tmp_path, data_dir):
    res = run_inproc(
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
    res = run_inproc(
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
    # errors first: no config tree in front of the one line (the tree is in the run dir)
    assert "_target_" not in res.stdout + res.stderr
    (saved,) = tmp_path.rglob(".hydra/config.yaml")
    assert "missing.csv" in saved.read_text()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["trainer.max_epochs=-1"], "trainer.max_epochs=-1 trains forever: also set"),
        (["paths.data_dir=/my", "data"], "quote the value: paths.data_dir='/my data'"),
    ],
)
def test_mistakes_before_training_are_one_line_with_the_way_out(tmp_path, args, named):
    res = run_inproc("-m", "experiments.train", *args, cwd=tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
    assert lines[0].startswith("error: ") and named in lines[0], lines
    assert not (tmp_path / "outputs").exists()


def test_help_lists_every_group_and_option_without_composing_or_importing_torch(tmp_path):
    from experiments.config import CONF_DIR

    code = (
        "import sys, runpy\nsys.argv = ['train', '--help']\ntry:\n"
        "    runpy.run_module('experiments.train', run_name='__main__')\n"
        "except SystemExit as e:\n    print('exit', e.code, 'torch' in sys.modules)\n"
    )
    res = run_process([sys.executable, "-c", code], cwd=tmp_path)
    assert res.stdout.strip().endswith("exit 0 False"), res.stdout + res.stderr
    for path in CONF_DIR.rglob("*.yaml"):
        group = str(path.parent.relative_to(CONF_DIR))
        if group in (".", "paths") or path.stem.startswith("_"):  # _x.yaml: a shared fragment
            continue
        row = next(ln for ln in res.stdout.splitlines() if ln.split()[:1] == [group])
        assert path.stem in row, (group, path.stem)
    assert "--hydra-help" in res.stdout


def test_a_single_run_composes_its_config_once_and_hydra_writes_the_run_dir(
    tmp_path, data_dir, monkeypatch
):
    # @hydra.main composes twice (mode, then run) and the pre-check once more; a plain run
    # is composed once by the check and handed to Hydra's job runner
    from hydra._internal.hydra import Hydra

    calls, compose = [], Hydra.compose_config

    def counted(self, *a, **k):
        calls.append(k.get("run_mode"))
        return compose(self, *a, **k)

    monkeypatch.setattr(Hydra, "compose_config", counted)
    res = run_inproc("-m", "experiments.train", "debug=fast", f"paths.data_dir={data_dir}",
                     "hydra.run.dir=run", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(calls) == 1, calls
    run = tmp_path / "run"
    assert json.loads((run / "metrics.json").read_text())["run_dir"] == str(run.resolve())
    from omegaconf import OmegaConf

    hydra_cfg = OmegaConf.load(run / ".hydra" / "hydra.yaml").hydra
    assert hydra_cfg.mode == "RUN" and hydra_cfg.job.name == "train"
    assert OmegaConf.load(run / ".hydra" / "overrides.yaml")[0] == "debug=fast"
    assert OmegaConf.load(run / ".hydra" / "config.yaml").paths.data_dir == str(data_dir)
    assert (run / "train.log").read_text().count("val/acc=") >= 1  # Hydra's job logging


def test_comma_values_without_multirun_are_one_line(tmp_path):
    res = run_inproc("-m", "experiments.train", "optimizer.lr=0.01,0.1", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "error: optimizer.lr=0.01,0.1: a sweep runs with -m (one job per value); for one run "
        "with a list write optimizer.lr=[...], with a string containing commas quote it"
    ]


@pytest.mark.slow
def test_the_collector_is_paused_for_start_up_only(tmp_path, data_dir):
    # start-up's ~500k long-lived objects are frozen and the collector is back on for
    # training, in the first job of a sweep run in one process and in the next
    probe = tmp_path / "gc.txt"
    res = run_inproc(
        "-m",
        "experiments.train",
        "-m",
        "seed=1,2",
        "debug=fast",
        f"paths.data_dir={data_dir}",
        "+callbacks.gc_probe._target_=tests.test_cli.GcProbe",
        f"+callbacks.gc_probe.path={probe}",
        cwd=tmp_path,
        env_extra={"PYTHONPATH": str(REPO)},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [line.split() for line in probe.read_text().splitlines()]
    assert [r[0] for r in rows] == ["True", "True"]
    assert int(rows[0][1]) > 100_000  # frozen once, at the first job's start
    assert int(rows[1][1]) <= int(rows[0][1])  # not frozen again (the count only shrinks)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["trainer.max_epoch=3"], "did you mean trainer.max_epochs?"),
        (["trainer=gpu"], "trainer.accelerator=gpu: no CUDA GPU is visible here"),
        (["model=backbone", "model.net.pretrained=~/w.pt"], "quote a value that starts with ~"),
        (
            ["model=backbone", "model.net.name=convnext_atto"],
            "model.net.name=convnext_atto: an input of 8x8 is too small for it",
        ),
    ],
)
def test_misspelled_keys_and_a_gpu_that_is_not_there(tmp_path, data_dir, args, named):
    import torch

    if args == ["trainer=gpu"] and torch.cuda.is_available():
        pytest.skip("a GPU is visible here: trainer=gpu is valid")
    res = run_inproc("-m", "experiments.train", *args, f"paths.data_dir={data_dir}", cwd=tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and lines[-1].startswith("error: "), res.stderr[-2000:]
    assert named in lines[-1] and "Traceback" not in res.stderr


@pytest.mark.parametrize("command", ["eval", "predict", "calibrate", "export", "verify", "compare"])
def test_every_command_takes_its_folder_positionally_or_as_run_dir(tmp_path, command):
    """One grammar (cli.parse): the folder as the first word or as run_dir=, the same error
    either way; an option of another command is refused by name."""
    missing = tmp_path / "no-such-run"
    extra = ["input=x"] if command == "predict" else []
    errors = []
    for given in (str(missing), f"run_dir={missing}"):
        res = run_inproc("-m", f"experiments.{command}", given, *extra, cwd=tmp_path)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        errors.append(res.stderr)
    assert errors[0] == errors[1] and str(missing) in errors[0]
    res = run_inproc("-m", f"experiments.{command}", "--help", cwd=tmp_path)
    assert res.returncode == 0 and f"python -m experiments.{command} [run_dir=]<" in res.stdout


def test_cfg_job_prints_the_config_without_importing_torch(tmp_path):
    """--cfg job (and Hydra's other own flags) print and exit: the worker, and with it torch
    and Lightning, is never imported (a fresh process: the test's own has torch loaded)."""
    code = (
        "import sys\nfrom experiments.cli.commands import train\n"
        "sys.argv = ['train', '--cfg', 'job', 'model=cnn']\n"
        "train()\n"
        "print('loaded', sorted(m for m in ('torch', 'lightning') if m in sys.modules))\n"
    )
    out = run_process([sys.executable, "-c", code], cwd=tmp_path, check=True).stdout
    assert "_target_: experiments.models.ClassificationModule" in out
    assert "loaded []" in out


class GcProbe(Callback):
    """Appends ``<collector enabled> <objects frozen>`` to ``path`` at each fit's first step."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_start(self, trainer, pl_module) -> None:
        with open(self.path, "a") as f:
            f.write(f"{gc.isenabled()} {gc.get_freeze_count()}\n")
