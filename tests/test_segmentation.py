"""The segmentation task: the seeded shapes generator, masks that do not fit their image,
mIoU and Dice against a hand computation, and a small run through train, eval, predict
(mask PNGs at each image's size) and export (ONNX against PyTorch)."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from PIL import Image

from experiments.data.shapes import SHAPES, ShapesData, generate_shapes
from experiments.errors import UserError
from experiments.models.segmentation import SegmentationModule, segmentation_metrics
from experiments.runs.files import read_json_object
from experiments.runs.layout import RunDir
from tests.helpers import run_inproc


def test_generator_is_seeded_and_masks_match_images():
    images, masks = generate_shapes(12, size=16, seed=3)
    again, masks_again = generate_shapes(12, size=16, seed=3)
    other, _ = generate_shapes(12, size=16, seed=4)
    assert torch.equal(images, again) and torch.equal(masks, masks_again)
    assert not torch.equal(images, other)
    assert images.shape == (12, 1, 16, 16) and masks.shape == (12, 16, 16)
    assert images.dtype == torch.float32 and masks.dtype == torch.int64
    assert 0 <= images.min() and images.max() <= 1
    assert set(masks.unique().tolist()) == set(range(len(SHAPES)))  # every kind drawn
    # a shape is brighter than the background under it (the noise is 0.1, the gap >= 0.2)
    shape, ground = images[:, 0][masks > 0].mean(), images[:, 0][masks == 0].mean()
    assert shape > ground + 0.3
    dm = ShapesData(samples=20, image_size=[16, 16])
    dm.setup()
    assert dm.input_shape == (1, 16, 16) and dm.num_classes == 4
    assert sorted(dm.splits["train"] + dm.splits["val"] + dm.splits["test"]) == list(range(20))
    x, y = dm.train_set[0]
    assert x.shape == (1, 16, 16) and y.shape == (16, 16)


def write_pair(folder, name: str, image_hw, mask_hw, value: int = 1) -> None:
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / "masks").mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full(image_hw, 128, np.uint8)).save(folder / "images" / f"{name}.png")
    Image.fromarray(np.full(mask_hw, value, np.uint8)).save(folder / "masks" / f"{name}.png")


def test_a_mask_whose_size_differs_is_one_line_naming_the_file(tmp_path):
    write_pair(tmp_path, "a", (16, 16), (16, 16))
    write_pair(tmp_path, "b", (16, 16), (12, 16))
    with pytest.raises(UserError, match=r"masks/b.png: mask is 12x16 \(HxW\) but its image b.png"):
        ShapesData(folder=str(tmp_path), image_size=None).setup()
    write_pair(tmp_path, "b", (16, 16), (16, 16), value=7)
    with pytest.raises(UserError, match=r"masks/b.png: class index 7 in the mask"):
        ShapesData(folder=str(tmp_path), image_size=None).setup()
    write_pair(tmp_path, "b", (16, 16), (12, 16))
    res = run_inproc(
        "-m", "experiments.train", "experiment=shapes", f"data.folder={tmp_path}",
        f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr[-2000:]
    (line,) = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: ") and "b.png: mask is 12x16" in line, line


def test_metrics_equal_a_hand_computation():
    target = torch.tensor([[[0, 0, 1], [1, 2, 2]], [[0, 0, 0], [0, 0, 0]]])
    pred = torch.tensor([[[0, 1, 1], [1, 2, 0]], [[2, 0, 0], [0, 0, 0]]])
    # IoU of each (image, class) with a non-empty union: image 0: 1/3, 2/3, 1/2; image 1:
    # class 0 5/6, class 1 absent from both (left out), class 2 predicted only: 0
    miou = (1 / 3 + 2 / 3 + 1 / 2 + 5 / 6 + 0) / 5
    # Dice per image over its classes present, then over images: (0.5, 0.8, 2/3); (10/11, 0)
    dice = ((0.5 + 0.8 + 2 / 3) / 3 + (10 / 11 + 0) / 2) / 2
    metrics = segmentation_metrics(3)
    metrics.update(pred[:1], target[:1])  # two batches: the epoch's value is over both
    metrics.update(pred[1:], target[1:])
    got = metrics.compute()
    assert float(got["miou"]) == pytest.approx(miou, abs=1e-6)
    assert float(got["dice"]) == pytest.approx(dice, abs=1e-6)


def test_shapes_train_eval_predict_and_export(tmp_path):
    run = tmp_path / "run"
    res = run_inproc(
        "-m", "experiments.train", "experiment=shapes", "data.samples=40",
        "data.image_size=[16,16]", "model.width=4", "trainer.max_epochs=2",
        f"hydra.run.dir={run}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    layout = RunDir(run)
    trained = read_json_object(layout.metrics)
    assert {"val/miou", "val/dice", "test/miou", "test/dice"} <= set(trained)
    assert read_json_object(layout.best_json)["monitor"] == "val/miou"
    assert "one class per pixel" in layout.model_card.read_text()

    res = run_inproc("-m", "experiments.eval", str(run), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert read_json_object(layout.eval_metrics)["test/miou"] == pytest.approx(
        trained["test/miou"], abs=1e-6
    )

    images = tmp_path / "new"
    images.mkdir()
    drawn, _ = generate_shapes(2, size=16, seed=9)
    for i, (h, w) in enumerate([(16, 16), (20, 24)]):  # the second is resized and back
        pixels = (drawn[i, 0].numpy() * 255).astype(np.uint8)
        Image.fromarray(pixels).resize((w, h)).save(images / f"img{i}.png")
    res = run_inproc("-m", "experiments.predict", str(run), f"input={images}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    with open(layout.predictions, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["file"] for r in rows] == ["img0.png", "img1.png"]
    for row, size in zip(rows, [(16, 16), (24, 20)], strict=True):  # PIL: (W, H)
        with Image.open(row["mask"]) as mask:
            assert mask.mode == "L" and mask.size == size
            assert np.asarray(mask).max() < len(SHAPES)

    res = run_inproc("-m", "experiments.export", str(run), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    check = read_json_object(layout.export_report)["onnx"]
    assert check["max_abs_diff"] < 1e-3 and check["pixel_agreement"] > 0.999
    assert "logits per pixel" in layout.model_card.read_text()


def test_a_module_built_for_other_classes_is_one_line():
    dm = ShapesData(samples=10, image_size=[16, 16])
    dm.setup()
    module = SegmentationModule(num_classes=3)
    module.trainer = type("T", (), {"datamodule": dm})()  # what setup reads of the trainer
    with pytest.raises(UserError, match=r"model.num_classes=3, but the data has 4 classes"):
        module.setup("fit")


def test_a_segmentation_models_pytorch_net_trains_and_evals(tmp_path):
    pytest.importorskip("segmentation_models_pytorch")  # the [segmentation] extra; dev has it
    run = tmp_path / "run"
    res = run_inproc(
        "-m", "experiments.train", "experiment=shapes", "model=smp_unet", "data.samples=24",
        "data.image_size=[32,32]", "model.arch=Unet", "model.encoder=resnet18",
        "model.smp_options={encoder_depth: 3, decoder_channels: [32, 16, 8]}",
        "trainer.max_epochs=1", f"hydra.run.dir={run}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    layout = RunDir(run)
    trained = read_json_object(layout.metrics)
    assert 0 <= trained["test/miou"] <= 1
    res = run_inproc("-m", "experiments.eval", str(run), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert read_json_object(layout.eval_metrics)["test/miou"] == pytest.approx(
        trained["test/miou"], abs=1e-6
    )


def test_a_net_segmentation_models_pytorch_refuses_is_one_line(tmp_path):
    pytest.importorskip("segmentation_models_pytorch")
    with pytest.raises(UserError, match=r"model.arch=Nope .*refused it .*Wrong architecture"):
        SegmentationModule(arch="Nope")
    with pytest.raises(UserError, match=r"model.encoder=no_such_encoder"):
        SegmentationModule(arch="Unet", encoder="no_such_encoder")
    # FPN on a 3-stage encoder upsamples 4x too far: a mask of another size is refused
    module = SegmentationModule(arch="FPN", smp_options={"encoder_depth": 3})
    dm = ShapesData(samples=10, image_size=[32, 32])
    dm.setup()
    module.trainer = type("T", (), {"datamodule": dm})()
    with pytest.raises(UserError, match=r"images of 32x32 give masks of 128x128"):
        module.setup("fit")
