"""The LightningDataModules. ``ImageData`` composes what every source shares: the
transforms, the seeded split (``splits``), normalization (``stats``), the loaders
(``loaders``) and the tensor store (``store``). Each source family is a small subclass that
adds only its own typed arguments, so its signature is its config: a key the chosen source
does not take is an unknown key, and a new argument is one field in one class."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Literal

import lightning as L
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset
from torchvision.transforms import v2

from experiments.config.hints import Ge, Le, Length, Lt, Why
from experiments.data import sources, store
from experiments.data.datasets import CsvImageDataset, export_digits
from experiments.data.images import peek_image
from experiments.data.loaders import loader
from experiments.data.normalization import normalize, resolve_stats
from experiments.data.splits import split_indices, warn_absent_classes
from experiments.data.transforms import batch_mixer, is_deterministic
from experiments.errors import UserError
from experiments.runs.files import write_json

log = logging.getLogger(__name__)

_config = dataclass(eq=False, repr=False, kw_only=True)
_WHY_SIZE = Why("each image is resized to it in memory (4096x4096 RGB is 200 MB as float32)")
ImageSize = Annotated[Sequence[Annotated[int, Ge(1), Le(4096)]], Length(2), _WHY_SIZE]


@_config
class ImageData(L.LightningDataModule):
    """Image classification data from the source a subclass reads (its ``sets``).

    Args:
        train_transform: applied to training samples (after ``augment``).
        eval_transform: applied to val/test samples.
        target_transform: applied to class indices of every split.
        augment: random augmentation applied to training samples only, before
            ``train_transform`` (the ``augment=`` presets); None for none.
        val_fraction: share of the training set held out for validation.
        test_fraction: share held out for test when the source has no test split.
        split: ``stratified`` (each class split on its own, every class with enough
            samples in every split) or ``random``; stratified needs ``.targets``.
        split_seed: seed of the split, fixed apart from ``seed`` so that runs with
            different seeds are scored on the same held-out images.
        folds: k-fold cross-validation (``cv.folds=K`` sets it): the number of folds of
            the non-test samples; None: validate on ``val_fraction``.
        fold: which of the ``folds`` folds is validated on.
        batch_size: per-device batch size of every loader.
        pin_memory: pin host memory for faster host-to-GPU copies.
        persistent_workers: keep workers alive across epochs (only with num_workers > 0).
        sampler: ``shuffle`` (each training sample once per epoch) or ``balanced`` (as
            many draws per epoch, with replacement, each class equally likely).
        cache_transformed: keep transformed samples once made, so later epochs skip
            decoding and transforms: ``auto`` for each split whose transforms are
            deterministic (never random augmentation), ``true`` for every split (you vouch
            the transforms are deterministic), ``false`` never.
        cache_max_mb: memory bound of that cache, and of a tensor store, per split.
        tensor_store: ``auto``: a split whose samples can all be kept is stacked into one
            tensor and batches are cut from it by index, with shift/flip augmentation
            applied per batch; ``true``: also for a Dataset of your own; ``false``: never.
        device_resident: ``auto``: those tensors live on the accelerator when they take
            at most a quarter of its free memory; ``true``: always; ``false``: never.
        mean: per-channel means to normalize batches with (on the device, after
            transfer), ``auto`` to compute them once from the training split, or None.
        std: per-channel standard deviations, ``auto``, or None (as ``mean``).
        stats_file: where ``auto`` statistics are recorded, and read back by resume,
            eval and predict (the run dir's ``data_stats.json``).
        mixup_alpha: > 0 mixes training batches (MixUp, Beta(alpha, alpha)).
        cutmix_alpha: > 0 pastes patches across training batches (CutMix); with both,
            each batch gets one of the two at random.
        follow_symlinks: read image files through symlinks that resolve outside their
            folder (a CSV source's ``image_dir``; predict's input, for a run of any source).
            Refused by default, naming the CSV row; names that are absolute or climb out
            with ``..`` are always refused.
    """

    train_transform: Callable | None = None
    eval_transform: Callable | None = None
    target_transform: Callable | None = None
    augment: Callable | None = None
    val_fraction: Annotated[float, Ge(0), Lt(1)] = 0.1
    test_fraction: Annotated[float, Ge(0), Lt(1)] = 0.1
    split: Literal["stratified", "random"] = "random"
    split_seed: int = 0
    folds: Annotated[int, Ge(2)] | None = None
    fold: Annotated[int, Ge(0)] = 0
    batch_size: Annotated[int, Ge(1)] = 64
    num_workers: Annotated[int, Ge(0)] = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    sampler: Literal["shuffle", "balanced"] = "shuffle"
    cache_transformed: Literal["auto"] | bool = "auto"
    cache_max_mb: Annotated[float, Ge(0)] = 1024.0
    tensor_store: Literal["auto"] | bool = "auto"
    device_resident: Literal["auto"] | bool = "auto"
    mean: Sequence[float] | str | None = None
    std: Sequence[float] | str | None = None
    stats_file: str | None = None
    mixup_alpha: Annotated[float, Ge(0)] = 0.0
    cutmix_alpha: Annotated[float, Ge(0)] = 0.0
    follow_symlinks: bool = False

    def __post_init__(self) -> None:
        super().__init__()
        # set by store.plan at setup: split -> TensorStore, and the batch path's augmentation
        self.stores: dict = {}
        self.augment_batch: Callable | None = None
        self.stats: tuple[list[float], list[float]] | None = None
        self._mix: Callable | None = None
        self.train_set = self.val_set = self.test_set = None  # Datasets, made by setup
        self.class_names: list[str] = []

    # -- what a source says ---------------------------------------------------------------

    def sets(self, transform: Callable | None) -> tuple[Dataset, Dataset | None]:
        """``(train, test or None)`` Datasets with ``transform``; without a test set of
        its own, test is carved out of train (``test_fraction``)."""
        raise NotImplementedError

    def fixed(self, dataset: Dataset) -> bool:
        """Whether ``dataset``'s samples are the same at every read, so ``tensor_store=auto``
        may stack them (a built-in source, or an in-memory ``TensorDataset``)."""
        return True

    def cache_samples(self, transform: Callable | None) -> bool:
        """Whether samples made with ``transform`` may be kept once made (the loader and
        the tensor store ask too): ``data.cache_transformed``."""
        if self.cache_transformed == "auto":
            return is_deterministic(transform) and is_deterministic(self.target_transform)
        return bool(self.cache_transformed)

    def read_options(self, transform: Callable | None) -> dict:
        """How a built-in source's Dataset reads samples made with ``transform``."""
        return dict(
            transform=transform,
            target_transform=self.target_transform,
            cache_samples=self.cache_samples(transform),
            cache_max_mb=self.cache_max_mb,
        )

    # -- the composition ------------------------------------------------------------------

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:  # training sets up early to hand shapes to the model
            return
        train_transform = self.train_transform
        if self.augment is not None:  # random augmentation of training samples only
            parts = [self.augment, self.train_transform]
            train_transform = v2.Compose([t for t in parts if t is not None])
        full_train, own_test = self.sets(train_transform)
        full_eval, own_test_eval = self.sets(self.eval_transform)
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
        eligible = self.tensor_store is True or (
            self.tensor_store == "auto"
            and (isinstance(full_eval, TensorDataset) or self.fixed(full_eval))
            and self.cache_samples(self.eval_transform)
        )
        self.stores, self.augment_batch = store.plan(self, full_eval, train_idx, eligible)
        log.info("data %s: %d train / %d val / %d test samples, %d classes, input %s",
                 type(self).__name__, len(self.train_set), len(self.val_set), len(self.test_set),
                 self.num_classes, self.input_shape)  # fmt: skip

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
        self.stats = (list(mean), list(std))
        write_json(self.stats_file, {"mean": mean, "std": std, "computed_from": "weights"})
        log.info("data.mean/std=auto: the pretrained weights' statistics %s / %s", mean, std)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one transformed eval sample, e.g. ``(C, H, W)``."""
        return tuple(self.val_set[0][0].shape)

    def train_dataloader(self) -> DataLoader:
        return loader(self, "train")

    def val_dataloader(self) -> DataLoader:
        return loader(self, "val")

    def test_dataloader(self) -> DataLoader:
        return loader(self, "test")


@_config
class TorchvisionData(ImageData):
    """A torchvision set by name, in torchvision's on-disk layout under ``root``.

    Args:
        root: the folder torchvision reads (and downloads into).
        download: let torchvision download missing files (needs network).
    """

    dataset: Literal["mnist", "fashion_mnist", "cifar10"]
    root: str = "data"
    download: bool = False

    def prepare_data(self) -> None:
        if self.download:
            sources.torchvision_sets(self.dataset, self.root, True, None)

    def sets(self, transform: Callable | None) -> tuple[Dataset, Dataset | None]:
        return sources.torchvision_sets(
            self.dataset, self.root, self.download, transform, self.target_transform
        )


@_config
class CsvData(ImageData):
    """Your own images: a CSV index (``filename,label``) of a folder, decoded lazily.

    Args:
        csv_file: the CSV index.
        image_dir: the folder the CSV's file names are relative to.
        test_csv_file: a separate test CSV (same folder); None: test is carved out.
        image_mode: ``L`` or ``RGB``; None: the first image's.
        image_size: ``[height, width]`` every image is resized to; None: the first image's
            size (so a folder of mixed sizes still batches).
        cache: keep decoded images in memory after their first use.
        dataset: the source's name, as run folders record it.
    """

    csv_file: str
    image_dir: str
    test_csv_file: str | None = None
    image_mode: Literal["L", "RGB"] | None = None
    image_size: ImageSize | None = None
    cache: bool = False
    dataset: Literal["image_csv"] = "image_csv"

    def sets(self, transform: Callable | None) -> tuple[Dataset, Dataset | None]:
        mode, size, folder = self.image_mode, self.image_size, self.image_dir
        if mode is None or size is None:  # the first image's
            links = self.follow_symlinks
            probe = CsvImageDataset(self.csv_file, folder, check_files=False, follow_symlinks=links)
            first = peek_image(probe.path(0))
            mode, size = mode or first[0], size or first[1]
        options = dict(
            **self.read_options(transform), image_mode=mode, image_size=tuple(size),
            cache=self.cache, follow_symlinks=self.follow_symlinks,
        )  # fmt: skip
        train = CsvImageDataset(self.csv_file, folder, **options)
        if not self.test_csv_file:  # test is carved out of train
            return train, None
        return train, CsvImageDataset(self.test_csv_file, folder, classes=train.classes, **options)


@_config
class DatasetData(ImageData):
    """A Dataset of your own, from a function in a package you trust.

    Args:
        dataset: ``(transform, target_transform) -> (train, test or None)`` (a
            ``_partial_`` in config; its own arguments are its config). The Dataset needs
            ``.classes`` or ``.targets`` for the class count.
    """

    dataset: Callable

    def sets(self, transform: Callable | None) -> tuple[Dataset, Dataset | None]:
        return self.dataset(transform=transform, target_transform=self.target_transform)

    def fixed(self, dataset: Dataset) -> bool:
        return False  # it may compute its samples afresh at each read: tensor_store=true


@_config
class DigitsData(DatasetData):
    """scikit-learn's 1797 8x8 digits, exported once under ``root`` as PNGs and a CSV and
    read as an image folder; or, given ``dataset``, a Dataset of your own in their place
    (``data.dataset={_target_: ..., _partial_: true}``: the digits' transforms and loader
    keys then serve it).

    Args:
        root: where the digits are exported.
        dataset: as for ``DatasetData``; None: the digits.
    """

    dataset: Callable | None = None
    root: str = "data/digits"
    cache: bool = True

    def prepare_data(self) -> None:
        if self.dataset is None:
            export_digits(self.root)

    def sets(self, transform: Callable | None) -> tuple[Dataset, Dataset | None]:
        if self.dataset is not None:
            return super().sets(transform)
        folder = Path(self.root)  # read only: prepare_data exports (a saved run never does)
        if not (folder / "labels.csv").is_file():
            raise UserError(
                f"data.root={folder}: the run's digits are not there (no labels.csv; training "
                f"exports them); give the folder that holds them, e.g. "
                f"paths.data_dir=<folder with digits/>"
            )
        digits = CsvImageDataset(
            folder / "labels.csv", folder / "images", **self.read_options(transform),
            image_mode="L", cache=self.cache,
        )  # fmt: skip
        return digits, None

    def fixed(self, dataset: Dataset) -> bool:
        return self.dataset is None


SOURCES = {"digits": DigitsData, "image_csv": CsvData}
SOURCES.update(dict.fromkeys(sources.TORCHVISION, TorchvisionData))


def ImageDataModule(dataset: str | Callable = "digits", **keys) -> ImageData:  # noqa: N802
    """A run folder saved before the sources had classes of their own names this one flat
    class with every source's keys (its ``dataset`` said which source); this builds that
    source's class from the keys it takes. The others were ignored by the flat class too.

    Raises:
        UserError: an unknown source, or a key no source takes.
    """
    cls = DigitsData if callable(dataset) else SOURCES.get(dataset)
    if cls is None:
        raise UserError(f"data.dataset={dataset!r} is not valid: expected one of {list(SOURCES)}")
    known = {f.name for c in {DatasetData, *SOURCES.values()} for f in fields(c)}
    unknown = sorted(set(keys) - known)
    if unknown:
        raise UserError(f"data.{unknown[0]}: experiments.data.ImageDataModule has no such key")
    if dataset != "digits":
        keys["dataset"] = dataset
    takes = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in keys.items() if k in takes})
