"""Your own task (docs/own_task.md): a LightningModule, a LightningDataModule and a config
folder of a package outside the repo, through the real command line: it trains, sweeps with
Optuna minimizing, resumes bit for bit after SIGTERM, evals from its run folder, and compare
gives its verdict with lower better. The package and the commands are the guide's own: read
from its code blocks, so the guide cannot drift from what runs."""

from __future__ import annotations

import csv
import os
import re
import shlex

import pytest
import torch
import yaml

from experiments.runs.files import read_json
from tests.helpers import REPO, guide_project, run_cli, run_inproc

GUIDE = REPO / "docs" / "own_task.md"
SHELL_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
TRUST = "EXPERIMENTS_TRUSTED_MODULES"
CONFIG_PATH = "EXPERIMENTS_CONFIG_PATH"


def guide_commands() -> list[list[str]]:
    """The guide's ``python -m`` commands, in order, as argument lists."""
    body = SHELL_BLOCK.findall(GUIDE.read_text())[-1]
    return [shlex.split(line)[2:] for line in body.splitlines() if line.startswith("python -m")]


def one_line_error(res) -> str:
    """The ``error:`` line of a refused command (exit 2, no traceback)."""
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, res.stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The guide's package and config folder in a folder of their own; the variables."""
    root = tmp_path_factory.mktemp("own")
    files, env = guide_project(root)
    assert {"mypkg/task.py", "conf/model/mine.yaml", "conf/hparams_search/mine.yaml"} <= set(files)
    # the module is about 40 lines, as the guide says
    module = files["mypkg/task.py"].split("class Data")[0].split("class Regressor")[1]
    assert len(module.strip().splitlines()) <= 40
    return root, {CONFIG_PATH: env[CONFIG_PATH], TRUST: env[TRUST]}


@pytest.fixture(scope="module")
def project(folder):
    """The guide's folder and its first run (``A``), with the guide's commands."""
    root, env = folder
    commands = guide_commands()
    res = run_inproc("-m", *commands[0], f"hydra.run.dir={root / 'A'}", cwd=root, env_extra=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return root, env, commands


def test_the_guide_sets_the_variables_the_commands_need():
    shell = SHELL_BLOCK.findall(GUIDE.read_text())[-1]
    assert all(f"{v}=" in shell for v in ("PYTHONPATH", CONFIG_PATH, TRUST))
    assert [c[:1] for c in guide_commands()] == [["experiments.train"]] * 3 + [
        ["experiments.eval"], ["experiments.train"], ["experiments.compare"]]  # fmt: skip


@pytest.mark.slow
def test_it_trains_on_its_own_metric_and_direction(project):
    root, _, _ = project
    run = root / "A"
    metrics = read_json(run / "metrics.json")
    best = read_json(run / "checkpoints" / "best.json")
    assert best["monitor"] == "val/mae" and metrics["val/mae_best"] == best["value"]
    assert "test/mae" in metrics and metrics["epochs"] == 3
    assert "in_shape" not in best and "class_names" not in best  # no image classifier
    card = (run / "model_card.md").read_text()
    assert "mypkg.task.Regressor" in card and "| test/mae |" in card
    log = (run / "train.log").read_text()
    assert re.search(r"val/mae=\S+ \(epoch \d of 3, best\)  test/mae=", log), log[-2000:]


@pytest.mark.slow
def test_it_evals_from_the_run_folder_and_only_when_trusted(project):
    root, env, commands = project
    run = str(root / "A")
    res = run_inproc("-m", *[run if a == "<run>" else a for a in commands[3]], cwd=root,
                     env_extra=env)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    evaluated = read_json(root / "A" / "eval_metrics.json")
    trained = read_json(root / "A" / "metrics.json")
    assert evaluated["test/mae"] == trained["test/mae"]  # the same weights, the same split
    untrusted = {CONFIG_PATH: env[CONFIG_PATH], TRUST: ""}
    line = one_line_error(run_inproc("-m", "experiments.eval", run, cwd=root,
                                     env_extra=untrusted))  # fmt: skip
    assert "mypkg.task" in line and f"{TRUST}=" in line
    line = one_line_error(run_inproc("-m", "experiments.predict", run, f"input={root}", cwd=root,
                                     env_extra=env))  # fmt: skip
    assert "mypkg.task.Regressor" in line and "experiments.eval" in line


@pytest.mark.slow
def test_it_sweeps_with_optuna_minimizing(project):
    root, env, commands = project
    sweep = root / "S"
    res = run_inproc("-m", *commands[1], f"hydra.sweep.dir={sweep}", cwd=root, env_extra=env)
    assert res.returncode == 0, res.stderr[-3000:]
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert "minimize" in str(results), results
    summary = (sweep / "summary.csv").read_text().splitlines()
    assert summary[0].split(",")[2] == "val/mae" and len(summary) == 4
    header = summary[0].split(",")  # the task's own test metric, no empty classifier column
    assert "test/mae" in header and "test/acc" not in header
    values = [float(r.split(",")[2]) for r in summary[1:]]
    assert values == sorted(values)  # lowest first


@pytest.mark.slow
def test_compare_gives_its_verdict_with_lower_better(project):
    root, env, commands = project
    grid = root / "G"
    res = run_inproc("-m", *commands[4], f"hydra.sweep.dir={grid}", cwd=root, env_extra=env)
    assert res.returncode == 0, res.stderr[-3000:]
    args = [str(grid) if a == "<grid>" else a for a in commands[5]]
    res = run_inproc("-m", *args, cwd=root, env_extra=env)
    assert res.returncode == 0, res.stderr[-3000:]
    report = (grid / "compare.md").read_text()
    assert "val/mae" in report and "lower is better" in res.stdout + report
    assert "model.hidden" in report


@pytest.mark.slow
def test_it_resumes_bit_for_bit_after_sigterm(project):
    root, env, commands = project
    run = root / "B"
    env = {**env, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    stop = ["+callbacks.signal_at._target_=tests.helpers.SignalAt", "+callbacks.signal_at.step=10"]
    res = run_cli("-m", *commands[0], *stop, f"hydra.run.dir={run}", cwd=root, env_extra=env)
    assert res.returncode == 143, res.stderr[-3000:]
    assert not (run / "metrics.json").exists()
    resume = [f"resume={run}" if a == "resume=<run>" else a for a in commands[2]]
    res = run_inproc("-m", *resume, cwd=root, env_extra=env)
    assert res.returncode == 0, res.stderr[-3000:]
    a, b = (torch.load(r / "checkpoints" / "last.ckpt", weights_only=True)
            for r in (root / "A", run))  # fmt: skip
    assert (a["epoch"], a["global_step"]) == (b["epoch"], b["global_step"])
    assert a["state_dict"].keys() == b["state_dict"].keys()
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    assert (
        read_json(root / "A" / "metrics.json")["test/mae"]
        == read_json(run / "metrics.json")["test/mae"]
    )
    # without the config folder named again, the saved model=mine is one line saying how
    res = run_inproc("-m", "experiments.train", f"resume={run}", cwd=root,
                     env_extra={TRUST: env[TRUST]})  # fmt: skip
    assert CONFIG_PATH in one_line_error(res)


@pytest.mark.slow
def test_a_metric_the_module_does_not_log_is_one_line_at_the_first_validation(folder):
    root, env = folder
    # the config folder given with -cd this time (no EXPERIMENTS_CONFIG_PATH)
    args = ["-cd", str(root / "conf"), "experiment=mine", "optimized_metric=val/rmse"]
    res = run_inproc("-m", "experiments.train", *args, f"hydra.run.dir={root / 'R'}", cwd=root,
                     env_extra={TRUST: env[TRUST]})  # fmt: skip
    line = one_line_error(res)
    assert "optimized_metric=val/rmse" in line and "val/loss, val/mae" in line
    assert not (root / "R" / "checkpoints" / "best.safetensors").exists()


def test_a_direction_other_than_min_or_max_is_refused(folder):
    root, env = folder
    res = run_inproc("-m", "experiments.train", "experiment=mine", "optimized_mode=lowest",
                     cwd=root, env_extra=env)  # fmt: skip
    line = one_line_error(res)
    assert "optimized_mode" in line and "min" in line and "max" in line


def test_a_config_dir_that_does_not_exist_is_one_line(tmp_path):
    res = run_inproc("-m", "experiments.train", "-cd", str(tmp_path / "nope"), "experiment=mine",
                     cwd=tmp_path)  # fmt: skip
    assert "no such folder" in one_line_error(res)
    res = run_inproc("-m", "experiments.train", "experiment=mine", cwd=tmp_path,
                     env_extra={CONFIG_PATH: str(tmp_path / "nope")})  # fmt: skip
    assert CONFIG_PATH in one_line_error(res)


@pytest.mark.slow
def test_reproduce_sh_names_the_config_folder_the_run_used(project):
    root, _, _ = project
    script = (root / "A" / "reproduce.sh").read_text()
    line = next(ln for ln in script.splitlines() if "EXPERIMENTS_CONFIG_PATH=" in ln)
    assert str(root / "conf") in line and line.startswith('if [ -z "${EXPERIMENTS_CONFIG_PATH')


@pytest.mark.slow
def test_verify_trains_it_again_and_matches(project):
    root, env, _ = project
    res = run_inproc("-m", "experiments.verify", str(root / "A"), cwd=root, env_extra=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "best.safetensors" in res.stdout


def test_a_stop_rule_and_the_divergence_remedy_serve_it(folder):
    # job 0 diverges (lr 1e30: inf weights, a nan loss) and runs again at lr_scale x its lr,
    # past its one retry it is `diverged`; job 1 reaches the target (lower is better) and
    # the rule stops job 2 from starting
    root, env = folder
    sweep = root / "rules"
    res = run_inproc(
        "-m", "experiments.train", "-m", "experiment=mine", "optimizer.lr=1e30,0.05,0.05",
        "remedies.diverged_retries=1", "sweep.target='val/mae<=5'", "trainer.max_epochs=1",
        f"hydra.sweep.dir={sweep}", cwd=root, env_extra=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    with open(sweep / "summary.csv", newline="") as f:
        rows = {r["job"]: r for r in csv.DictReader(f)}
    assert rows["0"]["status"] == "diverged" and "training loss is" in rows["0"]["error"]
    assert rows["0"]["remedies"].startswith("optimizer.lr=1e+29 (diverged at lr 1e+30)")
    assert rows["1"]["status"] == "ok" and float(rows["1"]["val/mae"]) <= 5
    assert rows["2"]["status"] == "stopped" and "reached by job 1" in rows["2"]["error"]
