"""The train DataLoader whose position in the epoch is state that Lightning checkpoints."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from experiments.data.samplers import ClassBalancedSampler, EpochShuffleSampler

log = logging.getLogger(__name__)


class ResumableLoader(DataLoader):
    """A DataLoader with ``state_dict`` / ``load_state_dict``: Lightning saves the state of
    such a train loader in every checkpoint and hands it back on resume before the first
    batch is drawn, so a run resumed mid-epoch skips exactly the batches already trained on.

    The order itself is the sampler's (``EpochShuffleSampler``: a function of seed and
    epoch), so skipping the first ``batches * batch_size`` indices of that epoch's order
    reproduces the uninterrupted run's batches.

    Args:
        position: returns ``(epoch, batches of it already trained on)``; the loader cannot
            count them itself, as Lightning draws a batch ahead of the one it trains on.
        *args, **kwargs: as for ``DataLoader``.
    """

    def __init__(
        self, *args: Any, position: Callable[[], tuple[int, int]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.position = position

    def state_dict(self) -> dict[str, int]:
        epoch, batches = self.position() if self.position is not None else (0, 0)
        return {"epoch": int(epoch), "batches": int(batches)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        epoch, batches = int(state.get("epoch", 0)), int(state.get("batches", 0))
        if not batches:  # saved at an epoch's end: the next epoch starts from its first batch
            return
        if not hasattr(self.sampler, "skip"):
            # under DDP Lightning wraps the sampler to shard it: exact at epoch boundaries only
            log.warning(
                "resuming mid-epoch under DDP: epoch %d is re-shuffled from its start "
                "(%d batches were already done)",
                epoch,
                batches,
            )
            return
        self.sampler.set_epoch(epoch)
        self.sampler.skip(batches * int(self.batch_size))
        log.info("resuming mid-epoch: epoch %d from batch %d", epoch, batches)


def train_loader(
    train_set: Dataset,
    trainer,
    balanced_targets: list[int] | None = None,
    **loader_options: Any,
) -> ResumableLoader:
    """The training loader: its order is a function of (seed, epoch), not of when Lightning
    happens to start the iterator, so a resumed run sees the same batches as an
    uninterrupted one. ``torch.initial_seed()`` is ``seed`` after seed_everything (random
    when unseeded). With ``balanced_targets`` every class is drawn equally often."""
    # the index of the epoch about to run; unlike trainer.current_epoch it is already
    # advanced when a run resumes from an end-of-epoch checkpoint (workers draw the
    # order as soon as the loader is iterated, before Lightning calls set_epoch)
    epoch = trainer.fit_loop.epoch_progress.current.processed if trainer is not None else 0
    generator = torch.Generator()  # seeds the workers; re-seeded per epoch by the sampler
    if balanced_targets is not None:
        sampler = ClassBalancedSampler(balanced_targets, torch.initial_seed(), generator)
    else:
        sampler = EpochShuffleSampler(len(train_set), torch.initial_seed(), generator)
    sampler.set_epoch(epoch)

    def position() -> tuple[int, int]:
        """``(epoch, batches of it trained on)``; 0 batches at an epoch's end."""
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        if done >= trainer.num_training_batches:
            done = 0
        return trainer.current_epoch, int(done)

    return ResumableLoader(
        train_set,
        sampler=sampler,
        generator=generator,
        position=position if trainer is not None else None,
        **loader_options,
    )


def loader(dm, split: str) -> DataLoader:
    """The DataLoader of ``dm``'s ``split`` (train, val, test): cut from its TensorStore
    when it has one (no workers, no collate; on the model's device when
    ``data.device_resident`` allows), else sample by sample through the dataset."""
    from experiments.data import store

    options: dict[str, Any] = {
        "batch_size": dm.batch_size,
        "num_workers": dm.num_workers,
        "pin_memory": dm.pin_memory,
        "persistent_workers": dm.persistent_workers and dm.num_workers > 0,
    }
    dataset = getattr(dm, f"{split}_set")
    trainer = getattr(dm, "trainer", None)
    if split in dm._stores:
        if trainer is not None:
            device = trainer.strategy.root_device
            dm._stores[split] = store.resident(dm._stores[split], device, dm.device_resident, split)
        dataset = dm._stores[split]
        on_device = dataset.x.device.type != "cpu"
        options.update(num_workers=0, persistent_workers=False, collate_fn=store.whole_batch)
        options["pin_memory"] = dm.pin_memory and not on_device
    if split != "train":
        return DataLoader(dataset, shuffle=False, **options)
    balanced = dm.sampler == "balanced"
    targets = dm.train_targets("data.sampler=balanced") if balanced else None
    return train_loader(dataset, trainer, balanced_targets=targets, **options)
