"""predict builds from ``SavedRun``: an image file becomes the very tensor the run's own
test data makes of it (the dataset's reader, the eval transform, the run's statistics)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from experiments.data.datasets import CsvImageDataset
from experiments.errors import UserError
from experiments.evaluation.saved_run import SavedRun


def test_an_image_reads_as_the_runs_test_data_reads_it(trained_run):
    run = SavedRun(trained_run)
    dm = run.datamodule
    dataset, indices = dm.test_set.dataset, dm.test_set.indices[:5]
    assert isinstance(dataset, CsvImageDataset) and len(indices) == 5
    read = run.image_reader(dm.input_shape)
    for i in indices:
        x, _ = dataset[i]
        assert torch.equal(read(dataset.path(i)), x)  # bit for bit, before normalization


@pytest.mark.parametrize("stats", [[], ["data.mean=[0.3]", "data.std=[0.2]"]])
def test_a_batch_is_normalized_as_the_data_module_normalizes_it(trained_run, stats):
    run = SavedRun(trained_run, overrides=stats)
    dm = run.datamodule
    dataset, indices = dm.test_set.dataset, dm.test_set.indices[:5]
    batch = torch.stack([run.image_reader(dm.input_shape)(dataset.path(i)) for i in indices])
    assert run.input_stats == run.normalization()  # (B, C, H, W) = (5, 1, 8, 8) below
    y = torch.zeros(len(indices), dtype=torch.long)
    assert torch.equal(run.normalize(batch), dm.on_after_batch_transfer((batch, y), 0)[0])
    assert (run.input_stats is None) == (not stats)


def test_a_16_bit_image_of_another_size_reads_as_the_dataset_reads_it(trained_run, tmp_path):
    # 16-bit grayscale, twice the digits' size: scaled to 8 bits (not clipped) and resized
    pixels = np.linspace(0, 65535, 16 * 16).reshape(16, 16).astype(np.uint16)
    Image.fromarray(pixels).save(tmp_path / "big.png")
    (tmp_path / "one.csv").write_text("filename,label\nbig.png,a\nbig2.png,b\n")
    Image.fromarray(pixels).save(tmp_path / "big2.png")
    run = SavedRun(trained_run)
    transform = run.transform("eval_transform")
    dataset = CsvImageDataset(
        tmp_path / "one.csv", tmp_path, transform, image_mode="L", image_size=(8, 8)
    )
    x = run.image_reader((1, 8, 8))(tmp_path / "big.png")
    assert torch.equal(x, dataset[0][0]) and x.max() > 0.9  # not all but white


def test_a_broken_image_is_one_line_naming_it(trained_run, tmp_path):
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    with pytest.raises(UserError, match="broken.png"):
        SavedRun(trained_run).image_reader((1, 8, 8))(tmp_path / "broken.png")
