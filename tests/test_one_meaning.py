"""One meaning per number (issue #33): every validation number a run or a sweep reports is
the one of the epoch ``best.pt`` keeps, with that epoch; a last-epoch value says so. Sweep
plots come from every finished job; a key the chosen config option ignores is refused."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch import Callback

from tests.helpers import (
    assert_one_line_error,
    no_account_env,
    run_inproc,
    wandb_records,
    write_image_folder,
)


class CollapseAtEpoch(Callback):
    """Zeroes the net's weights before epoch ``epoch``'s validation (1-based): a run that
    collapses late, so its last epoch scores chance while ``best.pt`` keeps a good epoch
    (every logit equal: each sample is predicted as the first class)."""

    def __init__(self, epoch: int = 1) -> None:
        self.epoch = epoch

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.current_epoch + 1 != self.epoch:
            return
        with torch.no_grad():
            for param in pl_module.parameters():
                param.zero_()


# a run that collapses in its last epoch (CollapseAtEpoch): epoch 3 scores chance
COLLAPSE = [
    "+callbacks.collapse._target_=tests.test_one_meaning.CollapseAtEpoch",
    "+callbacks.collapse.epoch=3",
    "trainer.max_epochs=3",
]


def _image_run(tmp_path) -> list[str]:
    csv_file, image_dir = write_image_folder(tmp_path / "own", n=60, classes=("a", "b", "c"))
    return ["data=image_csv", f"data.csv_file={csv_file}", f"data.image_dir={image_dir}"]


def _wandb_summary(run_dir) -> dict:
    """The final W&B run summary of an offline run, from its record log."""
    (path,) = run_dir.rglob("run-*.wandb")
    summary: dict = {}
    for rec in wandb_records(path):
        if rec.WhichOneof("record_type") != "summary":
            continue
        for item in rec.summary.update:
            summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        for item in rec.summary.remove:
            summary.pop(item.key or "/".join(item.nested_key), None)
    return summary


def _no_wandb_account(tmp_path) -> dict:
    """No W&B key or netrc; PYTHONPATH left to run_cli (which puts the repo on it)."""
    return {k: v for k, v in no_account_env(tmp_path).items() if k != "PYTHONPATH"}


def test_a_run_reports_validation_at_the_epoch_best_pt_keeps(tmp_path, data_dir):
    run = tmp_path / "run"
    res = run_inproc(
        "-m", "experiments.train", *_image_run(tmp_path), *COLLAPSE, "logger=wandb",
        f"paths.data_dir={data_dir}", f"hydra.run.dir={run}",
        cwd=tmp_path, env_extra=_no_wandb_account(tmp_path),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    best = json.loads((run / "checkpoints" / "best.json").read_text())
    metrics = json.loads((run / "metrics.json").read_text())
    value, epoch = best["value"], best["epoch"]
    last = metrics["val/acc"]  # metrics.json keeps its keys: val/* are the last epoch's
    assert epoch < 3 and last < value  # the collapse: best.pt is an earlier, better epoch

    out = res.stdout + res.stderr
    (done,) = [line for line in out.splitlines() if "done in" in line]
    assert f"val/acc={value:.4f} (epoch {epoch} of 3, best)" in done
    assert f"test/acc={metrics['test/acc']:.4f}" in done
    assert f"{last:.4f}" not in done  # the last epoch's 0.3333 is not shown as val/acc
    table_acc = re.search(r"^acc\s+([\d.]+)\s+([\d.]+)$", out, flags=re.M)
    assert table_acc and float(table_acc.group(1)) == pytest.approx(value, abs=5e-5)

    assert metrics["best_epoch"] == epoch and metrics["val/acc_best"] == value
    assert metrics["best_reason"] == best["reason"]
    assert metrics["warnings"] == best["warnings"] and "too few" in metrics["warnings"][0]

    summary = _wandb_summary(run / "wandb")
    assert summary["val/acc"] == pytest.approx(value) and summary["best_epoch"] == epoch
    assert summary["val/acc_last"] == pytest.approx(last)
    # every val/* scalar of the chosen epoch is in best.json: unlabelled names mean that epoch
    assert summary["val/macro_f1"] == pytest.approx(best["metrics"]["val/macro_f1"])
    assert "val/macro_f1_last" in summary


@pytest.fixture
def local_mlflow(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # never a real server


def test_mlflow_records_the_chosen_epoch(make_cfg, tmp_path, local_mlflow):
    from mlflow.tracking import MlflowClient

    from experiments.training.pipeline import train

    train(make_cfg(*_image_run(tmp_path), *COLLAPSE, "logger=mlflow"))
    best = json.loads((tmp_path / "run" / "checkpoints" / "best.json").read_text())
    client = MlflowClient(f"sqlite:///{tmp_path / 'outputs'}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("train").experiment_id])
    assert run.data.metrics["best_epoch"] == best["epoch"]
    assert run.data.metrics["val/acc_best"] == pytest.approx(best["value"])
    assert len(client.get_metric_history(run.info.run_id, "val/acc")) == 3  # one per epoch
    assert f"best_epoch={best['epoch']}" in run.data.tags["summary"]
    assert "val/acc_last=0.3333" in run.data.tags["summary"]


def _summary_rows(sweep):
    with open(sweep / "summary.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_sweep_summary_and_plots_come_from_every_finished_job(tmp_path, data_dir):
    # lr x seed: after two jobs only the seed varied, and summary.png was drawn "by seed",
    # then never replaced once lr varied too
    res = run_inproc(
        "-m", "experiments.train", "-m", "optimizer.lr=0.01,0.3", "seed=0,1", "debug=limit",
        "logger=none", f"paths.data_dir={data_dir}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    (sweep,) = (tmp_path / "outputs" / "debug" / "multiruns").iterdir()
    rows = _summary_rows(sweep)
    assert len(rows) == 4
    for row in rows:
        best = json.loads((sweep / row["dir"] / "checkpoints" / "best.json").read_text())
        assert row["epoch"] == f"{best['epoch']} of 2"
        assert float(row["val/acc"]) == pytest.approx(best["value"])
    assert "column epoch" in (sweep / "summary.md").read_text()
    # the plots are those of the final state: the same files drawn again from the jobs alone
    again = tmp_path / "again"
    for row in rows:
        shutil.copytree(sweep / row["dir"], again / row["dir"])
    from experiments.tracking.sweep_summary import write_summary

    write_summary(again, "val/acc", "max")
    for plot in ("summary.png", "parallel.png"):
        assert (sweep / plot).read_bytes() == (again / plot).read_bytes(), plot
    assert not (sweep / "contour.png").exists()  # one real key: the seed is no axis


@pytest.mark.slow
def test_optuna_importance_names_its_evaluator_and_leaves_seeds_out(tmp_path, data_dir):
    trials = [f"{{optimizer.lr:{lr},seed:{seed}}}" for lr in (0.001, 0.5) for seed in (0, 1)]
    enqueue = ",".join(trials)
    res = run_inproc(
        "-m", "experiments.train", "-m", "hparams_search=optuna", "hydra.sweeper.params={}",
        "logger=none", "task_name=debug", "debug=limit", "hydra.sweeper.n_trials=4",
        "optimizer.lr=choice(0.001,0.5)", "seed=choice(0,1)", f"hydra.sweeper.enqueue=[{enqueue}]",
        f"paths.data_dir={data_dir}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    (sweep,) = (tmp_path / "outputs" / "debug" / "multiruns").iterdir()
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert result["importance_evaluator"] == "FanovaImportanceEvaluator"
    assert "optimizer.lr" in result["importance"]
    assert "seed" not in result["importance"]  # the seed replicates: no importance
    summary = (sweep / "summary.md").read_text()
    assert "importance by fANOVA (optuna.importance.FanovaImportanceEvaluator)" in summary
    assert "| optimizer.lr |" in summary and "| seed |" not in summary


@pytest.mark.parametrize("plus", ["+", ""])
def test_a_key_of_another_data_option_is_refused_not_ignored(tmp_path, data_dir, plus):
    # data=digits (the default) would train on the bundled digits and ignore the CSV
    csv_file, _ = write_image_folder(tmp_path / "own")
    res = run_inproc(
        "-m", "experiments.train", f"{plus}data.csv_file={csv_file}", "debug=fast",
        f"paths.data_dir={data_dir}", cwd=tmp_path,
    )  # fmt: skip
    line = assert_one_line_error(res)
    # a CSV of images or a table (data=diabetes takes a CSV too): either way not the digits
    assert "data.csv_file belongs to data=diabetes, data=image_csv, not data=digits" in line
    assert "choose one of data=diabetes, data=image_csv" in line and "+data.csv_file" not in line
    assert not (tmp_path / "outputs").exists()  # refused before any run started


@pytest.mark.parametrize(
    "override, owner",
    [
        ("+data.image_size=[8,8]", "data=image_csv, data=shapes"),
        ("+data.download=true", "data=cifar10, data=fashion_mnist, data=mnist"),
        ("+logger.wandb.project=p", "logger=wandb"),  # logger=csv never builds a W&B logger
    ],
)
def test_keys_the_chosen_option_ignores_name_their_option(tmp_path, override, owner):
    res = run_inproc("-m", "experiments.train", override, "--cfg", "job", cwd=tmp_path)
    key = override.lstrip("+").split("=")[0]
    assert f"{key} belongs to {owner}, not " in assert_one_line_error(res)


def test_a_key_the_chosen_option_uses_is_still_added(tmp_path):
    # Lightning's Trainer reads sync_batchnorm whatever trainer= option set the others
    res = run_inproc("-m", "experiments.train", "+trainer.sync_batchnorm=true", "--cfg", "job",
                  cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert "sync_batchnorm: true" in res.stdout
    res = run_inproc("-m", "experiments.train", "trainer.sync_batchnorm=true", cwd=tmp_path)
    line = assert_one_line_error(res)
    assert "trainer=ddp sets it" in line and "+trainer.sync_batchnorm=" in line


def test_loss_auto_says_what_the_logit_adjusted_loss_trades(make_cfg, tmp_path):
    from experiments.training.pipeline import train

    csv_file, image_dir = write_image_folder(tmp_path / "lt", n=60, classes=("a", "b", "c"))
    rows = csv_file.read_text().splitlines()
    seen: dict[str, int] = {}
    keep = [rows[0]]
    for row in rows[1:]:  # a: 20, b: 10, c: 5 -- a 4:1 long tail
        label = row.split(",")[1]
        seen[label] = seen.get(label, 0) + 1
        if seen[label] <= {"a": 20, "b": 10, "c": 5}[label]:
            keep.append(row)
    csv_file.write_text("\n".join(keep) + "\n")
    quick = ["logger=none", "seed=0", "trainer.max_epochs=1", "data.val_fraction=0.2",
             "data.test_fraction=0.2", "model=cnn"]  # fmt: skip
    cfg = make_cfg("data=image_csv", f"data.csv_file={csv_file}", f"data.image_dir={image_dir}",
                   *quick)  # fmt: skip
    train(cfg)
    run = Path(cfg.paths.output_dir)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["loss"] == "logit_adjusted"
    assert "aims at balanced accuracy" in metrics["loss_note"]
    assert "model.loss=cross_entropy" in metrics["loss_note"]
    assert f"test/balanced_acc={metrics['test/balanced_acc']:.4f}" in metrics["loss_note"]
    card = (run / "model_card.md").read_text()
    assert "- loss: `logit_adjusted`" in card and "- note on the loss: model.loss=auto" in card
    balanced = make_cfg(*_image_run(tmp_path), *quick, "paths.output_dir=" + str(tmp_path / "b"))
    train(balanced)
    metrics = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert metrics["loss"] == "cross_entropy" and "loss_note" not in metrics


def test_your_own_images_start_with_settings_that_train_stably(make_cfg):
    # SGD at lr 0.1 (the digits' default) gave val/loss 911 after epoch 1 on 180 images of
    # three Fashion-MNIST classes at 96 px; AdamW at 1e-3 gave 0.81 (benchmarks/finetune.md)
    own = ["data=image_csv", "data.csv_file=a.csv", "data.image_dir=images"]
    cfg = make_cfg(*own)
    assert cfg.model.net._target_ == "experiments.models.CNN"
    assert cfg.optimizer._target_ == "torch.optim.AdamW" and cfg.optimizer.lr == 0.001
    cfg = make_cfg(*own, "model=mlp", "optimizer=sgd")  # the command line still decides
    assert cfg.model.net._target_ == "experiments.models.MLP" and cfg.optimizer.lr == 0.1
    assert make_cfg(*own, "experiment=finetune").model.net.pretrained is True
    assert make_cfg().optimizer._target_ == "torch.optim.SGD"  # the digits keep theirs
