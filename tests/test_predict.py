"""``experiments.predict`` on a real run folder: a folder or CSV of digit images in,
a predictions CSV out that agrees with the true labels; one-line errors."""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import pytest
from PIL import Image

from experiments.errors import UserError
from experiments.predict import main, predict
from experiments.runs.layout import RunDir
from tests.helpers import run_inproc
from tests.test_eval import assert_one_line_error, edit_config, train_once


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, data_dir) -> Path:
    return train_once(tmp_path_factory, data_dir)  # the same run as test_eval's


@pytest.fixture(scope="session")
def labels(data_dir) -> dict[str, str]:
    with open(data_dir / "digits" / "labels.csv", newline="") as f:
        return {row["filename"]: row["label"] for row in csv.DictReader(f)}


@pytest.fixture(scope="session")
def few_images(data_dir, tmp_path_factory) -> Path:
    """Every 30th digit image, in a folder of their own."""
    folder = tmp_path_factory.mktemp("few")
    for name in sorted((data_dir / "digits" / "images").iterdir())[::30]:
        shutil.copy(name, folder)
    return folder


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == ["file", "predicted", "probability"]
        return list(reader)


def agreement(rows: list[dict], labels: dict[str, str]) -> float:
    return sum(labels[Path(r["file"]).name] == r["predicted"] for r in rows) / len(rows)


def test_folder_of_digits(trained_run, data_dir, labels):
    out = predict(trained_run, data_dir / "digits" / "images")
    assert out == trained_run / "predictions.csv"
    rows = read_rows(out)
    assert [r["file"] for r in rows] == sorted(labels)  # every image, sorted by name
    assert all(0.0 < float(r["probability"]) <= 1.0 for r in rows)
    assert {r["predicted"] for r in rows} <= {str(i) for i in range(10)}
    # a 2-epoch seeded MLP: trained on 70% of these, ~89% on held-out ones
    assert agreement(rows, labels) >= 0.8


def test_csv_relative_to_its_folder_with_other_sizes_and_modes(
    trained_run, data_dir, labels, tmp_path
):
    # RGB, 4x upscaled: predict must convert to L and resize back to the run's 8x8
    folder = tmp_path / "batch"
    (folder / "imgs").mkdir(parents=True)
    names = sorted(labels)[::30]
    for name in names:
        with Image.open(data_dir / "digits" / "images" / name) as im:
            im.convert("RGB").resize((32, 32), Image.NEAREST).save(folder / "imgs" / name)
    with open(folder / "batch.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "filename"])
        writer.writerows((i, f"imgs/{n}") for i, n in enumerate(reversed(names)))
    out = predict(trained_run, folder / "batch.csv", output=tmp_path / "out.csv")
    rows = read_rows(out)
    assert [r["file"] for r in rows] == [f"imgs/{n}" for n in reversed(names)]  # CSV order
    assert agreement(rows, labels) >= 0.8
    assert all(math.isfinite(float(r["probability"])) for r in rows)
    # image_dir= moves the base the file names are relative to
    shutil.move(folder / "imgs", tmp_path / "moved")
    (folder / "batch.csv").write_text("filename\n" + "\n".join(names) + "\n")
    rows2 = read_rows(
        predict(
            trained_run,
            folder / "batch.csv",
            output=tmp_path / "o2.csv",
            image_dir=tmp_path / "moved",
        )
    )
    assert {r["file"]: r["predicted"] for r in rows2} == {
        Path(r["file"]).name: r["predicted"] for r in rows
    }


def test_without_sidecar_reads_shape_and_classes_from_the_data(trained_run, few_images, tmp_path):
    run = Path(shutil.copytree(trained_run, tmp_path / "run"))
    with_sidecar = read_rows(predict(run, few_images, ckpt="last"))
    RunDir(run).manifest.unlink()  # an older run's layout: no manifest to refuse the change
    (run / "checkpoints" / "last.json").unlink()
    without = read_rows(predict(run, few_images, ckpt="last"))
    assert without == with_sidecar


def test_foreign_target_is_refused(trained_run, few_images, tmp_path):
    run = Path(shutil.copytree(trained_run, tmp_path / "run"))
    (run / "predictions.csv").unlink(missing_ok=True)
    RunDir(run).manifest.unlink()  # the vocabulary is under test, not the manifest
    canary = tmp_path / "canary"

    def tamper(cfg):
        cfg["data"]["eval_transform"] = {"_target_": "os.system", "_args_": [f"touch {canary}"]}

    edit_config(run, tamper)
    with pytest.raises(UserError, match=r"data\.eval_transform\._target_='os\.system' is refused"):
        predict(run, few_images)
    assert not canary.exists() and not (run / "predictions.csv").exists()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["run_dir={tmp}/missing", "input={tmp}"], "run_dir not found"),
        (["run_dir={run}"], "missing input"),
        (["run_dir={run}", "input={tmp}/empty"], "no images in"),
        (["run_dir={run}", "input={tmp}/nothing.csv"], "input not found"),
        (["run_dir={run}", "input={tmp}/bad.csv"], "'filename' column"),
    ],
)
def test_cli_mistakes_fail_in_one_line(trained_run, tmp_path, args, named):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not an image")
    (tmp_path / "bad.csv").write_text("file,label\na.png,1\n")
    args = [a.format(tmp=tmp_path, run=trained_run) for a in args]
    res = run_inproc("-m", "experiments.predict", *args, cwd=tmp_path)
    assert_one_line_error(res, named)
    assert not (tmp_path / "predictions.csv").exists()


def test_main_writes_predictions(trained_run, few_images, tmp_path, monkeypatch, capsys):
    out = tmp_path / "p.csv"
    argv = [f"run_dir={trained_run}", f"input={few_images}", f"output={out}"]
    monkeypatch.setattr("sys.argv", ["predict", *argv, "data.batch_size=7", "device=cpu"])
    main()
    shown = capsys.readouterr().out.strip().splitlines()
    rows = read_rows(out)
    assert len(rows) == len(list(few_images.iterdir()))
    # a small table of the first predictions, then how many and where
    assert shown[0].split() == ["file", "predicted", "probability"]
    first = rows[0]
    assert shown[1].split()[:2] == [first["file"], first["predicted"]]
    assert len(shown) == 2 + min(5, len(rows))
    assert shown[-1].startswith(f"{len(rows)} predictions") and shown[-1].endswith(str(out))
