"""Tabular regression data: rows of numeric features and one numeric target, from
scikit-learn's bundled diabetes set (442 rows, 10 features; shipped inside the package, no
download) or a CSV of your own. The split is seeded, and the standardization of the
features and of the target is fitted on the train split alone (``standardization``)."""

from __future__ import annotations

import csv
import difflib
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import numpy as np
import torch

from experiments.config.hints import Ge
from experiments.data.loaders import SplitLoaders
from experiments.errors import UserError
from experiments.runs.files import read_text

# a table is read whole into memory: above this it is not a table this module is for
MAX_CSV_BYTES = 256 * 1024 * 1024


@dataclass(eq=False, repr=False, kw_only=True)
class TabularData(SplitLoaders):
    """Features ``(N, F)`` and targets ``(N,)`` as float32 tensors, split train/val/test
    (the split and loader keys: ``SplitLoaders``).

    Batches are raw ``(x (B, F), y (B,))``: the module standardizes with the statistics of
    ``standardization``, so the weights it saves carry them and a prediction needs no data
    module.

    Args:
        csv_file: a CSV with a header row; None: scikit-learn's diabetes set.
        target_column: the CSV's column to predict (required with ``csv_file``).
        feature_columns: the CSV's columns to predict from; None: every other column.
        folds, fold: k-fold cross-validation (``cv.folds``): validate on fold ``fold`` of
            ``folds`` of the non-test rows.
    """

    unit = "rows"
    no_augment = "data.augment: image augmentation does not apply to a table: augment=none"

    csv_file: str | None = None
    target_column: str | None = None
    feature_columns: list[str] | None = None
    folds: Annotated[int, Ge(2)] | None = None
    fold: Annotated[int, Ge(0)] = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        csv_file, folds, fold = self.csv_file, self.folds, self.fold
        named = self.target_column is not None or self.feature_columns is not None
        if csv_file is None and named:
            raise UserError(
                "data.target_column and data.feature_columns name columns of data.csv_file, "
                "which is not set (null: the bundled diabetes set)"
            )
        if csv_file is not None and not self.target_column:
            raise UserError(f"data.target_column: required with data.csv_file={csv_file}")
        if folds is not None and not 0 <= fold < folds:
            raise UserError(f"data.fold={fold}: must be in 0..{folds - 1} for data.folds={folds}")
        if self.feature_columns is not None:
            self.feature_columns = list(self.feature_columns)
        self.feature_names: list[str] = []
        self.standardization: dict[str, list[float] | float] = {}

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:  # build sets the data up before the trainer does
            return
        if self.csv_file is None:
            features, targets, self.feature_names = diabetes()
        else:
            names, table = _numbers(self.csv_file, self.target_column, self.feature_columns)
            features, targets, self.feature_names = table[:, 1:], table[:, 0], names[1:]
        fold = (self.fold, self.folds) if self.folds is not None else None
        self.split(torch.from_numpy(features).float(), torch.from_numpy(targets).float(), fold)
        train = self.splits["train"]
        self.standardization = fit_standardization(features[train], targets[train])


def fit_standardization(features: np.ndarray, targets: np.ndarray) -> dict:
    """Mean and standard deviation (float64, ``ddof=0`` as scikit-learn's StandardScaler) of
    each feature column and of the target; a constant column gets std 1, so it maps to 0
    rather than to a division by zero."""

    def std(values: np.ndarray) -> np.ndarray:
        s = values.std(axis=0)
        return np.where(s > 0, s, 1.0)

    return {
        "feature_mean": features.mean(axis=0).tolist(),
        "feature_std": std(features).tolist(),
        "target_mean": float(targets.mean()),
        "target_std": float(std(targets)),
    }


def diabetes() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """scikit-learn's diabetes set in its original units (``scaled=False``): age, sex, bmi,
    blood pressure and six serum measurements; the target is disease progression a year on."""
    from sklearn.datasets import load_diabetes  # lazy: scikit-learn costs ~1 s to import

    bunch = load_diabetes(scaled=False)
    return bunch.data.astype(np.float64), bunch.target.astype(np.float64), list(bunch.feature_names)


def read_features(csv_file: str, feature_names: Sequence[str]) -> np.ndarray:
    """``(N, F)`` values of the columns ``feature_names`` (in that order) of a CSV with a
    header row: the rows a trained module predicts (``RegressionModule.predict_rows``), one
    per data row in file order. Other columns (the target, an id) are ignored; the checks
    and messages are those of the training data (``_numbers``).

    Raises:
        UserError: the file is unreadable, or a feature column or value is missing or wrong.
    """
    return _numbers(csv_file, None, list(feature_names))[1]


def _numbers(
    csv_file: str, target: str | None, features: list[str] | None
) -> tuple[list[str], np.ndarray]:
    """The names and values of the columns ``_columns`` chooses (the target's first) of a CSV
    with a header row. Every value must be a finite number; a refusal is one line naming the
    file, the line and the column (a NaN target: drop the row or fill it in).

    Raises:
        UserError: the file is unreadable, too large, not UTF-8, or a row or column is wrong.
    """
    text = read_text(csv_file, max_bytes=MAX_CSV_BYTES)
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = [c.strip() for c in next(reader, [])]
        columns = _columns(csv_file, header, target, features)
        target_index = columns[0] if target is not None else None
        rows = []
        for fields in reader:
            if not fields or fields == [""]:  # a blank line
                continue
            line = reader.line_num
            if len(fields) != len(header):
                raise UserError(
                    f"{csv_file} line {line}: {len(fields)} fields where the header has "
                    f"{len(header)}; quote a value that holds a comma"
                )
            rows.append([_number(csv_file, line, header[i], fields[i], i == target_index)
                         for i in columns])  # fmt: skip
    except csv.Error as err:  # a NUL byte, a field past csv's size limit, a stray quote
        raise UserError(f"{csv_file} line {reader.line_num}: not valid CSV ({err})") from None
    if not rows:
        raise UserError(f"{csv_file}: no data rows under the header")
    return [header[i] for i in columns], np.asarray(rows, dtype=np.float64)


def _columns(
    csv_file: str, header: list[str], target: str | None, features: list[str] | None
) -> list[int]:
    """Indices of the target column (when given), then of the feature columns, in the
    header."""
    if not any(header):
        raise UserError(f"{csv_file}: empty, or no header row (the column names come first)")
    duplicated = sorted({c for c in header if header.count(c) > 1})
    if duplicated:
        raise UserError(f"{csv_file}: column {duplicated[0]!r} appears twice in the header")
    wanted = [("data.target_column", target)] if target is not None else []
    wanted += [("data.feature_columns", c) for c in features or []]
    for key, name in wanted:
        if name not in header:
            close = difflib.get_close_matches(str(name), header, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            what = f"{key}={name!r}" if target is not None else f"the model's feature {name!r}"
            raise UserError(
                f"{what}: no such column in {csv_file}{hint}; it has "
                f"{', '.join(header[:20])}{' ...' if len(header) > 20 else ''}"
            )
    if target is None:
        return [header.index(c) for c in features or []]
    if features is not None and target in features:
        raise UserError(f"data.feature_columns: includes the target column {target!r}")
    names = features if features is not None else [c for c in header if c != target]
    if not names:
        raise UserError(f"{csv_file}: no feature column besides the target {target!r}")
    return [header.index(target)] + [header.index(c) for c in names]


def _number(csv_file: str, line: int, column: str, value: str, is_target: bool) -> float:
    what = "target" if is_target else "feature"
    shown = value if len(value) <= 40 else value[:37] + "..."
    try:
        number = float(value)
    except ValueError:
        empty = not value.strip()
        raise UserError(
            f"{csv_file} line {line}: {what} {column!r} is "
            f"{'empty' if empty else repr(shown) + ', not a number'}; drop the row or fill it in"
        ) from None
    if not math.isfinite(number):
        raise UserError(
            f"{csv_file} line {line}: {what} {column!r} is {shown.strip()}; every value must "
            f"be a finite number: drop the row or fill it in"
        )
    return number
