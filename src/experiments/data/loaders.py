"""The loaders: the train loader whose position in the epoch is state that Lightning
checkpoints, the tensor store's loader, and the loaders of the data modules held in memory."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from experiments.compat.lightning import batches_processed, epochs_processed
from experiments.config.hints import Ge, Le
from experiments.data import store
from experiments.data.samplers import ClassBalancedSampler, EpochShuffleSampler
from experiments.data.splits import split_indices
from experiments.errors import UserError

log = logging.getLogger(__name__)


class _Resumable:
    """``state_dict`` / ``load_state_dict`` of a train loader: Lightning saves the state of
    such a loader in every checkpoint and hands it back on resume before the first batch is
    drawn, so a run resumed mid-epoch skips exactly the batches already trained on.
    ``position`` returns ``(epoch, batches of it already trained on)``: the loader cannot
    count them itself, as Lightning draws a batch ahead of the one it trains on."""

    position: Callable[[], tuple[int, int]] | None = None

    def state_dict(self) -> dict[str, int]:
        epoch, batches = self.position() if self.position is not None else (0, 0)
        return {"epoch": int(epoch), "batches": int(batches)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        epoch, batches = int(state.get("epoch", 0)), int(state.get("batches", 0))
        if not batches:  # saved at an epoch's end: the next epoch starts from its first batch
            return
        if not self._skip_batches(epoch, batches):
            # under DDP Lightning wraps the sampler to shard it: exact at epoch boundaries only
            log.warning("resuming mid-epoch under DDP: epoch %d is re-shuffled from its start "
                        "(%d batches were already done)", epoch + 1, batches)  # fmt: skip
            return
        log.info("resuming mid-epoch: epoch %d after its first %d batches", epoch + 1, batches)


class ResumableLoader(_Resumable, DataLoader):
    """A DataLoader that is ``_Resumable``: its sampler's order is a function of seed and
    epoch (``EpochShuffleSampler``), so skipping the first ``batches * batch_size`` indices
    of that epoch's order reproduces the uninterrupted run's batches."""

    def _skip_batches(self, epoch: int, batches: int) -> bool:
        if not hasattr(self.sampler, "skip"):
            return False
        self.sampler.set_epoch(epoch)
        self.sampler.skip(batches * int(self.batch_size))
        return True


class StoreLoader(_Resumable):
    """Batches of a ``TensorStore`` with no DataLoader, no per-batch index list, no collate.

    Each epoch takes its order from ``sampler`` (a function of seed and epoch) as one
    tensor, gathers the samples of up to ``chunk_mb`` of batches with one ``index_select``
    and hands out views of that chunk; without a sampler (val, test) the batches are views
    of the store itself. A DataLoader spends ~30-90 µs a batch in Python (the sampler's
    indices one by one, the index list turned back into a tensor, its iterator
    bookkeeping); this costs a few.

    Under DDP each process takes every ``world_size``-th index of the order from its
    rank on, padded to an equal count by repeating the first indices, as Lightning's
    DistributedSampler does (Lightning only shards DataLoaders). Resuming mid-epoch skips
    the batches this process had trained on, under DDP too.

    Args:
        batch_size: samples per batch (the last batch may be smaller).
        sampler: ``EpochShuffleSampler`` or ``ClassBalancedSampler``; None: in order.
        rank, world_size: this process's place under DDP.
        pin_memory: pin each chunk (CPU store, CUDA present).
        position: as for ``ResumableLoader``.
    """

    num_workers = 0
    batch_sampler = None  # what Lightning looks for on a loader besides ``sampler``
    chunk_mb = 64.0

    def __init__(
        self,
        store,
        batch_size: int,
        sampler=None,
        rank: int = 0,
        world_size: int = 1,
        pin_memory: bool = False,
        position: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.dataset, self.sampler, self.position = store, sampler, position
        self.batch_size, self.rank, self.world_size = int(batch_size), int(rank), int(world_size)
        self.pin_memory = bool(pin_memory) and torch.cuda.is_available()
        self._skip = 0

    def _count(self) -> int:  # samples this process sees in an epoch
        total = len(self.sampler) if self.sampler is not None else len(self.dataset)
        return -(-total // self.world_size)

    def __len__(self) -> int:
        return -(-self._count() // self.batch_size)

    def _skip_batches(self, epoch: int, batches: int) -> bool:
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)
        self._skip = batches * self.batch_size
        return True

    def _order(self) -> torch.Tensor | None:
        """This process's indices for the epoch; None: the whole store in order."""
        if self.sampler is not None:
            order = self.sampler.order()
        elif self.world_size > 1:
            order = torch.arange(len(self.dataset))
        else:
            return None
        if self.world_size > 1:
            pad = self._count() * self.world_size - len(order)
            order = torch.cat([order, order[:pad]]) if pad else order
            order = order[self.rank :: self.world_size]
        return order

    def __iter__(self):
        x, y = self.dataset.x, self.dataset.y
        skip, self._skip = self._skip, 0
        order, bs = self._order(), self.batch_size
        # each batch is one of the views ``split`` made for a whole chunk: no op per batch
        if order is None:
            for xb, yb in zip(x[skip:].split(bs), y[skip:].split(bs), strict=True):
                yield self._pinned(xb), self._pinned(yb)
            return
        order = order[skip:].to(x.device)
        sample_bytes = max(x[:1].nbytes + y[:1].nbytes, 1)
        chunk = bs * max(1, min(64, int(self.chunk_mb * 2**20 // (sample_bytes * bs))))
        for index in order.split(chunk):
            xs = self._pinned(x.index_select(0, index)).split(bs)
            yield from zip(xs, self._pinned(y.index_select(0, index)).split(bs), strict=True)

    def _pinned(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory() if self.pin_memory and t.device.type == "cpu" else t


def _train_sampler(size: int, trainer, balanced_targets: list[int] | None):
    """The training sampler (its order a function of seed and epoch: ``samplers``);
    ``torch.initial_seed()`` is ``seed`` after seed_everything (random when unseeded).
    With ``balanced_targets`` every class is drawn equally often."""
    # the index of the epoch about to run; unlike trainer.current_epoch it is already
    # advanced when a run resumes from an end-of-epoch checkpoint (workers draw the
    # order as soon as the loader is iterated, before Lightning calls set_epoch)
    epoch = epochs_processed(trainer) if trainer is not None else 0
    generator = torch.Generator()  # seeds the workers; re-seeded per epoch by the sampler
    if balanced_targets is not None:
        sampler = ClassBalancedSampler(balanced_targets, torch.initial_seed(), generator)
    else:
        sampler = EpochShuffleSampler(size, torch.initial_seed(), generator)
    sampler.set_epoch(epoch)
    return sampler


def _position(trainer) -> Callable[[], tuple[int, int]] | None:
    """``(epoch, batches of it trained on)`` of ``trainer``; 0 batches at an epoch's end."""
    if trainer is None:
        return None

    def position() -> tuple[int, int]:
        done = batches_processed(trainer)
        return trainer.current_epoch, int(done) if done < trainer.num_training_batches else 0

    return position


def train_loader(
    train_set: Dataset,
    trainer,
    balanced_targets: list[int] | None = None,
    **loader_options: Any,
) -> ResumableLoader:
    """The training DataLoader (samples one by one, workers, collate), resumable."""
    sampler = _train_sampler(len(train_set), trainer, balanced_targets)
    resumable = ResumableLoader(
        train_set, sampler=sampler, generator=sampler.generator, **loader_options
    )
    resumable.position = _position(trainer)
    return resumable


def loader(dm, split: str) -> DataLoader | StoreLoader:
    """The loader of ``dm``'s ``split`` (train, val, test): a ``StoreLoader`` over its
    TensorStore when it has one (on the model's device when ``data.device_resident``
    allows), else a DataLoader reading sample by sample through the dataset."""
    trainer, train = dm.trainer, split == "train"
    balanced = train and dm.sampler == "balanced"
    targets = dm.train_targets("data.sampler=balanced") if balanced else None
    # Lightning's overfit_batches re-samples the train loader in order, which only a
    # DataLoader allows: sample by sample then, with the dataset's own augmentation
    overfitting = trainer is not None and bool(getattr(trainer, "overfit_batches", 0))
    if overfitting and train:
        dm.augment_batch = None
    if split in dm.stores and not overfitting:  # Lightning checks every split then
        if trainer is not None:
            device = trainer.strategy.root_device
            dm.stores[split] = store.resident(dm.stores[split], device, dm.device_resident, split)
        data = dm.stores[split]
        return StoreLoader(
            data,
            dm.batch_size,
            sampler=_train_sampler(len(data), trainer, targets) if train else None,
            rank=trainer.global_rank if trainer is not None else 0,
            world_size=trainer.world_size if trainer is not None else 1,
            pin_memory=dm.pin_memory,
            position=_position(trainer) if train else None,
        )
    options: dict[str, Any] = {
        "batch_size": dm.batch_size,
        "num_workers": dm.num_workers,
        "pin_memory": dm.pin_memory,
        "persistent_workers": dm.persistent_workers and dm.num_workers > 0,
    }
    if not train or overfitting:
        return DataLoader(getattr(dm, f"{split}_set"), shuffle=False, **options)
    return train_loader(dm.train_set, trainer, balanced_targets=targets, **options)


@dataclass(eq=False, repr=False, kw_only=True)
class SplitLoaders(L.LightningDataModule):
    """A data module of tensors held in memory, split train/val/test with a seed (``split``),
    with the resumable train loader (its order is a function of seed and epoch, so
    ``resume=`` is exact) and plain loaders for the others. Each subclass is a dataclass
    whose fields, these included, are its config.

    Args:
        val_fraction, test_fraction: shares of the samples held out.
        split_seed: fixes the split (alone: the training seed does not move it).
        augment: image augmentation (the ``augment`` group) does not apply: null only, so
            the data composes with the default ``augment=none``.
    """

    unit = "samples"  # names the samples in the one line about an empty test split
    no_augment = "data.augment: augmentation does not apply: augment=none"

    batch_size: Annotated[int, Ge(1)] = 32
    num_workers: Annotated[int, Ge(0)] = 0
    val_fraction: Annotated[float, Ge(0), Le(1)] = 0.15
    test_fraction: Annotated[float, Ge(0), Le(1)] = 0.15
    split_seed: int = 0
    augment: None = None

    def __post_init__(self) -> None:
        super().__init__()
        if self.augment is not None:
            raise UserError(self.no_augment)
        self.splits: dict[str, list[int]] = {}
        self.train_set = self.val_set = self.test_set = None

    def split(self, x: torch.Tensor, y: torch.Tensor, fold: tuple[int, int] | None = None):
        """Split ``x`` and ``y`` (row ``i`` is sample ``i``) into the three TensorDatasets."""
        train, val, test = split_indices(
            len(y), self.val_fraction, self.test_fraction, self.split_seed, fold=fold
        )
        self.splits = {"train": train, "val": val, "test": test}
        self.train_set, self.val_set, self.test_set = (
            TensorDataset(x[idx], y[idx]) for idx in (train, val, test)
        )

    def train_dataloader(self) -> DataLoader:
        return train_loader(
            self.train_set, self.trainer, batch_size=self.batch_size, num_workers=self.num_workers
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size, num_workers=self.num_workers)

    def test_dataloader(self) -> DataLoader:
        if not len(self.test_set):
            raise UserError(f"data.test_fraction=0 leaves no test {self.unit}; set test=false")
        return DataLoader(self.test_set, batch_size=self.batch_size, num_workers=self.num_workers)
