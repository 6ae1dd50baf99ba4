"""The one LightningDataModule: builds a dataset from config, makes seeded
train/val/test splits with separate train/eval transforms, and serves DataLoaders."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Annotated, Literal

import lightning as L
from torch.utils.data import DataLoader, Dataset, Subset

from experiments.config.hints import Ge, Le, Length, Lt, Why
from experiments.data import sources, store
from experiments.data.loaders import loader
from experiments.data.sources import DatasetName
from experiments.data.splits import split_indices, warn_absent_classes
from experiments.data.stats import normalize, resolve_stats
from experiments.data.transforms import batch_mixer, compose, is_deterministic
from experiments.errors import UserError

log = logging.getLogger(__name__)


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
        train_transform: applied to training samples (after ``augment``).
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
        split: ``stratified`` (each class split on its own, every class with enough
            samples in every split) or ``random``; stratified needs ``.targets``.
        augment: random augmentation applied to training samples only, before
            ``train_transform`` (the ``augment=`` presets); None for none.
        mean: per-channel means to normalize batches with (on the device, after
            transfer), ``auto`` to compute them once from the training split, or None.
        std: per-channel standard deviations, ``auto``, or None (as ``mean``).
        stats_file: where ``auto`` statistics are recorded, and read back by resume,
            eval and predict (the run dir's ``data_stats.json``).
        mixup_alpha: > 0 mixes training batches (MixUp, Beta(alpha, alpha)).
        cutmix_alpha: > 0 pastes patches across training batches (CutMix); with both,
            each batch gets one of the two at random.
        sampler: ``shuffle`` (each training sample once per epoch) or ``balanced`` (as
            many draws per epoch, with replacement, each class equally likely).
        folds: k-fold cross-validation (``cv.folds=K`` sets it): the number of folds of
            the non-test samples; None: validate on ``val_fraction``.
        fold: which of the ``folds`` folds is validated on.
        tensor_store: ``auto``: a split whose samples can all be cached (see
            ``cache_transformed``) is stacked into one tensor and batches are cut from it
            by index, with shift/flip augmentation applied per batch; ``false``: never.
        device_resident: ``auto``: those tensors live on the accelerator when they take
            at most a quarter of its free memory; ``true``: always; ``false``: never.
        follow_symlinks: ``image_csv``: read files through symlinks that resolve outside
            ``image_dir`` (refused by default, naming the CSV row; file names that are
            absolute or climb out with ``..`` are always refused).
    """

    def __init__(
        self,
        dataset: DatasetName | Callable = "digits",
        root: str = "data",
        download: bool = False,
        csv_file: str | None = None,
        image_dir: str | None = None,
        test_csv_file: str | None = None,
        image_mode: str | None = None,
        image_size: Annotated[
            Sequence[Annotated[int, Ge(1), Le(4096)]],
            Length(2),
            Why("each image is resized to it in memory (4096x4096 RGB is 200 MB as float32)"),
        ]
        | None = None,
        train_transform: Callable | None = None,
        eval_transform: Callable | None = None,
        target_transform: Callable | None = None,
        val_fraction: Annotated[float, Ge(0), Lt(1)] = 0.1,
        test_fraction: Annotated[float, Ge(0), Lt(1)] = 0.1,
        batch_size: Annotated[int, Ge(1)] = 64,
        num_workers: Annotated[int, Ge(0)] = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        split_seed: int = 0,
        cache: bool = False,
        cache_transformed: Literal["auto"] | bool = "auto",
        cache_max_mb: Annotated[float, Ge(0)] = 1024.0,
        split: Literal["stratified", "random"] = "random",
        augment: Callable | None = None,
        mean: Sequence[float] | str | None = None,
        std: Sequence[float] | str | None = None,
        stats_file: str | None = None,
        mixup_alpha: Annotated[float, Ge(0)] = 0.0,
        cutmix_alpha: Annotated[float, Ge(0)] = 0.0,
        sampler: Literal["shuffle", "balanced"] = "shuffle",
        folds: Annotated[int, Ge(2)] | None = None,
        fold: Annotated[int, Ge(0)] = 0,
        tensor_store: Literal["auto"] | bool = "auto",
        device_resident: Literal["auto"] | bool = "auto",
        follow_symlinks: bool = False,
    ) -> None:
        super().__init__()
        if dataset == "image_csv" and not (csv_file and image_dir):
            raise UserError("data=image_csv needs data.csv_file=<csv> and data.image_dir=<folder>")
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
        self.split = split
        self.augment = augment
        self.mean, self.std, self.stats_file = mean, std, stats_file
        self.mixup_alpha, self.cutmix_alpha = float(mixup_alpha), float(cutmix_alpha)
        self.sampler = sampler
        self.folds, self.fold = folds, fold
        self.tensor_store, self.device_resident = tensor_store, device_resident
        self.follow_symlinks = bool(follow_symlinks)
        # set by store.plan at setup, read by the loaders: split -> TensorStore (the
        # batch-level path), and that path's augmentation, run per batch on the device
        self.stores: dict = {}
        self.augment_batch: Callable | None = None
        self.stats: tuple[list[float], list[float]] | None = None
        self._mix: Callable | None = None
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
        folder = (None, None) if self.dataset == "digits" else (self.csv_file, self.image_dir)
        return sources.image_folder_sets(
            *folder,
            root=self.root,
            test_csv_file=self.test_csv_file,
            image_mode=self.image_mode,
            image_size=self.image_size,
            cache=self.cache,
            transform=transform,
            target_transform=self.target_transform,
            cache_samples=self.cache_samples(transform),
            cache_max_mb=self.cache_max_mb,
            follow_symlinks=self.follow_symlinks,
        )

    def cache_samples(self, transform: Callable | None) -> bool:
        """Whether samples made with ``transform`` may be kept once made (the loader and
        the tensor store ask too): ``data.cache_transformed``, ``auto`` when nothing in the
        transforms is random."""
        if self.cache_transformed == "auto":
            return is_deterministic(transform) and is_deterministic(self.target_transform)
        return bool(self.cache_transformed)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:  # training sets up early to hand shapes to the model
            return
        train_transform = self.train_transform
        if self.augment is not None:  # random augmentation of training samples only
            train_transform = compose(self.augment, self.train_transform)
        full_train, own_test = self._build(train_transform)
        full_eval, own_test_eval = self._build(self.eval_transform)
        targets = getattr(full_train, "targets", None)
        if self.split == "stratified" and targets is None:
            log.info("data.split=stratified: the dataset has no .targets; splitting at random")
        train_idx, val_idx, test_idx = split_indices(
            len(full_train),
            self.val_fraction,
            0.0 if own_test is not None else self.test_fraction,
            self.split_seed,
            targets=targets if self.split == "stratified" else None,
            fold=(self.fold, self.folds) if self.folds else None,
        )
        self.train_set = Subset(full_train, train_idx)
        self.val_set = Subset(full_eval, val_idx)
        self.test_set = own_test_eval if own_test_eval is not None else Subset(full_eval, test_idx)
        self.stats = resolve_stats(
            self.mean, self.std, self.stats_file, Subset(full_eval, train_idx)
        )
        self.class_names = sources.class_names(full_train)
        for name in ("train", "val", "test"):
            warn_absent_classes(name, getattr(self, f"{name}_set"), self.class_names)
        self.stores, self.augment_batch = store.plan(self, full_eval, train_idx)
        log.info(
            "data %s: %d train / %d val / %d test samples, %d classes, input %s",
            self.dataset if isinstance(self.dataset, str) else "custom",
            len(self.train_set),
            len(self.val_set),
            len(self.test_set),
            self.num_classes,
            self.input_shape,
        )

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        x, y = batch  # (B, C, H, W), (B,) on the model's device
        trainer = getattr(self, "trainer", None)
        if self.augment_batch is not None and trainer is not None and trainer.training:
            x = self.augment_batch(x)  # the batch path's augmentation, before normalizing
        if self.stats is not None:
            x = normalize(x, *self.stats)
        if trainer is not None and trainer.training and (self.mixup_alpha or self.cutmix_alpha):
            if self._mix is None:
                self._mix = batch_mixer(self.mixup_alpha, self.cutmix_alpha, self.num_classes)
            x, y = self._mix(x, y)  # y: (B, num_classes) soft targets
        return x, y

    def train_targets(self, needed_for: str | None = None, hint: str = "") -> list[int] | None:
        """The class index of every training sample; None without ``.targets``, or a
        UserError naming ``needed_for`` (the option that needs them) and ``hint``."""
        subset = self.train_set
        targets = getattr(subset.dataset, "targets", None) if subset is not None else None
        if targets is not None:
            return [int(targets[i]) for i in subset.indices]
        if needed_for is not None:
            raise UserError(
                f"{needed_for} needs the training labels, and this dataset has no .targets{hint}"
            )
        return None

    def use_weights_stats(self, mean: list[float], std: list[float]) -> None:
        """Normalize with pretrained weights' statistics when ``mean``/``std`` are ``auto``
        (recorded in ``stats_file``, so resume, eval and predict read them back)."""
        if self.mean != "auto" or self.stats_file is None:
            return
        from experiments.runs.files import write_json

        self.stats = (list(mean), list(std))
        write_json(self.stats_file, {"mean": mean, "std": std, "computed_from": "weights"})
        log.info("data.mean/std=auto: the pretrained weights' statistics %s / %s", mean, std)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one transformed eval sample, e.g. ``(C, H, W)``."""
        sample = self.val_set[0][0]
        return tuple(sample.shape)

    def train_dataloader(self) -> DataLoader:
        return loader(self, "train")

    def val_dataloader(self) -> DataLoader:
        return loader(self, "val")

    def test_dataloader(self) -> DataLoader:
        return loader(self, "test")
