"""Metrics and losses for imbalanced data: the confusion-matrix metrics against
scikit-learn, focal loss, class_weights=auto, the class-balanced sampler, bad input."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from sklearn.metrics import (
    balanced_accuracy_score,
    f1_score,
    precision_score,
    recall_score,
    top_k_accuracy_score,
)

from experiments.data.samplers import ClassBalancedSampler
from experiments.errors import UserError, find_user_error
from experiments.models.losses import FocalLoss, inverse_frequency
from experiments.models.metrics import ConfusionStats, summarize
from experiments.training.build import datamodule_and_model
from experiments.training.pipeline import train
from tests.helpers import REPO, RandomImages, run_inproc, train_cli

QUICK = ["logger=none", "data.num_workers=0", "seed=0"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_equal_scikit_learn_on_the_same_predictions(seed):
    gen = torch.Generator().manual_seed(seed)
    k = 12
    # skewed labels, and predictions that never say class 11 and say class 10 wrongly
    labels = torch.multinomial(torch.linspace(1, 0.05, k), 700, True, generator=gen)
    logits = torch.randn(700, k, generator=gen) + 3 * torch.nn.functional.one_hot(labels, k)
    logits[:, 11] -= 100
    labels[labels == 10] = 9  # class 10 occurs only among the predictions
    stats = ConfusionStats(k, top_k=5)
    for chunk in range(0, 700, 64):  # batches, as the module updates it
        stats.update(logits[chunk : chunk + 64], labels[chunk : chunk + 64])
    got = summarize(*stats.compute(), top_k=5)
    y, p = labels.numpy(), logits.argmax(1).numpy()
    assert got["macro_f1"].item() == pytest.approx(f1_score(y, p, average="macro"), abs=1e-6)
    assert got["balanced_acc"].item() == pytest.approx(balanced_accuracy_score(y, p), abs=1e-6)
    assert got["acc"].item() == pytest.approx(float((y == p).mean()), abs=1e-6)
    present = sorted(set(y) | set(p))
    precision = precision_score(y, p, labels=present, average=None, zero_division=0)
    recall = recall_score(y, p, labels=present, average=None, zero_division=0)
    for i, c in enumerate(present):
        assert got[f"precision/{c}"].item() == pytest.approx(precision[i], abs=1e-6)
        assert got[f"recall/{c}"].item() == pytest.approx(recall[i], abs=1e-6)
    top5 = top_k_accuracy_score(y, logits.numpy(), k=5, labels=list(range(k)))
    assert got["top5_acc"].item() == pytest.approx(top5, abs=1e-6)


def test_focal_loss_is_cross_entropy_at_gamma_0_and_discounts_easy_samples():
    gen = torch.Generator().manual_seed(0)
    logits, y = torch.randn(32, 5, generator=gen), torch.randint(0, 5, (32,), generator=gen)
    w = torch.tensor([1.0, 2.0, 0.5, 3.0, 1.0])
    ce = torch.nn.functional.cross_entropy
    assert torch.allclose(FocalLoss(0.0)(logits, y), ce(logits, y))
    assert torch.allclose(FocalLoss(0.0, w)(logits, y), ce(logits, y, weight=w))
    smoothed = ce(logits, y, label_smoothing=0.1)
    assert torch.allclose(FocalLoss(0.0, label_smoothing=0.1)(logits, y), smoothed)
    assert FocalLoss(2.0)(logits, y) < ce(logits, y)
    easy = torch.nn.functional.one_hot(y, 5).float() * 8  # confidently right
    assert FocalLoss(2.0)(easy, y) < 1e-3 * ce(easy, y)


def test_class_weights_auto_is_the_inverse_frequency_of_the_train_split(make_cfg, data_dir):
    cfg = make_cfg("model.class_weights=auto", *QUICK)
    datamodule, model = datamodule_and_model(cfg)
    counts = Counter(datamodule.train_targets())
    n, k = sum(counts.values()), datamodule.num_classes
    expected = [n / (k * counts[c]) for c in range(k)]
    assert model.hparams.class_weights == pytest.approx(expected, rel=1e-5)
    assert torch.allclose(model.loss_fn.weight, torch.tensor(expected), rtol=1e-5)
    assert inverse_frequency([0, 0, 0, 1], 3) == [pytest.approx(4 / 9), pytest.approx(4 / 3), 0.0]


def test_balanced_sampler_draws_every_class_equally_often_and_is_a_function_of_seed_epoch():
    targets = [0] * 900 + [1] * 90 + [2] * 10
    sampler = ClassBalancedSampler(targets, seed=3)
    sampler.set_epoch(1)
    first = list(sampler)
    counts = Counter(targets[i] for i in first)
    assert len(first) == 1000 and all(abs(counts[c] - 333) < 60 for c in range(3)), counts
    again = ClassBalancedSampler(targets, seed=3)
    again.set_epoch(1)
    assert list(again) == first
    again.set_epoch(1)
    again.skip(100)
    assert list(again) == first[100:]  # a mid-epoch resume skips exactly what was trained
    again.set_epoch(2)
    assert list(again) != first


def test_imbalanced_run_logs_the_metrics_and_optimizes_macro_f1(make_cfg, tmp_path):
    cfg = make_cfg(
        "trainer.max_epochs=2",
        "optimized_metric=val/macro_f1",
        "model.loss=focal",
        "model.class_weights=auto",
        "data.sampler=balanced",
        *QUICK,
    )
    metrics = train(cfg)
    for key in ("val/macro_f1", "val/balanced_acc", "val/top5_acc", "test/macro_f1"):
        assert 0.0 < metrics[key] <= 1.0, key
    assert "test/precision/3" in metrics and "val/recall/9" in metrics
    best = json.loads((tmp_path / "run/checkpoints/best.json").read_text())
    assert best["monitor"] == "val/macro_f1"


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("model.top_k=11", "model.top_k=11"),
        ("model.loss=dice", "model.loss='dice'"),
        ("data.sampler=oversample", "data.sampler='oversample'"),
    ],
)
def test_bad_metric_loss_or_sampler_is_one_line(make_cfg, override, named):
    from experiments.config import schema

    cfg = make_cfg(override, *QUICK)
    with pytest.raises(Exception) as err:  # Hydra's instantiate wraps what __init__ raises
        schema.check(cfg)  # the signatures' choices, as train() checks before building
        datamodule_and_model(cfg)
    user_error = find_user_error(err.value)
    assert isinstance(user_error, UserError) and named in str(user_error), err.value


def test_class_weights_on_a_dataset_without_targets_is_one_line_exit_2(tmp_path, data_dir):
    res = run_inproc(
        "-m",
        "experiments.train",
        "model.class_weights=auto",
        "data.dataset={_target_:tests.test_imbalanced.untargeted_sets,_partial_:true}",
        f"paths.data_dir={data_dir}",
        "logger=none",
        cwd=tmp_path,
        env_extra={"PYTHONPATH": str(REPO)},
    )
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
    assert "model.class_weights=auto" in lines[0] and ".targets" in lines[0]


def test_the_logit_adjusted_loss_is_cross_entropy_of_logits_plus_tau_log_prior(make_cfg):
    from experiments.models.losses import LogitAdjustedLoss, class_prior

    prior = class_prior([0, 0, 0, 1, 2, 2], 3)
    assert prior == pytest.approx([0.5, 1 / 6, 1 / 3])
    logits, labels = torch.randn(5, 3), torch.tensor([0, 1, 2, 1, 0])
    expected = torch.nn.functional.cross_entropy(logits + 2.0 * torch.tensor(prior).log(), labels)
    assert torch.allclose(LogitAdjustedLoss(prior, 2.0)(logits, labels), expected)
    # the builder gives the model the train split's prior
    datamodule, model = datamodule_and_model(make_cfg("model.loss=logit_adjusted", *QUICK))
    counts = Counter(datamodule.train_targets())
    k = datamodule.num_classes
    want = torch.tensor([counts[c] / sum(counts.values()) for c in range(k)]).log()
    assert torch.allclose(model.loss_fn.offsets, want.float(), atol=1e-6)


def test_posthoc_logit_adjustment_is_reported_by_eval(tmp_path, data_dir):
    run = train_cli(tmp_path / "run", data_dir, "trainer.max_epochs=1")
    res = run_inproc("-m", "experiments.eval", f"run_dir={run}", "posthoc_tau=1.0", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    metrics = json.loads((run / "eval_metrics.json").read_text())
    # digits are balanced: subtracting a near-uniform prior barely moves a prediction
    assert abs(metrics["test/posthoc/acc"] - metrics["test/acc"]) < 0.02
    res = run_inproc("-m", "experiments.eval", f"run_dir={run}", "posthoc_tau=x", cwd=tmp_path)
    assert res.returncode == 2 and "posthoc_tau='x' is not a number" in res.stderr


def test_loss_auto_adjusts_logits_on_a_long_tailed_split_only(make_cfg, data_dir, tmp_path):
    from experiments.models.losses import LogitAdjustedLoss

    _, model = datamodule_and_model(make_cfg(*QUICK))  # the digits: balanced
    assert type(model.loss_fn) is torch.nn.CrossEntropyLoss
    rows = (data_dir / "digits" / "labels.csv").read_text().splitlines()
    kept = [r for i, r in enumerate(rows[1:]) if int(r.split(",")[1]) < 5 or i % 5 == 0]
    (tmp_path / "lt.csv").write_text("\n".join([rows[0], *kept]) + "\n")
    image_csv = ["data=image_csv", f"data.csv_file={tmp_path / 'lt.csv'}",
                 f"data.image_dir={data_dir / 'digits' / 'images'}"]  # fmt: skip
    _, model = datamodule_and_model(make_cfg(*image_csv, *QUICK))
    assert isinstance(model.loss_fn, LogitAdjustedLoss)
    assert model.hparams["loss"] == "logit_adjusted"  # what ran, not "auto"
    _, model = datamodule_and_model(make_cfg(*image_csv, "model.class_weights=auto", *QUICK))
    assert type(model.loss_fn) is torch.nn.CrossEntropyLoss  # weights given: no adjustment too


class Untargeted(RandomImages):
    """Samples and ``.classes`` but no ``.targets``: labels known only by reading samples."""

    classes = ["a", "b", "c", "d"]

    def __init__(self, n: int, seed: int) -> None:
        super().__init__(n, (1, 8, 8), 4, 0.0, seed)
        del self.targets  # its samples still carry their labels


def untargeted_sets(transform=None, target_transform=None, n: int = 200):
    return Untargeted(n, 0), Untargeted(n // 4, 1)
