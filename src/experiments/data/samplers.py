"""A shuffling sampler whose order is a function of (seed, epoch) alone, so a resumed run
sees exactly the batches an uninterrupted one would."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class EpochShuffleSampler(Sampler[int]):
    """Random permutation per epoch from ``seed`` and the epoch number, not the global RNG.

    torch's RandomSampler draws its seed from the global RNG when iteration starts, and
    Lightning starts the iterator at different moments in a fresh and a resumed run; a
    permutation fixed by (seed, epoch) does not care. ``skip(n)`` drops the first ``n``
    indices of the next iteration only (resuming in the middle of an epoch; see
    ``ResumableLoader``).

    Args:
        seed: base seed of every epoch's permutation.
        generator: a generator to re-seed per epoch (the DataLoader's, which seeds its
            workers), or None.
    """

    def __init__(
        self, num_samples: int, seed: int = 0, generator: torch.Generator | None = None
    ) -> None:
        self.num_samples, self.seed, self.generator = num_samples, seed, generator
        self._skip = 0
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self.generator is not None:
            self.generator.manual_seed(self._epoch_seed() + 1)

    def skip(self, num_indices: int) -> None:
        self._skip = num_indices

    def _epoch_seed(self) -> int:
        return (self.seed * 1_000_003 + self.epoch) % (2**63 - 1)

    def order(self) -> torch.Tensor:
        """This epoch's whole order, ``(num_samples,)`` indices."""
        return torch.randperm(
            self.num_samples, generator=torch.Generator().manual_seed(self._epoch_seed())
        )

    def __iter__(self) -> Iterator[int]:
        skip, self._skip = self._skip, 0
        yield from self.order()[skip:].tolist()

    def __len__(self) -> int:
        return self.num_samples


class ClassBalancedSampler(EpochShuffleSampler):
    """As many draws per epoch as there are samples, with replacement, each sample drawn
    with probability proportional to 1 / (its class' count): every class is equally
    likely in every batch. The draws are a function of (seed, epoch), as for the shuffle.

    Args:
        targets: class index of each training sample.
    """

    def __init__(
        self, targets: list[int], seed: int = 0, generator: torch.Generator | None = None
    ) -> None:
        labels = torch.as_tensor(targets, dtype=torch.long)
        counts = torch.bincount(labels).double()
        self.weights = (1.0 / counts)[labels]  # (N,)
        super().__init__(len(targets), seed, generator)

    def order(self) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self._epoch_seed())
        return torch.multinomial(self.weights, self.num_samples, True, generator=gen)
