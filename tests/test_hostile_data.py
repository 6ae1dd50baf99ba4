"""User data handed to the loaders is data: CSV file names stay inside data.image_dir (and
symlinks too, unless allowed), images that are bombs, truncated or 16-bit are refused or
scaled, CSV text is UTF-8, labels are bounded and listed once, a split that lacks classes is
marked, a corrupt data_stats.json is one line, and the model card escapes what it is given."""

from __future__ import annotations

import io
import json
import logging
import re
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from torchvision.transforms import v2

from experiments.data import CsvData, CsvImageDataset
from experiments.data.csv_index import MAX_CLASSES
from experiments.data.images import peek_image
from experiments.errors import UserError
from experiments.models.metrics import summarize
from experiments.training.model_card import write_model_card
from tests.helpers import REPO, run_inproc, write_image_folder

TO_TENSOR = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])


def _folder(tmp_path: Path, rows: list[str] | None = None, n: int = 8) -> tuple[Path, Path]:
    """``n`` images (cat/dog) in ``tmp_path/images`` and ``labels.csv``; ``rows`` replace
    the CSV's rows (the header stays, so ``rows[i]`` is on line ``i + 2``)."""
    csv_file, image_dir = write_image_folder(tmp_path, n=n)
    if rows is not None:
        csv_file.write_text("filename,label\n" + "\n".join(rows) + "\n")
    return csv_file, image_dir


def _png(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width x height`` 8-bit gray pixels, with a tiny IDAT:
    Pillow reads the size from the header alone, so the bomb costs nothing to write."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    body = chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + body


def _good_rows(n: int = 6) -> list[str]:
    return [f"img_{i:03d}.png,{'cat' if i % 2 else 'dog'}" for i in range(n)]


# ---- file names stay inside data.image_dir


@pytest.mark.parametrize(
    "name",
    [
        "../outside.png",
        "{outside}",
        "a/../../outside.png",
        "/etc/passwd",
        "images/../../outside.png",
    ],
)
def test_file_names_leaving_image_dir_are_refused_naming_the_row(tmp_path, name):
    csv_file, image_dir = _folder(tmp_path)
    outside = tmp_path / "outside.png"
    Image.new("L", (10, 12), 200).save(outside)
    name = name.format(outside=outside)
    rows = _good_rows(2) + [f"{name},cat"] + _good_rows(6)[2:]
    csv_file.write_text("filename,label\n" + "\n".join(rows) + "\n")
    # also when files are not checked up front (the probe of the first image's size)
    for check_files in (True, False):
        with pytest.raises(UserError, match=rf"labels\.csv row 4: file name '{re.escape(name)}'"):
            CsvImageDataset(csv_file, image_dir, check_files=check_files)


def test_a_name_that_stays_inside_is_fine(tmp_path):
    csv_file, image_dir = _folder(tmp_path)
    (image_dir / "sub").mkdir()
    Image.new("RGB", (10, 12)).save(image_dir / "sub" / "x.png")
    rows = _good_rows(4) + ["sub/../sub/./x.png,cat"]
    csv_file.write_text("filename,label\n" + "\n".join(rows) + "\n")
    ds = CsvImageDataset(csv_file, image_dir, transform=TO_TENSOR)
    assert ds[4][0].shape == (3, 12, 10)


def test_symlinks_outside_are_refused_unless_follow_symlinks(tmp_path):
    csv_file, image_dir = _folder(tmp_path)
    outside_dir = tmp_path / "elsewhere"
    outside_dir.mkdir()
    Image.new("RGB", (10, 12), (9, 9, 9)).save(outside_dir / "secret.png")
    (image_dir / "link.png").symlink_to(outside_dir / "secret.png")
    (image_dir / "inner.png").symlink_to(image_dir / "img_000.png")  # stays inside: fine
    (image_dir / "sub").symlink_to(outside_dir, target_is_directory=True)
    base = _good_rows(4) + ["inner.png,dog"]
    for bad, line in (("link.png", 7), ("sub/secret.png", 7)):
        csv_file.write_text("filename,label\n" + "\n".join([*base, f"{bad},cat"]) + "\n")
        with pytest.raises(
            UserError,
            match=rf"row {line}: '{bad}' leads through .*secret\.png.*follow_symlinks=true",
        ):
            CsvImageDataset(csv_file, image_dir)
    # the documented key allows them, through the DataModule as configured
    dm = CsvData(
        csv_file=str(csv_file),
        image_dir=str(image_dir),
        eval_transform=TO_TENSOR,
        train_transform=TO_TENSOR,
        val_fraction=0.2,
        test_fraction=0.0,
        follow_symlinks=True,
    )
    dm.setup("fit")
    ds = CsvImageDataset(csv_file, image_dir, transform=TO_TENSOR, follow_symlinks=True)
    assert torch.allclose(ds[5][0], torch.full((3, 12, 10), 9 / 255))


def test_a_symlink_swapped_in_after_the_check_is_refused_at_read(tmp_path):
    csv_file, image_dir = _folder(tmp_path, _good_rows(6))
    ds = CsvImageDataset(csv_file, image_dir)
    outside = tmp_path / "outside.png"
    Image.new("RGB", (10, 12)).save(outside)
    (image_dir / "img_003.png").unlink()
    (image_dir / "img_003.png").symlink_to(outside)
    with pytest.raises(UserError, match=r"row 5: 'img_003\.png' leads through a symlink to"):
        ds[3]


# ---- images


def test_decompression_bombs_and_broken_files_are_one_line_naming_file_and_row(tmp_path):
    csv_file, image_dir = _folder(tmp_path, _good_rows(6))
    (image_dir / "img_001.png").write_bytes(_png(20_000, 20_000))  # past 2x Pillow's limit
    (image_dir / "img_002.png").write_bytes(_png(10_000, 10_000))  # past it (Pillow warns)
    whole = (image_dir / "img_003.png").read_bytes()
    (image_dir / "img_003.png").write_bytes(whole[: len(whole) // 2])  # truncated
    (image_dir / "img_004.png").write_bytes(b"GIF89a\x01")  # unreadable
    ds = CsvImageDataset(csv_file, image_dir)
    expected = {
        1: r"row 3: cannot read image .*img_001\.png: refused as a decompression bomb",
        2: r"row 4: cannot read image .*img_002\.png: refused as a decompression bomb",
        3: r"row 5: cannot read image .*img_003\.png: .*truncated",
        4: r"row 6: cannot read image .*img_004\.png",
    }
    for i, pattern in expected.items():
        with pytest.raises(UserError, match=pattern) as err:
            ds[i]
        assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=r"img_001\.png: refused as a decompression bomb"):
        peek_image(image_dir / "img_001.png")


def test_16_bit_images_are_scaled_to_8_bits_never_clipped(tmp_path):
    image_dir = tmp_path / "images"
    image_dir.mkdir()
    rng = np.random.default_rng(0)
    rows = []
    for i in range(20):
        pixels = rng.integers(0, 65536, size=(8, 8), dtype=np.uint16)  # mean ~32768
        pixels[0, :3] = (0, 257 * 100, 65535)
        Image.fromarray(pixels).save(image_dir / f"w{i}.png")
        rows.append(f"w{i}.png,{i % 2}")
    csv_file = tmp_path / "labels.csv"
    csv_file.write_text("filename,label\n" + "\n".join(rows) + "\n")
    with Image.open(image_dir / "w0.png") as im:
        assert im.mode.startswith("I;16")  # what the test is about
    ds = CsvImageDataset(csv_file, image_dir, image_mode="L")
    assert np.asarray(ds.load_image(0))[0, :3].tolist() == [0, 100, 255]
    assert peek_image(image_dir / "w0.png") == ("L", (8, 8))
    # the training statistics of such a folder (they were 0.999: everything white)
    dm = CsvData(
        csv_file=str(csv_file),
        image_dir=str(image_dir),
        train_transform=TO_TENSOR,
        eval_transform=TO_TENSOR,
        mean="auto",
        std="auto",
        val_fraction=0.2,
        test_fraction=0.0,
    )
    dm.setup("fit")
    mean, std = dm.stats
    assert 0.45 < mean[0] < 0.55 and 0.25 < std[0] < 0.33, dm.stats


# ---- CSV text


def test_csv_is_utf8_with_or_without_bom_and_anything_else_is_one_line(tmp_path):
    csv_file, image_dir = _folder(tmp_path)
    text = "filename,label\n" + "\n".join(_good_rows(4) + ["img_004.png,café"]) + "\n"
    csv_file.write_bytes(b"\xef\xbb\xbf" + text.encode())  # Excel's UTF-8 with a BOM
    assert CsvImageDataset(csv_file, image_dir).classes == ["café", "cat", "dog"]
    csv_file.write_bytes(text.encode("latin-1"))
    with pytest.raises(UserError, match=r"labels\.csv line 6: not UTF-8 text \(byte 0xe9"):
        CsvImageDataset(csv_file, image_dir)
    csv_file.write_bytes(text.replace("café", "x" * 200_000).encode())  # past csv's field limit
    with pytest.raises(UserError, match=r"labels\.csv line 6: not valid CSV \(field larger"):
        CsvImageDataset(csv_file, image_dir)
    csv_file.write_bytes(text.replace("img_004.png", "img_\0004.png").encode())
    with pytest.raises(
        UserError, match=r"labels\.csv row 6: file name 'img_\\x004\.png' holds a NUL"
    ):
        CsvImageDataset(csv_file, image_dir)


# ---- labels


@pytest.mark.parametrize(
    ("labels", "classes"),
    [
        (["²", "1"], ["1", "²"]),  # a digit to str.isdigit, not to int()
        (["--1", "1"], ["--1", "1"]),
        (["1.5", "2"], ["1.5", "2"]),
        (["٣", "1"], ["1", "٣"]),  # an Arabic-Indic digit: a name too
        ([" 3", "1"], ["0", "1", "2", "3"]),  # stripped (with a warning): a plain integer
    ],
)
def test_labels_are_numeric_only_when_every_label_is_a_plain_integer(tmp_path, labels, classes):
    rows = [f"img_{i:03d}.png,{labels[i % 2]}" for i in range(6)]
    csv_file, image_dir = _folder(tmp_path, rows)
    assert CsvImageDataset(csv_file, image_dir).classes == classes


@pytest.mark.parametrize("label", ["20000", "999999999", "9" * 5000, "-1"])
def test_integer_labels_beyond_the_class_bound_are_one_line(tmp_path, label):
    rows = _good_rows(6)
    rows = [r.replace("cat", "1").replace("dog", "0") for r in rows]
    rows[3] = f"img_003.png,{label}"
    csv_file, image_dir = _folder(tmp_path, rows)
    with pytest.raises(
        UserError, match=r"row 5: integer label .* is not a class index in 0\.\.9999"
    ):
        CsvImageDataset(csv_file, image_dir)


def test_more_distinct_labels_than_the_class_bound_is_one_line(tmp_path):
    _, image_dir = _folder(tmp_path, n=2)
    csv_file = tmp_path / "many.csv"
    csv_file.write_text(
        "filename,label\n" + "".join(f"f{i}.png,c{i}\n" for i in range(MAX_CLASSES + 1))
    )
    with pytest.raises(UserError, match=r"10001 distinct labels, more than the 10000 classes"):
        CsvImageDataset(csv_file, image_dir, check_files=False)


@pytest.mark.parametrize(
    ("second", "said"),
    [
        ("img_001.png,dog", r"\(as 'cat' and 'dog'\)"),
        ("img_001.png,cat", r"\(both 'cat'\)"),  # refused too: a copy can leak into test
        ("./img_001.png,cat", r"\(both 'cat'\)"),
    ],
)
def test_a_file_listed_twice_is_refused_naming_both_rows(tmp_path, second, said):
    rows = _good_rows(6)
    rows.insert(4, second)
    csv_file, image_dir = _folder(tmp_path, rows)
    with pytest.raises(UserError, match=rf"rows 3 and 6: 'img_001\.png' is listed twice {said}"):
        CsvImageDataset(csv_file, image_dir)


def test_macro_metrics_of_a_split_that_lacks_classes_are_marked():
    matrix = torch.tensor([[5, 0, 0], [0, 4, 0], [0, 0, 0]])  # class 2: no sample
    values = summarize(matrix)
    assert float(values["macro_f1"]) == 1.0 and float(values["missing_classes"]) == 1.0
    assert "missing_classes" not in summarize(torch.tensor([[5, 1], [0, 4]]))


def test_a_split_that_lacks_a_class_is_warned_and_marked_in_metrics(make_cfg, tmp_path, caplog):
    from experiments.training.pipeline import train

    rows = _good_rows(30)
    rows[0] = "img_000.png,rare"  # one sample: stratified, it can only be in train
    csv_file, image_dir = _folder(tmp_path / "data", rows, n=30)
    cfg = make_cfg(
        "data=image_csv",
        f"data.csv_file={csv_file}",
        f"data.image_dir={image_dir}",
        "data.val_fraction=0.2",
        "data.test_fraction=0.2",
        "trainer.max_epochs=1",
        "logger=none",
    )
    with caplog.at_level(logging.WARNING, logger="experiments.data.splits"):
        metrics = train(cfg)
    warned = [r.getMessage() for r in caplog.records if "missing_classes" in r.getMessage()]
    assert len(warned) == 2 and all("1 of the 3 classes ('rare')" in w for w in warned), warned
    saved = json.loads((Path(cfg.paths.output_dir) / "metrics.json").read_text())
    assert saved["val/missing_classes"] == 1 and saved["test/missing_classes"] == 1
    assert metrics["test/missing_classes"] == 1
    card = (Path(cfg.paths.output_dir) / "model_card.md").read_text()
    assert "the test split has no sample of 1 classes (rare)" in card
    assert "The test split lacks 1 of the classes" in card


# ---- data_stats.json


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("{not json", r"not valid JSON .*delete it to compute them again"),
        ('{"mean": [0.5], "std": [0]}', r"one finite number per channel and std > 0; delete it"),
        ('{"mean": "x", "std": [1]}', r"one finite number per channel"),
        ("[1, 2]", r"expected a JSON object.*delete it"),
    ],
)
def test_a_corrupt_statistics_file_is_one_line_naming_it(tmp_path, content, said):
    csv_file, image_dir = _folder(tmp_path, n=10)
    stats = tmp_path / "data_stats.json"
    stats.write_text(content)
    dm = CsvData(
        csv_file=str(csv_file),
        image_dir=str(image_dir),
        eval_transform=TO_TENSOR,
        mean="auto",
        std="auto",
        stats_file=str(stats),
    )
    with pytest.raises(UserError, match=rf"data_stats\.json: .*{said}"):
        dm.setup("fit")


# ---- through the command line: one line, exit 2, no traceback, workers included


def _case_escape(root: Path) -> tuple[list[str], str]:
    csv_file, image_dir = _folder(root, [*_good_rows(11), "../x.png,cat"], n=12)
    (root / "x.png").write_bytes((image_dir / "img_000.png").read_bytes())
    return _args(csv_file, image_dir), r"labels\.csv row 13: file name '\.\./x\.png' leads outside"


def _case_bomb_first(root: Path) -> tuple[list[str], str]:
    csv_file, image_dir = _folder(root, _good_rows(12), n=12)
    (image_dir / "img_000.png").write_bytes(_png(20_000, 20_000))
    return _args(csv_file, image_dir), r"img_000\.png: refused as a decompression bomb"


def _worker_case(root: Path, bad: bytes) -> list[str]:
    """The bad image is only in the test CSV, read by a DataLoader worker: nothing in the
    main process decodes it (sizes given, no statistics, no tensor store)."""
    csv_file, image_dir = _folder(root, _good_rows(12), n=16)
    test_csv = root / "test.csv"
    test_csv.write_text("filename,label\nimg_015.png,cat\n" + "\n".join(_good_rows(16)[12:15]))
    (image_dir / "img_015.png").write_bytes(bad)
    return [
        *_args(csv_file, image_dir),
        f"data.test_csv_file={test_csv}",
        "data.num_workers=1",
        "data.tensor_store=false",
        "data.image_mode=RGB",
        "data.image_size=[12,10]",
        "data.mean=null",
        "data.std=null",
    ]


def _case_bomb_in_worker(root: Path) -> tuple[list[str], str]:
    bomb = _png(20_000, 20_000)
    return _worker_case(root, bomb), r"test\.csv row 2: cannot read image .*decompression bomb"


def _case_truncated_in_worker(root: Path) -> tuple[list[str], str]:
    whole = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 256, (12, 10, 3), dtype=np.uint8)
    Image.fromarray(noise).save(whole, format="PNG")
    cut = whole.getvalue()[: len(whole.getvalue()) // 2]  # mid-IDAT
    return _worker_case(root, cut), r"test\.csv row 2: cannot read image .*img_015\.png"


def _case_latin1(root: Path) -> tuple[list[str], str]:
    csv_file, image_dir = _folder(root, n=12)
    csv_file.write_bytes(csv_file.read_bytes().replace(b"img_005.png,dog", b"img_005.png,\xe9"))
    return _args(csv_file, image_dir), r"labels\.csv line 7: not UTF-8 text \(byte 0xe9"


def _case_huge_label(root: Path) -> tuple[list[str], str]:
    rows = [f"img_{i:03d}.png,{i % 2}" for i in range(12)]
    rows[4] = "img_004.png,999999999"
    csv_file, image_dir = _folder(root, rows, n=12)
    return _args(csv_file, image_dir), r"row 6: integer label 999999999 is not a class index"


def _case_corrupt_stats(root: Path) -> tuple[list[str], str]:
    csv_file, image_dir = _folder(root, n=12)
    (root / "data_stats.json").write_text('{"mean": [0.5, 0.5, 0.5], "std": ')
    args = [*_args(csv_file, image_dir), f"data.stats_file={root / 'data_stats.json'}"]
    return args, r"data_stats\.json: not valid JSON .*delete it to compute them again"


def _args(csv_file: Path, image_dir: Path) -> list[str]:
    return [f"data.csv_file={csv_file}", f"data.image_dir={image_dir}"]


CLI_CASES = {
    "path_escape": _case_escape,
    "bomb_first_image": _case_bomb_first,
    "bomb_in_worker": _case_bomb_in_worker,
    "truncated_in_worker": _case_truncated_in_worker,
    "latin1_csv": _case_latin1,
    "huge_label": _case_huge_label,
    "corrupt_stats": _case_corrupt_stats,
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_hostile_data_through_the_cli_is_one_line_exit_2(tmp_path, case):
    args, said = CLI_CASES[case](tmp_path / "data")
    res = run_inproc(
        *("-m", "experiments.train", "data=image_csv", "logger=none", "trainer.max_epochs=1"),
        *("data.val_fraction=0.25", "data.test_fraction=0.25", *args),
        cwd=tmp_path,
    )
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stderr + res.stdout, res.stderr[-3000:]
    assert lines[-1].startswith("error: ") and re.search(said, lines[-1]), lines[-1]


# ---- the model card escapes what it is given


def test_model_card_escapes_class_names_file_names_and_the_command(tmp_path):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    evil = ["<script>alert(1)</script>", "| x |", "a`b", "[c](javascript:alert(1))", "l\nm"]
    counts = {
        "train": {name: 3 for name in evil},
        "test": {name: 1 for name in evil},
    }
    (run / ".hydra" / "config.yaml").write_text(
        "data:\n  csv_file: '<img src=x onerror=alert(1)>`|.csv'\n  image_dir: ${paths.x}\n"
        "paths:\n  x: /imgs/<b>\nmodel:\n  net:\n    _target_: '${oc.env:HOME}'\n"
    )
    metrics = {"test/acc": 0.5, "test/macro_f1": "not a number"}
    for name in evil:
        metrics[f"test/recall/{name}"] = 0.25
        metrics[f"test/precision/{name}"] = 0.75
    (run / "metrics.json").write_text(json.dumps(metrics))
    (run / "env.json").write_text(json.dumps({"command": ["train.py", "data.x=`rm -rf`<i>"]}))
    (run / "export.json").write_text(json.dumps({"<u>onnx": {"file": "m`.onnx", "batch": 2.5}}))
    text = write_model_card(run, counts).read_text()
    # a code span shows its content as text (CommonMark): the file name and command stay
    # readable there; outside code spans no raw HTML and no link may remain
    outside_code = re.sub(r"(`+)(.+?)\1", "", text)
    for raw in ("<", "[c](javascript"):
        assert raw not in outside_code, raw
    assert str(Path.home()) not in text  # a resolver in the saved config is not run
    tables = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert len(tables) > 12
    for line in tables:  # every row of a table has as many cells as its header
        assert len(re.findall(r"(?<!\\)\|", line)) == 4, line
    assert "| \\| x \\| | 3 | 1 |" in text
    assert "| &lt;script&gt;alert(1)&lt;/script&gt; | 0.7500 | 0.2500 |" in text
    assert "``python -m experiments.train data.x=`rm -rf`<i>``" in text
    assert "`/imgs/<b>`" in text  # followed a plain ${paths.x}; inside a code span


def test_model_card_refuses_a_corrupt_counts_file_or_config_in_one_line(tmp_path):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "data_counts.json").write_text('{"train": {"a": "many"}}')
    with pytest.raises(UserError, match=r"data_counts\.json: expected \{split"):
        write_model_card(run)
    (run / "data_counts.json").unlink()
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    (run / ".hydra" / "config.yaml").write_text(bomb)
    with pytest.raises(UserError, match=r"config\.yaml: its aliases expand"):
        write_model_card(run)


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ({"bogus": 1}, "data.bogus: experiments.data.ImageDataModule has no"),
        (  # a source's class with a key of another source's
            {"_target_": "experiments.data.DigitsData", "dataset": None, "csv_file": "x.csv"},
            "data.csv_file: experiments.data.DigitsData has no argument 'csv_file'",
        ),
    ],
)
def test_a_saved_data_key_its_source_does_not_take_is_refused(tmp_path, data_dir, edit, named):
    run = tmp_path / "run"
    shutil.copytree(REPO / "tests" / "data" / "run_2026_12_04_mlp", run)
    path = run / ".hydra" / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["data"].update(edit)
    path.write_text(yaml.safe_dump(cfg))
    res = run_inproc("-m", "experiments.eval", f"run_dir={run}", f"paths.data_dir={data_dir}",
                     cwd=tmp_path)  # fmt: skip
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1 and named in lines[0], res.stderr[-2000:]
    assert not (run / "eval_metrics.json").exists()
