"""Train / val / test index splits, fixed by ``split_seed`` alone."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from experiments.errors import UserError

log = logging.getLogger(__name__)


def split_indices(
    n: int,
    val_fraction: float,
    test_fraction: float,
    seed: int,
    targets: Sequence[int] | None = None,
    fold: tuple[int, int] | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """``(train, val, test)`` indices of ``range(n)``.

    With ``targets`` the split is stratified: each class is split on its own in the same
    proportions, and a class with at least three samples has at least one in every
    split that is asked for, so a rare class cannot vanish from val or test. Without
    targets it is a plain random split. Either way the result depends only on ``seed``.

    ``fold=(k, K)`` (k-fold cross-validation): the test split is held out as above, and
    validation is the k-th of K folds of everything else (``val_fraction`` is unused), so
    over k = 0..K-1 every non-test sample validates exactly once and the test split is the
    same for every fold. With ``targets`` each class is dealt evenly over the folds.

    Raises:
        UserError: the fractions leave no training or validation sample, or a class has
            fewer non-test samples than there are folds.
    """
    if fold is not None:
        train, _, test = _holdout(n, 0.0, test_fraction, seed, targets)
        train, val = _folds(sorted(train), *fold, seed, targets)
        return train, val, test
    train, val, test = _holdout(n, val_fraction, test_fraction, seed, targets)
    if not train or not val:
        raise UserError(
            f"{n} samples are too few for data.val_fraction={val_fraction} and "
            f"data.test_fraction={test_fraction}"
        )
    return train, val, test


def _holdout(n, val_fraction, test_fraction, seed, targets):
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
    return train, val, test


def _folds(pool: list[int], k: int, folds: int, seed: int, targets) -> tuple[list[int], list[int]]:
    """``(train, val)`` of fold ``k`` of ``folds``: each class of ``pool`` is shuffled and
    dealt round-robin, continuing where the class before it stopped (even fold sizes)."""
    by_class: dict[int, list[int]] = {}
    for i in pool:
        by_class.setdefault(int(targets[i]) if targets is not None else 0, []).append(i)
    smallest = min(by_class, key=lambda c: len(by_class[c]))
    if len(by_class[smallest]) < folds:
        what = f"class {smallest}" if targets is not None else "the data"
        raise UserError(
            f"cv.folds={folds}: {what} has only {len(by_class[smallest])} samples outside the "
            f"test split, fewer than the folds; use cv.folds <= {len(by_class[smallest])}"
        )
    gen = torch.Generator().manual_seed(seed + 1)
    train, val, dealt = [], [], 0
    for c in sorted(by_class):
        group = by_class[c]
        for i in torch.randperm(len(group), generator=gen).tolist():
            (val if dealt % folds == k else train).append(group[i])
            dealt += 1
    return sorted(train), sorted(val)


def _share(size: int, fraction: float) -> int:
    count = round(size * fraction)
    if fraction > 0 and size >= 2:
        count = min(max(count, 1), size - 1)  # leave one for the splits after it
    return count


def warn_absent_classes(split: str, part, class_names: Sequence[str]) -> None:
    """Warn in one line when ``split`` (a Subset of a dataset with ``.targets``, or such a
    dataset) lacks some of the classes: its macro metrics (``balanced_acc``, ``macro_f1``)
    then average only the classes it has (or predicts), and ``<split>/missing_classes`` in
    metrics.json says how many it lacks."""
    targets = getattr(getattr(part, "dataset", part), "targets", None)
    if part is None or targets is None or not class_names:
        return
    labels = torch.as_tensor(targets).long().flatten()
    indices = getattr(part, "indices", None)
    if indices is not None:
        labels = labels[torch.as_tensor(list(indices), dtype=torch.long)]
    present = torch.zeros(len(class_names), dtype=torch.bool)
    present[labels[(labels >= 0) & (labels < len(class_names))]] = True
    missing = (~present).nonzero().flatten().tolist()
    if missing and len(part):
        shown = ", ".join(repr(class_names[i]) for i in missing[:10])
        log.warning("data: the %s split has no sample of %d of the %d classes (%s%s); its macro "
                    "metrics average only the classes it has, and %s/missing_classes marks them",
                    split, len(missing), len(class_names), shown,
                    ", ..." if len(missing) > 10 else "", split)  # fmt: skip
