"""k-fold cross-validation as a run type (``cv.folds=K``): folds, summary, resume, sweeps."""

from __future__ import annotations

import json
import shutil
import statistics

import pytest

from tests.helpers import run_inproc


def test_every_non_test_sample_validates_in_exactly_one_fold(make_cfg):
    from hydra.utils import instantiate

    val_sets, test_sets, train_sets = [], [], []
    for k in range(5):
        dm = instantiate(make_cfg("+data.folds=5", f"+data.fold={k}").data)
        dm.setup("fit")
        val_sets.append(set(dm.val_set.indices))
        train_sets.append(set(dm.train_set.indices))
        test_sets.append(tuple(dm.test_set.indices))
    assert len(set(test_sets)) == 1  # the same test split for every fold
    test = set(test_sets[0])
    everything = set(range(1797))
    pool = everything - test
    seen = [i for v in val_sets for i in v]
    assert sorted(seen) == sorted(pool)  # each non-test sample in exactly one val fold
    for train, val in zip(train_sets, val_sets, strict=True):
        assert train | val == pool and not train & val
    sizes = [len(v) for v in val_sets]
    assert max(sizes) - min(sizes) <= 1
    targets = dm.train_set.dataset.targets
    for val in val_sets:  # stratified: each class's share within 2 samples of even
        for c in range(10):
            in_pool = sum(1 for i in pool if targets[i] == c)
            assert abs(sum(1 for i in val if targets[i] == c) - in_pool / 5) <= 2


@pytest.mark.slow
def test_cv_run_writes_folds_and_summary_and_resumes_only_missing_folds(tmp_path, data_dir):
    run = tmp_path / "cv"
    common = [f"paths.data_dir={data_dir}", "logger=none", "trainer.limit_train_batches=5"]
    res = run_inproc(
        "-m", "experiments.train", "cv.folds=3", "trainer.max_epochs=2", *common,
        f"hydra.run.dir={run}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    folds = [json.loads((run / f"fold_{k}" / "metrics.json").read_text()) for k in range(3)]
    summary = json.loads((run / "metrics.json").read_text())
    accs = [f["val/acc"] for f in folds]
    assert summary["cv_folds"] == 3
    assert summary["val/acc"] == pytest.approx(statistics.mean(accs))
    assert summary["val/acc_std"] == pytest.approx(statistics.stdev(accs))
    assert summary["folds"] == folds
    cv_md = (run / "cv.md").read_text()
    assert "| mean ± std |" in cv_md and cv_md.count("\n| ") == 5  # header, 3 folds, mean

    # fold 1 stopped after its last checkpoint, fold 2 never started: resume re-runs
    # only those two (fold 1 from its checkpoint), and fold 0 is left as it was
    fold0 = (run / "fold_0" / "metrics.json").read_bytes()
    (run / "fold_1" / "metrics.json").unlink()
    shutil.rmtree(run / "fold_2")
    (run / "metrics.json").unlink()
    res = run_inproc(
        "-m", "experiments.train", f"resume={run}", "trainer.max_epochs=3", cwd=tmp_path
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    log = res.stdout + res.stderr
    assert "cv fold 1/3 finished before: kept" in log
    assert f"resuming {run / 'fold_1'}" in log
    assert (run / "fold_0" / "metrics.json").read_bytes() == fold0
    assert json.loads((run / "fold_1" / "metrics.json").read_text())["epochs"] == 3
    assert json.loads((run / "fold_2" / "metrics.json").read_text())["epochs"] == 3
    assert json.loads((run / "metrics.json").read_text())["cv_folds"] == 3


@pytest.mark.slow
def test_a_sweep_gets_the_fold_mean(tmp_path, data_dir):
    res = run_inproc(
        "-m", "experiments.train", "-m", "cv.folds=2", "debug=limit", "logger=none",
        f"paths.data_dir={data_dir}", "optimizer.lr=0.01,0.1", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    (sweep,) = (tmp_path / "outputs" / "debug" / "multiruns").iterdir()
    for job in ("0", "1"):
        means = json.loads((sweep / job / "metrics.json").read_text())
        folds = [f["val/acc"] for f in means["folds"]]
        returned = json.loads((sweep / job / "job.json").read_text())["value"]
        assert returned == pytest.approx(statistics.mean(folds)) == pytest.approx(means["val/acc"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("cv.folds=1", "cv.folds=1 is not valid: expected int >= 2"),
        ("cv.folds=500", "cv.folds=500: class 8 has only 148 samples"),
    ],
)
def test_bad_fold_counts_fail_in_one_line(tmp_path, data_dir, override, message):
    res = run_inproc(
        "-m", "experiments.train", override, f"paths.data_dir={data_dir}",
        f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr[-2000:]
    assert message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_a_corrupt_kept_fold_is_one_line_naming_it(tmp_path):
    from omegaconf import OmegaConf

    from experiments.errors import UserError
    from experiments.training.cross_validation import cross_validate

    run = tmp_path / "cv"
    for k, text in enumerate(['{"val/acc": 0.5, "epochs": 2}', '{"val/acc": 0.6, "epo']):
        (run / f"fold_{k}").mkdir(parents=True)
        (run / f"fold_{k}" / "metrics.json").write_text(text)
    cfg = OmegaConf.create(
        {"cv": {"folds": 2}, "paths": {"output_dir": str(run)}, "resume": str(run),
         "optimized_metric": "val/acc"}
    )  # fmt: skip

    def never(_cfg):
        raise AssertionError("both folds were finished: nothing should train")

    with pytest.raises(UserError, match=r"fold_1/metrics.json: not valid JSON") as err:
        cross_validate(cfg, never)
    assert "\n" not in str(err.value)
    # a number too large for a float is left out of the mean, not an OverflowError
    (run / "fold_1" / "metrics.json").write_text('{"val/acc": 0.7, "epochs": 1' + "0" * 400 + "}")
    means = cross_validate(cfg, never)
    assert means["val/acc"] == pytest.approx(0.6) and "epochs" not in means
