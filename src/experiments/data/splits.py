"""Train / val / test index splits, fixed by ``split_seed`` alone."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from experiments.errors import UserError


def split_indices(
    n: int,
    val_fraction: float,
    test_fraction: float,
    seed: int,
    targets: Sequence[int] | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """``(train, val, test)`` indices of ``range(n)``.

    With ``targets`` the split is stratified: each class is split on its own in the same
    proportions, and a class with at least three samples has at least one in every
    split that is asked for, so a rare class cannot vanish from val or test. Without
    targets it is a plain random split. Either way the result depends only on ``seed``.

    Raises:
        UserError: the fractions leave no training or validation sample.
    """
    gen = torch.Generator().manual_seed(seed)
    if targets is None:  # one permutation: test first, then val, the rest trains
        order = torch.randperm(n, generator=gen).tolist()
        n_test, n_val = round(n * test_fraction), round(n * val_fraction)
        test, val, train = order[:n_test], order[n_test : n_test + n_val], order[n_test + n_val :]
    else:
        by_class: dict[int, list[int]] = {}
        for i, t in enumerate(targets):
            by_class.setdefault(int(t), []).append(i)
        train, val, test = [], [], []
        for c in sorted(by_class):
            group = by_class[c]
            order = [group[i] for i in torch.randperm(len(group), generator=gen).tolist()]
            n_test = _share(len(group), test_fraction)
            n_val = _share(len(group) - n_test, val_fraction * len(group) / (len(group) - n_test))
            test += order[:n_test]
            val += order[n_test : n_test + n_val]
            train += order[n_test + n_val :]
    if not train or not val:
        raise UserError(
            f"{n} samples are too few for data.val_fraction={val_fraction} and "
            f"data.test_fraction={test_fraction}"
        )
    return train, val, test


def _share(size: int, fraction: float) -> int:
    count = round(size * fraction)
    if fraction > 0 and size >= 2:
        count = min(max(count, 1), size - 1)  # leave one for the splits after it
    return count
