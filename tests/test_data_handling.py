"""Data handling that helps results: stratified splits, training-split statistics computed
once and reused, augmentation on the training split only."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from experiments.data import CsvData
from experiments.data.splits import split_indices
from experiments.data.transforms import RandomShift
from tests.helpers import run_inproc, write_image_folder


def _to_tensor():
    from torchvision.transforms import v2

    return v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])


def test_stratified_split_keeps_every_class_in_every_split_and_is_seeded():
    targets = [0] * 200 + [1] * 12 + [2] * 3  # a 67:4:1 imbalance
    train, val, test = split_indices(len(targets), 0.1, 0.1, seed=7, targets=targets)
    for part in (train, val, test):
        assert {targets[i] for i in part} == {0, 1, 2}
    assert sorted(train + val + test) == list(range(len(targets)))  # disjoint, complete
    assert Counter(targets[i] for i in val)[0] == 20  # proportions kept for big classes
    assert (train, val, test) == split_indices(len(targets), 0.1, 0.1, seed=7, targets=targets)
    assert (train, val, test) != split_indices(len(targets), 0.1, 0.1, seed=8, targets=targets)
    # the random split a run dir made before stratified splits is unchanged
    order = torch.randperm(215, generator=torch.Generator().manual_seed(7)).tolist()
    assert split_indices(215, 0.1, 0.1, seed=7) == (order[44:], order[22:44], order[:22])


def _folder_module(tmp_path, **kwargs) -> CsvData:
    classes = ("common",) * 16 + ("rare",)  # 1 rare image in 17
    csv_file, image_dir = write_image_folder(tmp_path, n=170, classes=classes, size=(12, 10))
    return CsvData(csv_file=str(csv_file), image_dir=str(image_dir),
                   val_fraction=0.1, test_fraction=0.1, train_transform=_to_tensor(),
                   eval_transform=_to_tensor(), **kwargs)  # fmt: skip


def test_a_rare_class_is_in_every_split_of_a_folder(tmp_path):
    dm = _folder_module(tmp_path, split="stratified")
    dm.setup("fit")
    for part in (dm.train_set, dm.val_set, dm.test_set):
        assert {dm.class_names[part[i][1]] for i in range(len(part))} == {"common", "rare"}


def test_augmentation_is_random_in_train_and_absent_in_val_and_test(tmp_path):
    dm = _folder_module(tmp_path, augment=RandomShift(padding=3))
    dm.setup("fit")
    torch.manual_seed(0)
    draws = [dm.train_set[0][0] for _ in range(6)]
    assert any(not torch.equal(draws[0], d) for d in draws[1:])  # random in train
    plain = _folder_module(tmp_path / "plain")
    plain.setup("fit")
    for split in ("val_set", "test_set"):
        a, b = getattr(dm, split)[0][0], getattr(dm, split)[0][0]
        assert torch.equal(a, b) and torch.equal(a, getattr(plain, split)[0][0])


@pytest.mark.slow
def test_statistics_are_computed_once_and_reused_by_eval_and_predict(tmp_path, monkeypatch):
    csv_file, image_dir = write_image_folder(tmp_path / "imgs", n=60, classes=("a", "b", "c"))
    run = tmp_path / "run"
    args = ["data=image_csv", f"data.csv_file={csv_file}", f"data.image_dir={image_dir}",
            "trainer.max_epochs=2", "logger=none", f"hydra.run.dir={run}"]  # fmt: skip
    res = run_inproc("-m", "experiments.train", *args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    saved = json.loads((run / "data_stats.json").read_text())
    # the statistics of the training split the run used
    dm = CsvData(csv_file=str(csv_file), image_dir=str(image_dir),
                 split="stratified", val_fraction=0.1, test_fraction=0.1,
                 train_transform=_to_tensor(), eval_transform=_to_tensor())  # fmt: skip
    dm.setup("fit")
    pixels = torch.stack([dm.train_set[i][0] for i in range(len(dm.train_set))])  # (N, 3, H, W)
    assert saved["mean"] == pytest.approx(pixels.mean(dim=(0, 2, 3)).tolist(), abs=1e-5)
    assert saved["std"] == pytest.approx(pixels.std(dim=(0, 2, 3), correction=0).tolist(), abs=1e-4)

    import experiments.data.normalization as stats

    def never(*args, **kwargs):
        raise AssertionError("statistics were computed again")

    monkeypatch.setattr(stats, "channel_stats", never)
    from experiments.evaluation.evaluate import evaluate
    from experiments.evaluation.prediction import predict

    trained = json.loads((run / "metrics.json").read_text())["test/acc"]
    assert evaluate(run)["test/acc"] == trained
    out = predict(run, image_dir)
    assert len(out.read_text().splitlines()) == 61
