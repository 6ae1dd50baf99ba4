"""The one LightningDataModule: builds a dataset from config, makes seeded
train/val/test splits with separate train/eval transforms, and serves DataLoaders."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from experiments.data import sources
from experiments.data.datasets import CsvImageDataset, peek_image
from experiments.data.loaders import ResumableLoader
from experiments.data.samplers import EpochShuffleSampler
from experiments.data.transforms import is_deterministic
from experiments.errors import UserError

log = logging.getLogger(__name__)

BUNDLED = ("digits", "image_csv", *sources.TORCHVISION)


class ImageDataModule(L.LightningDataModule):
    """Image classification data: bundled sets, a CSV-indexed folder, or your own Dataset.

    Args:
        dataset: ``digits`` | ``image_csv`` | ``mnist`` | ``fashion_mnist`` | ``cifar10``,
            or a callable ``(transform, target_transform) -> (train, test_or_None)``
            (a ``_partial_`` in config) for a Dataset of your own.
        root: folder of the torchvision datasets (or of the digits export).
        download: let torchvision download missing files (needs network).
        csv_file: ``image_csv``: the CSV index (``filename,label``).
        image_dir: ``image_csv``: folder the CSV's file names are relative to.
        test_csv_file: ``image_csv``: optional separate test CSV; else test is carved out.
        image_mode: ``L`` or ``RGB`` for CSV images; None detects it from the first image.
        image_size: ``[height, width]`` to resize CSV images to; None takes the first
            image's size (so a folder of mixed sizes still batches).
        train_transform: applied to training samples (augmentations go here).
        eval_transform: applied to val/test samples.
        target_transform: applied to class indices of every split.
        val_fraction: share of the training set held out for validation.
        test_fraction: share held out for test when the source has no test split.
        batch_size: per-device batch size of every loader.
        num_workers: DataLoader worker processes.
        pin_memory: pin host memory for faster host-to-GPU copies.
        persistent_workers: keep workers alive across epochs (only with num_workers > 0).
        split_seed: seed of the train/val/test split, fixed apart from ``seed`` so that
            runs with different seeds are scored on the same held-out images.
        cache: keep decoded CSV images in memory after their first use.
        cache_transformed: keep transformed CSV samples in memory after their first use,
            so later epochs skip decoding and transforms: ``auto`` does it for each split
            whose transforms are deterministic (never for random augmentation), ``true``
            for every split (you vouch the transforms are deterministic), ``false`` never.
        cache_max_mb: memory bound of that cache per split (and per worker process);
            samples beyond it are decoded and transformed on every use.
    """

    def __init__(
        self,
        dataset: str | Callable = "digits",
        root: str = "data",
        download: bool = False,
        csv_file: str | None = None,
        image_dir: str | None = None,
        test_csv_file: str | None = None,
        image_mode: str | None = None,
        image_size: Sequence[int] | None = None,
        train_transform: Callable | None = None,
        eval_transform: Callable | None = None,
        target_transform: Callable | None = None,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        split_seed: int = 0,
        cache: bool = False,
        cache_transformed: bool | str = "auto",
        cache_max_mb: float = 1024.0,
    ) -> None:
        super().__init__()
        if isinstance(dataset, str) and dataset not in BUNDLED:
            raise UserError(f"data.dataset={dataset!r} is not valid; use one of {BUNDLED}")
        if dataset == "image_csv" and not (csv_file and image_dir):
            raise UserError("data=image_csv needs data.csv_file=<csv> and data.image_dir=<folder>")
        if int(batch_size) < 1:
            raise UserError(f"data.batch_size must be >= 1, got {batch_size}")
        if int(num_workers) < 0:
            raise UserError(f"data.num_workers must be >= 0, got {num_workers}")
        if cache_transformed not in (True, False, "auto"):
            raise UserError(
                f"data.cache_transformed={cache_transformed!r} is not valid; "
                "use auto, true or false"
            )
        if float(cache_max_mb) < 0:
            raise UserError(f"data.cache_max_mb must be >= 0, got {cache_max_mb}")
        for key, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0.0 <= float(value) < 1.0:
                raise UserError(f"data.{key} must be in [0, 1), got {value}")
        self.dataset = dataset
        self.root = root
        self.download = download
        self.csv_file = csv_file
        self.image_dir = image_dir
        self.test_csv_file = test_csv_file
        self.image_mode = image_mode
        self.image_size = tuple(image_size) if image_size else None
        self.train_transform = train_transform
        self.eval_transform = eval_transform
        self.target_transform = target_transform
        self.val_fraction = float(val_fraction)
        self.test_fraction = float(test_fraction)
        self.batch_size = int(batch_size)
        self.num_workers = int(num_workers)
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.split_seed = split_seed
        self.cache = cache
        self.cache_transformed = cache_transformed
        self.cache_max_mb = float(cache_max_mb)
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self.class_names: list[str] = []

    def prepare_data(self) -> None:
        if self.dataset == "digits":
            sources.export_digits(self.root)
        elif self.dataset in sources.TORCHVISION and self.download:
            sources.torchvision_sets(self.dataset, self.root, True, None)

    def _build(self, transform: Callable | None) -> tuple[Dataset, Dataset | None]:
        if callable(self.dataset):
            return self.dataset(transform=transform, target_transform=self.target_transform)
        if self.dataset in sources.TORCHVISION:
            return sources.torchvision_sets(
                self.dataset, self.root, self.download, transform, self.target_transform
            )
        if self.dataset == "digits":
            csv_file, image_dir = sources.digits_root(self.root)
            mode, size = "L", self.image_size
        else:
            csv_file, image_dir = self.csv_file, self.image_dir
            mode, size = self.image_mode, self.image_size
            if mode is None or size is None:
                probe = CsvImageDataset(csv_file, image_dir, check_files=False)
                first_mode, first_size = peek_image(Path(image_dir) / probe.files[0])
                mode, size = mode or first_mode, size or first_size
        return sources.csv_sets(
            csv_file,
            image_dir,
            self.test_csv_file,
            mode,
            size,
            self.cache,
            transform,
            self.target_transform,
            cache_samples=self._cache_samples(transform),
            cache_max_mb=self.cache_max_mb,
        )

    def _cache_samples(self, transform: Callable | None) -> bool:
        if self.cache_transformed == "auto":
            return is_deterministic(transform) and is_deterministic(self.target_transform)
        return bool(self.cache_transformed)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:  # train.py sets up early to hand shapes to the model
            return
        full_train, own_test = self._build(self.train_transform)
        full_eval, own_test_eval = self._build(self.eval_transform)
        n = len(full_train)
        n_test = 0 if own_test is not None else round(n * self.test_fraction)
        n_val = round(n * self.val_fraction)
        if n - n_val - n_test < 1 or n_val < 1:
            raise UserError(
                f"{n} samples are too few for data.val_fraction={self.val_fraction} and "
                f"data.test_fraction={self.test_fraction}"
            )
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.split_seed))
        order = order.tolist()
        test_idx, val_idx = order[:n_test], order[n_test : n_test + n_val]
        self.train_set = Subset(full_train, order[n_test + n_val :])
        self.val_set = Subset(full_eval, val_idx)
        self.test_set = own_test_eval if own_test_eval is not None else Subset(full_eval, test_idx)
        classes = getattr(full_train, "classes", None)
        if classes is None:
            targets = getattr(full_train, "targets", None)
            if targets is None:
                raise UserError("a custom dataset must have .classes or .targets for num_classes")
            classes = [str(i) for i in range(int(max(targets)) + 1)]
        self.class_names = [str(c) for c in classes]
        log.info(
            "data %s: %d train / %d val / %d test samples, %d classes, input %s",
            self.dataset if isinstance(self.dataset, str) else "custom",
            len(self.train_set),
            len(self.val_set),
            len(self.test_set),
            self.num_classes,
            self.input_shape,
        )

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one transformed eval sample, e.g. ``(C, H, W)``."""
        sample = self.val_set[0][0]
        return tuple(sample.shape)

    def _loader(self, dataset: Dataset, shuffle: bool) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers and self.num_workers > 0,
        )

    def _train_position(self) -> tuple[int, int]:
        """``(epoch, batches of it trained on)``; 0 batches at an epoch's end."""
        trainer = self.trainer
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        if done >= trainer.num_training_batches:
            done = 0
        return trainer.current_epoch, int(done)

    def train_dataloader(self) -> DataLoader:
        # The shuffle order is a function of (seed, epoch), not of when Lightning happens to
        # start the iterator, so a resumed run sees the same batches as an uninterrupted one.
        # torch.initial_seed() is `seed` after seed_everything (random when unseeded).
        trainer = getattr(self, "trainer", None)
        # the index of the epoch about to run; unlike trainer.current_epoch it is already
        # advanced when a run resumes from an end-of-epoch checkpoint (workers draw the
        # order as soon as the loader is iterated, before Lightning calls set_epoch)
        epoch = trainer.fit_loop.epoch_progress.current.processed if trainer is not None else 0
        generator = torch.Generator()  # seeds the workers; re-seeded per epoch by the sampler
        sampler = EpochShuffleSampler(len(self.train_set), torch.initial_seed(), generator)
        sampler.set_epoch(epoch)
        return ResumableLoader(
            self.train_set,
            batch_size=self.batch_size,
            sampler=sampler,
            generator=generator,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers and self.num_workers > 0,
            position=self._train_position if trainer is not None else None,
        )

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)
