"""The torchvision sources' Datasets, CIFAR-10's pickles read as data, and the class names
of any Dataset."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset
from torchvision import datasets as tvd

from experiments.data import safe_pickle
from experiments.data.csv_index import MAX_CLASSES
from experiments.errors import UserError


class SafeCIFAR10(tvd.CIFAR10):
    """torchvision's CIFAR-10 with its batch files read as data (``safe_pickle``): torchvision
    reads them with ``pickle.load``, so a crafted ``data_batch_1`` in a shared data folder
    would run code while the data loads. Downloads go through torchvision (its md5 checks);
    local files are only checked to be there (torchvision md5-reads all seven, ~170 MB, at
    every start); anything in them but arrays, lists and strings is refused in one line."""

    def __init__(
        self,
        root: str,
        train: bool = True,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        download: bool = False,
    ) -> None:
        tvd.VisionDataset.__init__(
            self, root, transform=transform, target_transform=target_transform
        )
        self.train = train
        if download:
            self.download()
        base = Path(self.root) / self.base_folder
        if not all((base / name).is_file() for name, _ in self.train_list + self.test_list):
            raise RuntimeError("Dataset not found")
        data, targets = [], []
        for name, _ in self.train_list if train else self.test_list:
            entry = safe_pickle.load(base / name)
            if not isinstance(entry, dict) or "data" not in entry or "labels" not in entry:
                raise UserError(f"{base / name}: not a CIFAR-10 batch (no data/labels)")
            pixels = np.asarray(entry["data"])
            if pixels.dtype != np.uint8 or pixels.ndim != 2 or pixels.shape[1] != 3 * 32 * 32:
                raise UserError(f"{base / name}: data is not N x 3072 uint8 pixels")
            data.append(pixels)
            targets.extend(int(t) for t in entry["labels"])
        self.data = np.vstack(data).reshape(-1, 3, 32, 32).transpose((0, 2, 3, 1))  # NHWC
        self.targets = targets
        meta = safe_pickle.load(base / self.meta["filename"])
        if not isinstance(meta, dict) or not isinstance(meta.get(self.meta["key"]), list):
            raise UserError(f"{base / self.meta['filename']}: not CIFAR-10 metadata")
        self.classes = [str(c) for c in meta[self.meta["key"]]]
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}


# MNIST-style sets read raw idx arrays; CIFAR-10's pickles are read as data (SafeCIFAR10)
TORCHVISION = {"mnist": tvd.MNIST, "fashion_mnist": tvd.FashionMNIST, "cifar10": SafeCIFAR10}


def torchvision_sets(
    name: str, root: str, download: bool, transform: Callable | None, target_transform=None
) -> tuple[Dataset, Dataset]:
    """MNIST / FashionMNIST / CIFAR10 train and test sets in torchvision's on-disk layout."""
    cls = TORCHVISION[name]
    options = dict(transform=transform, target_transform=target_transform, download=download)
    try:
        return cls(root, train=True, **options), cls(root, train=False, **options)
    except RuntimeError as err:
        if download:
            raise UserError(f"could not download {name} into {root}: {err}") from None
        folder = Path(root) / (cls.base_folder if name == "cifar10" else f"{cls.__name__}/raw")
        raise UserError(
            f"{name} not found: looked in {folder}. Set data.download=true to fetch it "
            f"(needs network), or copy the files there, or point data.root at them"
        ) from None


def class_names(dataset) -> list[str]:
    """The class names of ``dataset``: its ``.classes``, else ``0..max(.targets)``."""
    classes = getattr(dataset, "classes", None)
    if classes is None:
        targets = getattr(dataset, "targets", None)
        if targets is None:
            raise UserError("a custom dataset must have .classes or .targets for num_classes")
        top = int(max(targets)) if len(targets) else -1
        if not 0 <= top < MAX_CLASSES or int(min(targets)) < 0:
            raise UserError(
                f"the dataset's .targets must be class indices in 0..{MAX_CLASSES - 1}, found "
                f"{int(min(targets))}..{top}"
            )
        classes = [str(i) for i in range(top + 1)]
    return [str(c) for c in classes]
