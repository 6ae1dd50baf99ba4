"""``experiments.eval`` on a real run folder made by the train CLI: exact reproduction of
test/acc, checkpoint choice, overrides, refusal of foreign ``_target_``s, one-line errors."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from experiments.errors import UserError
from experiments.eval import main
from experiments.evaluation.evaluate import evaluate
from experiments.runs.layout import RunDir
from tests.helpers import assert_one_line_error, edit_config, run_inproc


@pytest.fixture
def run_copy(trained_run, tmp_path) -> Path:
    """A private copy of the run, free to tamper with: without its manifest.json, as an
    older run has none, so eval's own checks answer (the manifest's are test_manifest's)."""
    copy = Path(shutil.copytree(trained_run, tmp_path / "run_copy"))
    (copy / "manifest.json").unlink(missing_ok=True)
    return copy


def test_reproduces_the_runs_test_acc_exactly(trained_run):
    trained = json.loads((trained_run / "metrics.json").read_text())
    metrics = evaluate(trained_run)
    assert metrics["test/acc"] == trained["test/acc"]
    saved = json.loads((trained_run / "eval_metrics.json").read_text())
    assert saved["test/acc"] == trained["test/acc"]
    assert saved["ckpt"] == str(RunDir(trained_run).best_weights.resolve())
    assert (
        saved["ckpt_epoch"]
        == json.loads((trained_run / "checkpoints" / "best.json").read_text())["epoch"]
    )
    # the accuracy is a count of correct test images: the batch size cannot change it
    again = evaluate(trained_run, overrides=["data.batch_size=7", "trainer.accelerator=cpu"])
    assert again["test/acc"] == trained["test/acc"]
    assert json.loads((trained_run / "eval_metrics.json").read_text())["overrides"] == [
        "data.batch_size=7",
        "trainer.accelerator=cpu",
    ]


def test_ckpt_last_and_a_file_path(run_copy):
    last = evaluate(run_copy, ckpt="last")
    saved = json.loads((run_copy / "eval_metrics.json").read_text())
    last_weights = RunDir(run_copy).last_weights
    assert saved["ckpt"] == str(last_weights.resolve()) and 0.0 <= last["test/acc"] <= 1.0
    sidecar = json.loads((run_copy / "checkpoints" / "last.json").read_text())
    assert saved["ckpt_epoch"] == sidecar["epoch"]
    moved = shutil.copy(last_weights, run_copy / f"elsewhere{last_weights.suffix}")
    assert evaluate(run_copy, ckpt=str(moved)) == last


def test_corrupt_or_missing_checkpoint_names_the_file(run_copy):
    best = RunDir(run_copy).best_weights
    best.write_bytes(best.read_bytes()[:100])  # truncated, as by a kill mid-copy
    with pytest.raises(UserError, match=re.escape(best.name)):
        evaluate(run_copy)
    with pytest.raises(UserError, match="checkpoint not found: .*nope.pt"):
        evaluate(run_copy, ckpt="nope.pt")
    with pytest.raises(UserError, match="full Lightning checkpoint"):
        evaluate(run_copy, ckpt="last.ckpt")


def canary_cmd(tmp_path: Path) -> tuple[Path, str]:
    canary = tmp_path / "canary"
    return canary, f"touch {canary}"


FOREIGN = {
    "os.system": lambda cmd: {"_target_": "os.system", "_args_": [cmd]},
    "torch.os.system": lambda cmd: {"_target_": "torch.os.system", "_args_": [cmd]},
    "builtins.exec": lambda cmd: {
        "_target_": "builtins.exec",
        "_args_": [f"import os; os.system({cmd!r})"],
    },
    "get_object(os.system)": lambda cmd: {
        "_target_": "hydra.utils.get_object",
        "path": "os.system",
    },
    "torch.hub.load": lambda cmd: {
        "_target_": "torch.hub.load",
        "repo_or_dir": ".",
        "model": "x",
        "source": "local",
    },
}


@pytest.mark.parametrize("name", list(FOREIGN))
def test_foreign_target_is_refused_and_never_run(run_copy, tmp_path, name):
    canary, cmd = canary_cmd(tmp_path)

    def tamper(cfg):
        cfg["data"]["target_transform"] = FOREIGN[name](cmd)

    edit_config(run_copy, tamper)
    with pytest.raises(UserError, match=r"data\.target_transform.*refused") as info:
        evaluate(run_copy)
    assert "\n" not in str(info.value)
    assert not canary.exists()


def test_target_in_an_unused_section_is_never_built_one_behind_an_interpolation_is_refused(
    run_copy, tmp_path
):
    canary, cmd = canary_cmd(tmp_path)

    # a saved run is rebuilt from data, model and a few trainer keys: a logger, a callback or
    # a trainer plugin in its file is never built (so it need not be refused either)
    def unused(cfg):
        cfg["logger"] = {"x": {"_target_": "os.system", "_args_": [cmd]}}
        cfg["trainer"]["plugins"] = [{"_target_": "os.system", "_args_": [cmd]}]

    edit_config(run_copy, unused)
    assert 0.0 <= evaluate(run_copy)["test/acc"] <= 1.0
    assert not canary.exists()

    def hidden(cfg):
        cfg["logger"] = None
        cfg["evil"] = "os.system"
        cfg["data"]["target_transform"] = {"_target_": "${evil}", "_args_": [cmd]}

    edit_config(run_copy, hidden)
    with pytest.raises(UserError, match=r"data\.target_transform\._target_='os\.system'"):
        evaluate(run_copy)
    # and an override cannot smuggle one in either
    edit_config(run_copy, lambda cfg: cfg["data"].update(target_transform=None))
    with pytest.raises(UserError, match="os.system"):
        evaluate(run_copy, overrides=["data.target_transform={_target_: os.system}"])
    assert not canary.exists()


def test_main_prints_metrics_and_writes_eval_metrics(run_copy, monkeypatch, capsys):
    (run_copy / "eval_metrics.json").unlink(missing_ok=True)
    monkeypatch.setattr("sys.argv", ["eval", f"run_dir={run_copy}", "ckpt=best"])
    main()
    trained = json.loads((run_copy / "metrics.json").read_text())
    assert f"test/acc={trained['test/acc']:.4f}" in capsys.readouterr().out
    assert (
        json.loads((run_copy / "eval_metrics.json").read_text())["test/acc"] == trained["test/acc"]
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["run_dir={tmp}/missing"], "run_dir not found"),
        (["run_dir={tmp}"], ".hydra/config.yaml is missing"),
        ([], "missing run_dir"),
        (["-x"], "not key=value"),
        (["{run}", "{run}"], "one run folder is expected"),
        (["run_dir={run}", "data.batch_sise=3"], "data.batch_sise"),
        (["run_dir={run}", "model=cnn"], "model is a whole section"),
        (["run_dir={run}", "ckpt=gone.pt"], "gone.pt"),
    ],
)
def test_cli_mistakes_fail_in_one_line(trained_run, tmp_path, args, named):
    args = [a.format(tmp=tmp_path, run=trained_run) for a in args]
    res = run_inproc("-m", "experiments.eval", *args, cwd=tmp_path)
    assert_one_line_error(res, named)


def test_cli_help(tmp_path):
    res = run_inproc("-m", "experiments.eval", "--help", cwd=tmp_path)
    assert res.returncode == 0 and "run_dir=" in res.stdout and "ckpt=" in res.stdout
    assert "python -m experiments.eval" in res.stdout


def test_each_checkpoints_evaluation_is_kept_and_names_its_epoch_and_count(run_copy):
    """eval ckpt=last no longer replaces what the card knows of the best weights: each checkpoint's
    latest result is kept under "evaluations", with its epoch and test sample count."""
    last = evaluate(run_copy, "last")
    best = evaluate(run_copy, "best")
    best_name, last_name = RunDir(run_copy).best_weights.name, RunDir(run_copy).last_weights.name
    saved = json.loads((run_copy / "eval_metrics.json").read_text())
    assert saved["ckpt_name"] == best_name and saved["test/acc"] == best["test/acc"]
    kept = saved["evaluations"]
    assert sorted(kept) == sorted([best_name, last_name])
    assert kept[last_name]["test/acc"] == last["test/acc"]
    sidecar = json.loads((run_copy / "checkpoints" / "last.json").read_text())
    assert kept[last_name]["ckpt_epoch"] == sidecar["epoch"]
    counts = json.loads((run_copy / "data_counts.json").read_text())
    assert kept[last_name]["samples"] == {"test": sum(counts["test"].values())}
    card = (run_copy / "model_card.md").read_text()
    assert f"## Test results: {last_name} (last epoch {sidecar['epoch']})" in card


def test_flip_tta_averages_an_image_and_its_mirror(run_copy, tmp_path):
    """tta=flip: the mean softmax of each test image and its mirror image, reported beside
    the plain scores; the views are exact (the mirror of the mirror is the image)."""
    import torch

    from experiments.models.tta import tta_views

    x = torch.arange(2 * 1 * 3 * 4, dtype=torch.float32).view(2, 1, 3, 4)
    plain, mirror = tta_views("flip")(x)
    assert torch.equal(plain, x) and torch.equal(mirror.flip(-1), x)
    shifted = tta_views("flip_translate")(x)
    assert len(shifted) == 6 and torch.equal(shifted[2][..., 1:], x[..., :-1])
    assert bool((shifted[2][..., 0] == 0).all())  # zeros shifted in, as the shift augment pads
    res = run_inproc("-m", "experiments.eval", str(run_copy), "tta=flip", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    saved = json.loads((run_copy / "eval_metrics.json").read_text())
    assert {"test/tta/acc", "test/tta/balanced_acc", "test/tta/macro_f1"} <= set(saved)
    res = run_inproc("-m", "experiments.eval", str(run_copy), "tta=rotate", cwd=tmp_path)
    assert res.returncode == 2 and "tta='rotate' is not valid" in res.stderr
