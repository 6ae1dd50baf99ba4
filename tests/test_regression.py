"""The regression task: TabularData's split and standardization, hostile CSVs, the module's
metrics in the target's units, predict_rows, and experiment=diabetes through the CLI."""

from __future__ import annotations

import csv
import functools

import lightning as L
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from sklearn.datasets import load_diabetes
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

from experiments.data.tabular import TabularData, read_features
from experiments.errors import UserError
from experiments.models.regression import RegressionModule
from experiments.runs.files import read_json_object
from experiments.runs.layout import RunDir
from tests.helpers import run_inproc


def write_table(path, n: int = 60, seed: int = 0, nan_at: int | None = None):
    """A CSV of ``n`` rows: features a, b, c and y = 3a - 2b + 100 + noise (row i is CSV line
    i + 2); ``nan_at``: that row's target is NaN."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)) * [1.0, 5.0, 0.1] + [0.0, 10.0, -1.0]
    y = 3 * x[:, 0] - 2 * x[:, 1] + 100 + rng.normal(scale=0.5, size=n)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["a", "b", "c", "y"])
        for i in range(n):
            w.writerow([*(float(v) for v in x[i]), "nan" if i == nan_at else float(y[i])])
    return x, y


def tabular(csv_file, **kwargs) -> TabularData:
    dm = TabularData(csv_file=str(csv_file), target_column="y", **kwargs)
    dm.setup("fit")
    return dm


def test_diabetes_split_is_seeded_and_standardized_on_train_only():
    x, y = load_diabetes(return_X_y=True, scaled=False)
    a, b, c = TabularData(split_seed=3), TabularData(split_seed=3), TabularData(split_seed=4)
    for dm in (a, b, c):
        dm.setup("fit")
    assert a.splits == b.splits and a.splits["test"] != c.splits["test"]
    train, val, test = (a.splits[k] for k in ("train", "val", "test"))
    assert sorted(train + val + test) == list(range(442)) and (len(val), len(test)) == (66, 66)
    s = a.standardization
    assert s["feature_mean"] == x[train].mean(axis=0).tolist()
    assert s["feature_std"] == x[train].std(axis=0).tolist()
    assert (s["target_mean"], s["target_std"]) == (y[train].mean(), y[train].std())
    assert s["target_mean"] != y.mean()  # the held-out rows took no part
    # the tensors are the rows of the split, raw (the module standardizes)
    assert torch.equal(a.test_set.tensors[1], torch.tensor(y[test], dtype=torch.float32))
    assert a.num_features == 10 and a.feature_names[2] == "bmi"


def test_csv_standardization_moves_with_train_rows_only(tmp_path):
    write_table(tmp_path / "t.csv")
    dm = tabular(tmp_path / "t.csv", split_seed=1)
    rows = list(csv.reader(open(tmp_path / "t.csv")))

    def changed(row: int) -> dict:
        edited = [r[:] for r in rows]
        edited[row + 1] = ["1e3", "1e3", "1e3", "1e3"]  # +1: the header
        with open(tmp_path / "e.csv", "w", newline="") as f:
            csv.writer(f).writerows(edited)
        return tabular(tmp_path / "e.csv", split_seed=1).standardization

    assert changed(dm.splits["test"][0]) == dm.standardization
    assert changed(dm.splits["val"][0]) == dm.standardization
    moved = changed(dm.splits["train"][0])
    assert moved["feature_mean"] != dm.standardization["feature_mean"]
    assert moved["target_mean"] != dm.standardization["target_mean"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a,y\n1,2\n3,nan\n", ["line 3", "target 'y' is nan"]),
        ("a,y\n1,2\n3,\n", ["line 3", "target 'y' is empty"]),
        ("a,y\n1,2\n3,4\nx,5\n", ["line 4", "feature 'a' is 'x', not a number"]),
        ("a,y\n1,2\n3,4,5\n", ["line 3", "3 fields where the header has 2"]),
        ("a,z\n1,2\n", ["data.target_column='y'", "no such column", "it has a, z"]),
        ("a,yy\n1,2\n", ["did you mean 'yy'"]),
        ("a,y\n", ["no data rows"]),
        ("", ["no header row"]),
        ('a,y\n1,"2\n', ["not valid CSV"]),
    ],
)
def test_hostile_csv_is_one_line_naming_the_row(tmp_path, text, words):
    (tmp_path / "t.csv").write_text(text)
    with pytest.raises(UserError) as err:
        tabular(tmp_path / "t.csv")
    message = str(err.value)
    assert "\n" not in message and str(tmp_path / "t.csv") in message, message
    for word in words:
        assert word in message, message


def test_csv_must_name_its_target():
    with pytest.raises(UserError, match="data.target_column: required with data.csv_file"):
        TabularData(csv_file="t.csv")
    with pytest.raises(UserError, match="augment=none"):
        TabularData(augment={"x": 1})


def test_metrics_equal_sklearns_in_original_units(tmp_path):
    write_table(tmp_path / "t.csv", n=200)
    dm = tabular(tmp_path / "t.csv", batch_size=7, val_fraction=0.25, test_fraction=0.2)
    torch.manual_seed(0)
    module = RegressionModule(in_features=3, hidden_sizes=[8])
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    for stage, run in (("val", trainer.validate), ("test", trainer.test)):
        (logged,) = run(module, datamodule=dm, verbose=False)
        x, y = (t.numpy() for t in getattr(dm, f"{stage}_set").tensors)
        pred = module.predict_rows(x).numpy()
        y, pred = y.astype(np.float64), pred.astype(np.float64)  # what the module sums in
        assert abs(pred.mean() - y.mean()) < 50  # original units (standardized would be ~0)
        expected = {"mae": mean_absolute_error(y, pred), "mse": mean_squared_error(y, pred),
                    "r2": r2_score(y, pred)}  # fmt: skip
        for name, value in expected.items():
            assert logged[f"{stage}/{name}"] == pytest.approx(value, rel=1e-9), name


def test_predict_rows_undoes_the_standardization_saved_with_the_weights():
    module = RegressionModule(in_features=2)
    module.set_standardization([1.0, 2.0], [2.0, 4.0], target_mean=150.0, target_std=10.0)
    with torch.no_grad():
        module.layers[-1].weight.copy_(torch.tensor([[1.0, -0.5]]))
        module.layers[-1].bias.fill_(0.25)
    rows = [[3.0, 2.0], [1.0, 10.0]]  # standardized: (1, 0) and (0, 2)
    assert module.predict_rows(rows).tolist() == [150 + 10 * 1.25, 150 + 10 * -0.75]
    loaded = RegressionModule(in_features=2)
    with pytest.raises(UserError, match="no standardization"):
        loaded.predict_rows(rows)
    loaded.load_state_dict(module.state_dict())  # what best.safetensors holds
    assert torch.equal(loaded.predict_rows(rows), module.predict_rows(rows))
    with pytest.raises(UserError, match="rows of 2 features"):
        loaded.predict_rows([[1.0, 2.0, 3.0]])
    with pytest.raises(UserError, match="model.in_features=3"):
        RegressionModule(in_features=3).set_standardization([0.0], [1.0], 0.0, 1.0)


def test_a_linear_module_learns_the_table(tmp_path):
    write_table(tmp_path / "t.csv", n=300)
    dm = tabular(tmp_path / "t.csv")
    L.seed_everything(0, verbose=False)
    adam = functools.partial(torch.optim.Adam, lr=0.05)
    module = RegressionModule(optimizer=adam, in_features=3)
    trainer = L.Trainer(max_epochs=30, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)  # fmt: skip
    trainer.fit(module, dm)
    (logged,) = trainer.test(module, datamodule=dm, verbose=False)
    assert logged["test/mae"] < 1.0 and logged["test/r2"] > 0.99  # noise 0.5, targets' std ~10


def test_diabetes_trains_and_evals_through_the_cli(tmp_path):
    run = tmp_path / "run"
    res = run_inproc(
        "-m", "experiments.train", "experiment=diabetes", "seed=1", "trainer.max_epochs=3",
        f"hydra.run.dir={run}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    trained = read_json_object(RunDir(run).metrics)
    assert {"val/mae", "val/mse", "val/r2", "test/mae", "test/r2"} <= set(trained)
    assert read_json_object(RunDir(run).best_json)["monitor"] == "val/mae"
    # the weights carry the train split's statistics: predict_rows alone reproduces test/mae
    module = RegressionModule(in_features=10, hidden_sizes=[16], dropout=0.1)
    module.load_state_dict(load_file(RunDir(run).best_weights))
    dm = TabularData()
    dm.setup()
    x, y = dm.test_set.tensors
    mae = mean_absolute_error(y.numpy(), module.predict_rows(x).numpy())
    assert mae == pytest.approx(trained["test/mae"], rel=1e-5)
    res = run_inproc("-m", "experiments.eval", str(run), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    evaluated = read_json_object(RunDir(run).eval_metrics)
    assert evaluated["test/mae"] == pytest.approx(trained["test/mae"], rel=1e-6)
    # its full checkpoint is plain data (hidden_sizes a list, not a ListConfig): it resumes
    res = run_inproc(
        "-m", "experiments.train", f"resume={run}", "trainer.max_epochs=4", cwd=tmp_path
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert read_json_object(RunDir(run).metrics)["epochs"] == 4


def test_a_nan_target_through_the_cli_is_one_line(tmp_path):
    write_table(tmp_path / "t.csv", nan_at=7)
    res = run_inproc(
        "-m", "experiments.train", "experiment=diabetes", f"data.csv_file={tmp_path / 't.csv'}",
        "data.target_column=y", "model.in_features=3", f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr[-2000:]
    (line,) = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: ") and "line 9: target 'y' is nan" in line, line


def test_read_features_takes_the_trained_columns_by_name(tmp_path):
    x, _ = write_table(tmp_path / "t.csv", n=5)
    rows = read_features(str(tmp_path / "t.csv"), ["c", "a"])  # the target column is ignored
    assert rows.tolist() == x[:, [2, 0]].tolist()
    (tmp_path / "n.csv").write_text("a,c\n1,2\n3,nan\n")
    with pytest.raises(UserError, match=r"n.csv line 3: feature 'c' is nan"):
        read_features(str(tmp_path / "n.csv"), ["a", "c"])
    with pytest.raises(UserError, match=r"the model's feature 'b': no such column"):
        read_features(str(tmp_path / "n.csv"), ["a", "b"])


def test_predict_writes_one_value_per_row_from_the_trained_columns(tmp_path):
    run = tmp_path / "run"
    res = run_inproc(
        "-m", "experiments.train", "experiment=diabetes", "trainer.max_epochs=2",
        f"hydra.run.dir={run}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    sidecar = read_json_object(RunDir(run).best_json)
    names = sidecar["feature_names"]
    assert names[:3] == ["age", "sex", "bmi"] and len(names) == 10
    assert sidecar["target"]["std"] > 0 and sidecar["target"]["column"] is None
    card = RunDir(run).model_card.read_text()
    assert "one number per row: disease progression" in card and "standard deviation" in card
    # the columns by name: another order and an extra column change nothing
    x, _ = load_diabetes(return_X_y=True, scaled=False)
    order = [*reversed(names), "id"]
    with open(tmp_path / "new.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(order)
        for i, row in enumerate(x[:7]):
            w.writerow([*(repr(float(v)) for v in reversed(row)), f"p{i}"])
    res = run_inproc(
        "-m", "experiments.predict", str(run), f"input={tmp_path / 'new.csv'}", cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr[-2000:]
    with open(RunDir(run).predictions, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["row", "predicted"] and [r[0] for r in rows[1:]] == list("1234567")
    module = RegressionModule(in_features=10, hidden_sizes=[16], dropout=0.1)
    module.load_state_dict(load_file(RunDir(run).best_weights))
    expected = module.predict_rows(x[:7]).tolist()
    assert [float(r[1]) for r in rows[1:]] == pytest.approx(expected, rel=1e-6)
    # a missing feature column: one line naming it and the file
    (tmp_path / "bad.csv").write_text("age,sex\n1,2\n")
    res = run_inproc("-m", "experiments.predict", str(run), f"input={tmp_path / 'bad.csv'}",
                     cwd=tmp_path)  # fmt: skip
    assert res.returncode == 2
    (line,) = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert "the model's feature 'bmi': no such column in" in line, line
