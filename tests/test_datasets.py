"""CsvImageDataset, the digits export, the one-hot target transform, torchvision formats."""

from __future__ import annotations

import multiprocessing as mp
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from experiments.data import CsvData, CsvImageDataset, OneHot, TorchvisionData, export_digits
from experiments.errors import UserError
from tests.helpers import write_cifar10, write_image_folder, write_mnist

TO_TENSOR = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])


def test_init_opens_no_image(tmp_path):
    csv_file, image_dir = write_image_folder(tmp_path, n=6)
    for png in image_dir.iterdir():  # any decode in __init__ would now fail
        png.write_bytes(b"not a png")
    ds = CsvImageDataset(csv_file, image_dir)
    assert len(ds) == 6 and ds.classes == ["cat", "dog"]
    with pytest.raises(UserError, match=r"row 2: cannot read image .*img_000\.png"):
        ds[0]


def test_string_labels_and_stable_class_order(tmp_path):
    csv_file, image_dir = write_image_folder(tmp_path, n=9, classes=("zebra", "ant", "mole"))
    ds = CsvImageDataset(csv_file, image_dir, transform=TO_TENSOR)
    assert ds.classes == ["ant", "mole", "zebra"]  # sorted, not first-seen
    image, target = ds[0]
    assert ds.classes[target] == "zebra"
    assert image.shape == (3, 12, 10) and image.dtype == torch.float32
    gray = CsvImageDataset(
        csv_file, image_dir, transform=TO_TENSOR, image_mode="L", image_size=(6, 5)
    )
    assert gray[0][0].shape == (1, 6, 5)


def test_missing_image_names_row_and_file(tmp_path):
    csv_file, image_dir = write_image_folder(tmp_path, n=5)
    (image_dir / "img_003.png").unlink()
    with pytest.raises(UserError, match=r"labels\.csv row 5: image .*img_003\.png does not exist"):
        CsvImageDataset(csv_file, image_dir)


def test_bad_csv_header_and_missing_paths(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("file,class\na.png,1\n")
    with pytest.raises(UserError, match="'filename' and 'label'"):
        CsvImageDataset(bad, tmp_path)
    with pytest.raises(UserError, match="CSV file not found: .*nope.csv"):
        CsvImageDataset(tmp_path / "nope.csv", tmp_path)
    with pytest.raises(UserError, match="image folder not found"):
        CsvImageDataset(bad, tmp_path / "nope")


def test_unseen_test_label_is_an_error(tmp_path):
    csv_file, image_dir = write_image_folder(tmp_path, n=6)
    test_csv = tmp_path / "test.csv"
    test_csv.write_text("filename,label\nimg_000.png,cat\nimg_001.png,horse\n")
    dm = CsvData(
        csv_file=str(csv_file),
        image_dir=str(image_dir),
        test_csv_file=str(test_csv),
        eval_transform=TO_TENSOR,
    )
    with pytest.raises(UserError, match=r"test\.csv row 3: label 'horse' was not seen"):
        dm.setup()


def test_one_hot():
    hot = OneHot(4)
    assert torch.equal(hot(2), torch.tensor([0.0, 0.0, 1.0, 0.0]))
    assert pickle.loads(pickle.dumps(hot))(0)[0] == 1.0  # DataLoader workers pickle it


def test_one_hot_through_a_dataset(tmp_path):
    csv_file, image_dir = write_image_folder(tmp_path, n=4, classes=("a", "b", "c"))
    ds = CsvImageDataset(csv_file, image_dir, target_transform=OneHot(3))
    assert [ds[i][1].argmax().item() for i in range(4)] == [0, 1, 2, 0]


def test_cache_keeps_decoded_images(tmp_path):
    csv_file, image_dir = write_image_folder(tmp_path, n=3)
    ds = CsvImageDataset(csv_file, image_dir, cache=True)
    first = ds.load_image(1)
    (image_dir / "img_001.png").unlink()
    assert ds.load_image(1) is first


def _export(root):
    export_digits(root)


def test_digits_export_is_complete_idempotent_and_race_safe(tmp_path):
    root = tmp_path / "digits"
    ctx = mp.get_context("fork")  # the export runs no torch ops: fork is safe and quick
    procs = [ctx.Process(target=_export, args=(root,)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    ds = CsvImageDataset(root / "labels.csv", root / "images", image_mode="L")
    assert len(ds) == 1797 and ds.classes == [str(i) for i in range(10)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits"]  # no temp dirs left
    stamp = (root / "labels.csv").stat().st_mtime_ns
    export_digits(root)
    assert (root / "labels.csv").stat().st_mtime_ns == stamp
    from sklearn.datasets import load_digits

    pixels = np.asarray(ds.load_image(5), dtype=np.float64) * 16 / 255
    np.testing.assert_allclose(pixels, load_digits().images[5], atol=0.04)


# --- torchvision datasets in their own on-disk formats (nothing downloads) ---------------


@pytest.mark.parametrize(
    ("name", "folder", "shape"),
    [
        ("mnist", "MNIST", (1, 28, 28)),
        ("fashion_mnist", "FashionMNIST", (1, 28, 28)),
        ("cifar10", None, (3, 32, 32)),
    ],
)
def test_torchvision_sets_from_disk(tmp_path, name, folder, shape):
    if name == "cifar10":
        write_cifar10(tmp_path)
        n_train, n_test = 50, 10
    else:
        write_mnist(tmp_path, folder)
        n_train, n_test = 60, 20
    dm = TorchvisionData(
        dataset=name,
        root=str(tmp_path),
        eval_transform=TO_TENSOR,
        train_transform=TO_TENSOR,
        batch_size=8,
    )
    dm.prepare_data()
    dm.setup()
    assert dm.input_shape == shape and dm.num_classes == 10
    assert len(dm.train_set) + len(dm.val_set) == n_train and len(dm.test_set) == n_test
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (8, *shape) and y.dtype == torch.int64


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist", "cifar10"])
def test_torchvision_missing_files_say_where(tmp_path, name):
    dm = TorchvisionData(dataset=name, root=str(tmp_path), download=False)
    with pytest.raises(UserError, match=f"{name} not found: looked in {tmp_path}.*download=true"):
        dm.setup()


def test_splits_are_seeded_and_disjoint(tmp_path):
    csv_file, image_dir = write_image_folder(tmp_path, n=40)

    def split(seed):
        dm = CsvData(
            csv_file=str(csv_file),
            image_dir=str(image_dir),
            eval_transform=TO_TENSOR,
            split_seed=seed,
        )
        dm.setup()
        return [list(s.indices) for s in (dm.train_set, dm.val_set, dm.test_set)]

    a, b, c = split(0), split(0), split(1)
    assert a == b and a != c
    assert sorted(a[0] + a[1] + a[2]) == list(range(40))
    assert (len(a[1]), len(a[2])) == (4, 4)


# --- the cache of transformed samples ---------------------------------------------------


def test_sample_cache_returns_the_same_tensors_without_reading_again(tmp_path):
    csv_file, image_dir = write_image_folder(tmp_path, n=4)
    plain = CsvImageDataset(csv_file, image_dir, transform=TO_TENSOR)
    ds = CsvImageDataset(csv_file, image_dir, transform=TO_TENSOR, cache_samples=True)
    bounded = CsvImageDataset(
        csv_file, image_dir, transform=TO_TENSOR, cache_samples=True, cache_max_mb=0
    )
    first = ds[2]
    assert torch.equal(first[0], plain[2][0]) and first[1] == plain[2][1]
    (image_dir / "img_002.png").unlink()
    assert ds[2][0] is first[0]  # served from memory: no decode, no transform
    with pytest.raises(UserError, match="cannot read image"):
        plain[2]
    bounded[0]
    assert not bounded._samples  # over the memory bound: nothing kept


def test_only_deterministic_transforms_count_as_cacheable():
    from experiments.data.transforms import is_deterministic

    norm = v2.Normalize([0.5], [0.5])
    assert is_deterministic(None) and is_deterministic(OneHot(3))
    assert is_deterministic(v2.Compose([*TO_TENSOR.transforms, norm, v2.Resize(8)]))
    assert not is_deterministic(v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip()]))
    assert not is_deterministic(v2.RandomCrop(4))
    assert not is_deterministic(lambda x: x)  # unknown: assumed random


@pytest.mark.parametrize(
    ("setting", "train_cached", "eval_cached"),
    [("auto", False, True), (True, True, True), (False, False, False)],
)
def test_datamodule_caches_only_deterministic_splits(tmp_path, setting, train_cached, eval_cached):
    csv_file, image_dir = write_image_folder(tmp_path, n=20)
    flip = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32)])
    dm = CsvData(
        csv_file=str(csv_file),
        image_dir=str(image_dir),
        train_transform=flip,
        eval_transform=TO_TENSOR,
        cache_transformed=setting,
    )
    dm.setup()
    assert dm.train_set.dataset.cache_samples is train_cached
    assert dm.val_set.dataset.cache_samples is eval_cached
    batches = [x for x, _ in dm.val_dataloader()] + [x for x, _ in dm.val_dataloader()]
    assert torch.equal(batches[0], batches[-1])  # second pass (cached or not) is identical


def test_bad_cache_setting_names_the_key(make_cfg):
    from experiments.config import schema

    expected = "data.cache_transformed='yes' is not valid: expected auto, true or false"
    with pytest.raises(UserError, match=expected):
        schema.check(make_cfg("data.cache_transformed=yes"))


@pytest.mark.parametrize(
    ("option", "key", "target"),
    [
        ("digits", "+data.csv_file=x.csv", "DigitsData"),
        ("mnist", "+data.cache=true", "TorchvisionData"),
        ("image_csv", "+data.download=true", "CsvData"),
        ("cifar10", "+data.test_csv_file=t.csv", "TorchvisionData"),
    ],
)
def test_a_key_the_chosen_source_does_not_take_is_an_unknown_key(make_cfg, option, key, target):
    # one class held every source's keys, so data=digits took data.csv_file and ignored it
    from experiments.config import schema

    name = key.lstrip("+").split("=")[0]
    own = ["data.csv_file=a.csv", "data.image_dir=."] if option == "image_csv" else []
    cfg = make_cfg(f"data={option}", key, *own)
    with pytest.raises(UserError, match=f"^{name}: experiments.data.{target} has no argument"):
        schema.check(cfg)


def test_a_run_saved_with_the_flat_class_builds_its_source_class(tmp_path):
    # run folders before the split name experiments.data.ImageDataModule with every key
    from experiments.data import DigitsData, ImageDataModule

    csv_file, image_dir = write_image_folder(tmp_path, n=6)
    old = dict(root=str(tmp_path), download=False, cache=True, batch_size=8, split="random")
    dm = ImageDataModule("mnist", **old)
    assert type(dm) is TorchvisionData and dm.dataset == "mnist" and dm.batch_size == 8
    dm = ImageDataModule("image_csv", csv_file=str(csv_file), image_dir=str(image_dir), **old)
    assert type(dm) is CsvData and dm.cache is True and not hasattr(dm, "download")
    dm = ImageDataModule("digits", **old)
    assert type(dm) is DigitsData and dm.root == str(tmp_path) and dm.dataset is None
    with pytest.raises(UserError, match="data.bogus: experiments.data.ImageDataModule has no"):
        ImageDataModule("digits", bogus=1)
    with pytest.raises(UserError, match="data.dataset='cifar100' is not valid"):
        ImageDataModule("cifar100")


def test_the_data_options_share_one_base():
    """Every option of an image classifier's data (an ImageData class) builds on the base;
    the other tasks' data (TabularData, ShapesData) stand alone."""
    from experiments.config import CONF_DIR

    folder = Path(CONF_DIR) / "data"
    options = sorted(p for p in folder.glob("*.yaml") if not p.name.startswith("_"))
    other_tasks = ("experiments.data.tabular.", "experiments.data.shapes.")
    options = [p for p in options if not any(t in p.read_text() for t in other_tasks)]
    assert len(options) >= 5
    for path in options:
        text = path.read_text()
        assert "_image" in text or "_torchvision" in text, path
        assert "batch_size" not in text, path  # a shared key lives in the base only
    for name in ("mnist", "fashion_mnist", "cifar10"):
        assert len((folder / f"{name}.yaml").read_text().splitlines()) <= 10
