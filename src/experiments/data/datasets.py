"""Datasets that know nothing of Lightning: a lazy CSV-indexed image folder and the
bundled scikit-learn digits, exported once to PNG files so they take the same path."""

from __future__ import annotations

import csv
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from PIL import Image
from torch.utils.data import Dataset

from experiments.errors import UserError

log = logging.getLogger(__name__)

IMAGE_MODES = ("L", "RGB")


class CsvImageDataset(Dataset):
    """Images listed in a CSV (``filename,label``), decoded only when indexed.

    ``__init__`` reads the CSV as a light index (and, with ``check_files``, stats each
    file); no image is opened until ``__getitem__``. Labels are either all integers
    (class index = the integer) or class-name strings (classes sorted by name, so the
    order is stable across runs and machines).

    Args:
        csv_file: CSV with a header holding ``filename`` and ``label`` columns.
        image_dir: folder that ``filename`` is relative to.
        transform: applied to the decoded PIL image.
        target_transform: applied to the integer class index.
        image_mode: ``"L"`` (grayscale) or ``"RGB"``; every image is converted to it.
        image_size: ``(height, width)`` to resize every image to, or None to keep sizes.
        classes: the class names to map labels onto (pass the train set's classes to a
            val/test set so indices agree); None derives them from this CSV.
        check_files: stat every listed file up front so a missing one fails before training.
        cache: keep decoded (pre-transform) images in memory after first use.
        cache_samples: keep transformed ``(image, target)`` samples in memory after first
            use, so later epochs skip decoding *and* transforms. Only correct when both
            transforms are deterministic (no random augmentation): the DataModule
            decides, see ``transforms.is_deterministic``.
        cache_max_mb: stop adding samples to that cache beyond this many megabytes of
            tensors (the rest are decoded and transformed on every use).
    """

    def __init__(
        self,
        csv_file: str | os.PathLike,
        image_dir: str | os.PathLike,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        image_mode: str = "RGB",
        image_size: Sequence[int] | None = None,
        classes: Sequence[str] | None = None,
        check_files: bool = True,
        cache: bool = False,
        cache_samples: bool = False,
        cache_max_mb: float = 1024.0,
    ) -> None:
        self.csv_file = Path(csv_file)
        self.image_dir = Path(image_dir)
        if not self.csv_file.is_file():
            raise UserError(f"CSV file not found: {self.csv_file} (set data.csv_file=<path>)")
        if not self.image_dir.is_dir():
            raise UserError(f"image folder not found: {self.image_dir} (set data.image_dir=<path>)")
        if image_mode not in IMAGE_MODES:
            raise UserError(f"image_mode={image_mode!r} is not valid; use one of {IMAGE_MODES}")
        self.transform = transform
        self.target_transform = target_transform
        self.image_mode = image_mode
        self.image_size = tuple(image_size) if image_size is not None else None
        self.cache = cache
        self.cache_samples = cache_samples
        self.cache_max_bytes = int(float(cache_max_mb) * 2**20)
        self._decoded: dict[int, Image.Image] = {}
        self._samples: dict[int, tuple[Any, Any]] = {}
        self._sample_bytes = 0

        files, raw_labels = _read_index(self.csv_file)
        self.files = files
        self.classes, self.targets = _encode_labels(self.csv_file, raw_labels, classes)
        if check_files:
            for row, name in enumerate(files, start=2):
                if not (self.image_dir / name).is_file():
                    raise UserError(
                        f"{self.csv_file} row {row}: image {self.image_dir / name} does not exist"
                    )

    def __len__(self) -> int:
        return len(self.files)

    def load_image(self, index: int) -> Image.Image:
        """Decode image ``index`` (converted and resized as configured), without transforms."""
        if index in self._decoded:
            return self._decoded[index]
        path = self.image_dir / self.files[index]
        try:
            with Image.open(path) as im:
                image = im.convert(self.image_mode)
        except (OSError, ValueError) as err:
            raise UserError(
                f"{self.csv_file} row {index + 2}: cannot read image {path}: {err}"
            ) from None
        if self.image_size is not None and image.size != self.image_size[::-1]:
            image = image.resize(self.image_size[::-1], Image.BILINEAR)
        if self.cache:
            self._decoded[index] = image
        return image

    def decoded_array(self, indices: Sequence[int]):
        """Images ``indices`` decoded (not transformed) as one ``(N, C, H, W)`` tensor of
        their pixel type, or None when their sizes differ: one pass to stack a split."""
        import numpy as np
        import torch

        arrays = [np.asarray(self.load_image(i)) for i in indices]
        if not arrays or any(a.shape != arrays[0].shape for a in arrays):
            return None
        x = torch.from_numpy(np.stack(arrays))
        return x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        sample = self._samples.get(index)
        if sample is not None:
            return sample
        image = self.load_image(index)
        target = self.targets[index]
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        if self.cache_samples:
            size = _nbytes(image) + _nbytes(target)
            if self._sample_bytes + size <= self.cache_max_bytes:
                self._samples[index] = (image, target)
                self._sample_bytes += size
                # the decoded image is no longer needed once its sample is kept
                self._decoded.pop(index, None)
        return image, target


def _nbytes(value: Any) -> int:
    if hasattr(value, "nbytes"):  # tensors, numpy arrays
        return int(value.nbytes)
    if isinstance(value, Image.Image):
        return len(value.getbands()) * value.width * value.height
    return 64  # ints and other small Python objects


def _read_index(csv_file: Path) -> tuple[list[str], list[str]]:
    with open(csv_file, newline="") as f:
        reader = csv.DictReader(f)
        fields = [c.strip() for c in reader.fieldnames or []]
        if "filename" not in fields or "label" not in fields:
            raise UserError(
                f"{csv_file}: header must have 'filename' and 'label' columns, found {fields}"
            )
        reader.fieldnames = fields
        files, labels, padded = [], [], set()
        for rec in reader:
            row = reader.line_num
            if None in rec:  # more fields than the header names
                raise UserError(
                    f"{csv_file} line {row}: {len(fields) + len(rec[None])} fields where the "
                    f"header has {len(fields)}; quote a value that holds a comma, e.g. "
                    f'img.png,"fox, grey"'
                )
            raw_name, raw_label = rec.get("filename") or "", rec.get("label") or ""
            name, label = raw_name.strip(), raw_label.strip()
            if not name or not label:
                raise UserError(f"{csv_file} line {row}: empty filename or label")
            if label != raw_label:
                padded.add(raw_label)
            files.append(name)
            labels.append(label)
    if not files:
        raise UserError(f"{csv_file}: no rows (expected 'filename,label' lines after the header)")
    if padded:
        shown = ", ".join(repr(p) for p in sorted(padded)[:5])
        log.warning("%s: labels with surrounding spaces were stripped: %s", csv_file, shown)
    return files, labels


def _encode_labels(
    csv_file: Path, raw: list[str], classes: Sequence[str] | None
) -> tuple[list[str], list[int]]:
    numeric = all(s.lstrip("-").isdigit() for s in raw)
    if classes is None:
        if numeric:
            ints = [int(s) for s in raw]
            if min(ints) < 0:
                raise UserError(f"{csv_file}: integer labels must be >= 0, found {min(ints)}")
            classes = [str(i) for i in range(max(ints) + 1)]
        else:
            classes = sorted(set(raw))
        if len(set(raw)) < 2:
            raise UserError(
                f"{csv_file}: needs at least 2 classes to classify, found 1 ({raw[0]!r} on "
                f"every row)"
            )
    classes = [str(c) for c in classes]
    index = {name: i for i, name in enumerate(classes)}
    targets = []
    for row, label in enumerate(raw, start=2):
        key = str(int(label)) if numeric else label
        if key not in index:
            raise UserError(
                f"{csv_file} row {row}: label {label!r} was not seen in the training data "
                f"(known classes: {', '.join(classes[:20])}{' ...' if len(classes) > 20 else ''})"
            )
        targets.append(index[key])
    return classes, targets


def peek_image(path: str | os.PathLike) -> tuple[str, tuple[int, int]]:
    """Mode (``"L"`` or ``"RGB"``) and ``(height, width)`` of one image file."""
    try:
        with Image.open(path) as im:
            mode = "L" if im.mode in ("1", "L", "LA", "I", "I;16", "F") else "RGB"
            return mode, (im.height, im.width)
    except OSError as err:
        raise UserError(f"cannot read image {path}: {err}") from None


def export_digits(root: str | os.PathLike) -> Path:
    """Write scikit-learn's 1797 8x8 digits as PNGs plus ``labels.csv`` under ``root``.

    Idempotent and safe when several processes start at once: the files are built in a
    temporary sibling folder that is renamed into place in one step, so ``root`` either
    does not exist or is complete.

    Returns:
        ``root`` (holding ``labels.csv`` and ``images/``).
    """
    root = Path(root)
    if (root / "labels.csv").is_file():
        return root
    try:
        return _export_digits(root)
    except OSError as err:
        from experiments.runs.files import write_problem

        raise UserError(
            f"cannot export the bundled digits to {root} ({write_problem(err)}); set "
            f"paths.data_dir=<a folder you can write>"
        ) from None


def _export_digits(root: Path) -> Path:
    from sklearn.datasets import load_digits  # ships the data inside the package

    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    try:
        digits = load_digits()
        (tmp / "images").mkdir()
        rows = []
        for i, (pixels, label) in enumerate(zip(digits.images, digits.target, strict=True)):
            name = f"{i:04d}.png"
            # sklearn's pixel values are 0..16; stretch them to 0..255 grayscale
            image = Image.fromarray((pixels * (255.0 / 16.0)).round().astype("uint8"), mode="L")
            image.save(tmp / "images" / name)
            rows.append((name, int(label)))
        with open(tmp / "labels.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["filename", "label"])
            writer.writerows(rows)
        try:
            os.rename(tmp, root)
        except OSError:
            if not (root / "labels.csv").is_file():  # not another process winning the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root
