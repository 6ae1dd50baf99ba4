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
from experiments.evaluation.prediction import predict
from experiments.predict import main
from experiments.runs.layout import RunDir
from tests.helpers import assert_one_line_error, edit_config, prediction_rows, run_inproc


@pytest.fixture(scope="session")
def labels(data_dir) -> dict[str, str]:
    with open(data_dir / "digits" / "labels.csv", newline="") as f:
        return {row["filename"]: row["label"] for row in csv.DictReader(f)}


def agreement(rows: list[dict], labels: dict[str, str]) -> float:
    return sum(labels[Path(r["file"]).name] == r["predicted"] for r in rows) / len(rows)


def test_folder_of_digits(trained_run, data_dir, labels):
    out = predict(trained_run, data_dir / "digits" / "images")
    assert out == trained_run / "predictions.csv"
    rows = prediction_rows(out)
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
    rows = prediction_rows(out)
    assert [r["file"] for r in rows] == [f"imgs/{n}" for n in reversed(names)]  # CSV order
    assert agreement(rows, labels) >= 0.8
    assert all(math.isfinite(float(r["probability"])) for r in rows)
    # image_dir= moves the base the file names are relative to
    shutil.move(folder / "imgs", tmp_path / "moved")
    (folder / "batch.csv").write_text("filename\n" + "\n".join(names) + "\n")
    rows2 = prediction_rows(
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
    with_sidecar = prediction_rows(predict(run, few_images, ckpt="last"))
    RunDir(run).manifest.unlink()  # an older run's layout: no manifest to refuse the change
    (run / "checkpoints" / "last.json").unlink()
    without = prediction_rows(predict(run, few_images, ckpt="last"))
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
    rows = prediction_rows(out)
    assert len(rows) == len(list(few_images.iterdir()))
    # a small table of the first predictions, then how many and where
    assert shown[0].split() == ["file", "predicted", "probability"]
    first = rows[0]
    assert shown[1].split()[:2] == [first["file"], first["predicted"]]
    assert len(shown) == 2 + min(5, len(rows))
    assert shown[-1].startswith(f"{len(rows)} predictions") and shown[-1].endswith(str(out))


def _csv_beside(folder: Path, few_images: Path, rows: list[str]) -> Path:
    """``folder/batch.csv`` listing ``rows`` after two real images copied into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    good = sorted(few_images.iterdir())[:2]
    for image in good:
        shutil.copy(image, folder)
    csv_file = folder / "batch.csv"
    csv_file.write_text("filename\n" + "\n".join([*(p.name for p in good), *rows]) + "\n")
    return csv_file


def test_csv_row_leaving_the_folder_is_refused_in_one_line(trained_run, few_images, tmp_path):
    # the run's own CSV rule: a file name is a relative path inside the image folder
    outside = shutil.copy(next(few_images.iterdir()), tmp_path / "outside.png")
    csv_file = _csv_beside(tmp_path / "batch", few_images, ["../outside.png"])
    out = tmp_path / "p.csv"
    args = [f"run_dir={trained_run}", f"input={csv_file}", f"output={out}"]
    res = run_inproc("-m", "experiments.predict", *args, cwd=tmp_path)
    assert_one_line_error(res, f"{csv_file} row 4: file name '../outside.png' leads outside")
    assert not out.exists()
    # an absolute name too, even of a file that is there
    csv_file.write_text(f"filename\n{outside}\n")
    with pytest.raises(UserError, match=r"row 2: file name '/.*outside\.png' leads outside"):
        predict(trained_run, csv_file, output=out)
    assert not out.exists()


def test_csv_row_through_a_symlink_out_is_refused_unless_the_run_follows_them(
    trained_run, few_images, tmp_path
):
    secret = shutil.copy(next(few_images.iterdir()), tmp_path / "secret.png")
    folder = tmp_path / "batch"
    csv_file = _csv_beside(folder, few_images, ["inner.png", "link.png"])
    first = csv_file.read_text().splitlines()[1]
    (folder / "inner.png").symlink_to(folder / first)  # a link that stays inside: read
    (folder / "link.png").symlink_to(secret)
    out = tmp_path / "p.csv"
    args = [f"run_dir={trained_run}", f"input={csv_file}", f"output={out}"]
    res = run_inproc("-m", "experiments.predict", *args, cwd=tmp_path)
    assert_one_line_error(res, f"{csv_file} row 5: 'link.png' leads through a symlink to")
    assert "secret.png" in res.stderr and "follow_symlinks=true" in res.stderr
    assert not out.exists()
    # a run that reads through symlinks (data.follow_symlinks=true) predicts it
    follow = ["+data.follow_symlinks=true"]
    rows = prediction_rows(predict(trained_run, csv_file, output=out, overrides=follow))
    assert [r["file"] for r in rows][2:] == ["inner.png", "link.png"]
    assert rows[2]["probability"] == rows[0]["probability"]  # inner.png is the first image


def test_a_file_listed_twice_is_predicted_twice(trained_run, few_images, tmp_path):
    # unlike a training CSV (where a copy could land in train and test), predict lists
    # what it is asked for
    csv_file = _csv_beside(tmp_path / "batch", few_images, [])
    name = csv_file.read_text().splitlines()[1]
    csv_file.write_text(f"filename\n{name}\n./{name}\n{name}\n")
    rows = prediction_rows(predict(trained_run, csv_file, output=tmp_path / "p.csv"))
    assert [r["file"] for r in rows] == [name, f"./{name}", name]
    assert len({(r["predicted"], r["probability"]) for r in rows}) == 1


def test_leads_outside_is_the_folder_rule(tmp_path):
    from experiments.data.datasets import leads_outside

    folder, elsewhere = tmp_path / "images", tmp_path / "elsewhere"
    (folder / "a").mkdir(parents=True)
    elsewhere.mkdir()
    (folder / "b.png").write_bytes(b"")
    (folder / "out").symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / "back.png").symlink_to(folder / "b.png")
    assert leads_outside(folder, "a/../b.png") is None
    assert leads_outside(folder, "out/back.png") is None  # out and back in again
    assert leads_outside(folder, "out/x.png") == elsewhere / "x.png"
    assert leads_outside(folder, "out/x.png", follow_symlinks=True) is None
    # a name that climbs out, or an absolute one, whatever follow_symlinks says
    assert leads_outside(folder, "a/../../x.png", True) == tmp_path / "x.png"
    assert leads_outside(folder, "/etc/passwd", True) == Path("/etc/passwd")
