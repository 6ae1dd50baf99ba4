"""Datasets that know nothing of Lightning: a lazy CSV-indexed image folder and the
bundled scikit-learn digits, exported once to PNG files so they take the same path."""

from __future__ import annotations

import csv
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from experiments.data.csv_index import MAX_CLASSES, checked_names, encode_labels, read_index
from experiments.data.images import decode, peek_image
from experiments.errors import UserError
from experiments.runs.files import write_problem

log = logging.getLogger(__name__)

IMAGE_MODES = ("L", "RGB")
__all__ = ["MAX_CLASSES", "CsvImageDataset", "decode", "export_digits", "leads_outside",
           "peek_image", "read_image"]  # fmt: skip


def read_image(path: Path, mode: str, size: Sequence[int] | None = None) -> Image.Image:
    """``images.decode`` of ``path`` (as every image of a run is read), resized bilinearly
    to ``size`` ``(height, width)`` when it differs (None: its own size)."""
    image = decode(path, mode)
    if size is not None and image.size != tuple(size)[::-1]:  # PIL sizes are (W, H)
        image = image.resize(tuple(size)[::-1], Image.BILINEAR)
    return image


def leads_outside(
    folder: Path,
    name: str,
    follow_symlinks: bool = False,
    *,
    root: Path | None = None,
    dirs: dict[str, bool] | None = None,
) -> Path | None:
    """Where the file ``name`` of an image folder leads when that is outside the folder, else
    None (the file need not exist): an absolute name or ``..`` climbing out, always; a
    symlink, of the file or of a subfolder on its way, resolving outside the folder's real
    place, unless ``follow_symlinks``. The rule of ``CsvImageDataset`` for a CSV's rows, and
    of ``experiments.predict`` for the rows of the CSV it is given.

    Args:
        follow_symlinks: read through symlinks wherever they lead (``data.follow_symlinks``).
        root: ``folder.resolve()``, when the caller keeps it for many names.
        dirs: the caller's cache of subfolder -> inside, kept across names (one resolve per
            subfolder instead of one per file).
    """
    folder = Path(folder)
    norm = os.path.normpath(name)
    if os.path.isabs(name) or norm == os.pardir or norm.startswith(os.pardir + os.sep):
        return Path(os.path.normpath(folder / name))
    if follow_symlinks:
        return None
    root = folder.resolve() if root is None else root
    dirs = {} if dirs is None else dirs
    path, parent = folder / norm, os.path.dirname(norm)
    # one lstat for a file directly in the folder; a subfolder is resolved once per cache
    if parent and parent not in dirs:
        dirs[parent] = (folder / parent).resolve().is_relative_to(root)
    if (parent and not dirs[parent]) or path.is_symlink():
        target = path.resolve()  # a link out and one back in again stays inside
        return None if target.is_relative_to(root) else target
    return None


class CsvImageDataset(Dataset):
    """Images listed in a CSV (``filename,label``), decoded only when indexed.

    ``__init__`` reads the CSV as a light index (and, with ``check_files``, stats each
    file); no image is opened until ``__getitem__``. Labels are either all plain integers
    (ASCII digits: class index = the integer, below ``MAX_CLASSES``) or class-name strings
    (classes sorted by name, so the order is stable across runs and machines); a label such
    as ``1.5``, ``--1`` or ``²`` makes every label a name.

    The CSV is data, not a list of places to read: it must be UTF-8 (a BOM is allowed),
    every file name must be a relative path inside ``image_dir`` (no absolute paths, no
    ``..`` leaving it), a file may be listed once only, and a symlink that resolves outside
    ``image_dir`` is refused unless ``follow_symlinks``. Each refusal is a UserError naming
    the CSV row (its line number) and the value.

    Images are opened behind Pillow's decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``;
    above it the file is refused, not decoded). 16-bit grayscale images (Pillow modes
    ``I;16*`` and ``I`` with values in 0..65535) are scaled linearly to 8 bits
    (``round(v / 257)``, so 65535 -> 255), never clipped; 32-bit float images (mode ``F``)
    with values in 0..1 are scaled by 255. Other values are refused.

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
        follow_symlinks: read files through symlinks that resolve outside ``image_dir``
            (by default such a row is refused; symlinks that stay inside are always read).
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
        follow_symlinks: bool = False,
    ) -> None:
        self.csv_file = Path(csv_file)
        self.image_dir = Path(image_dir)
        if not self.csv_file.is_file():
            raise UserError(f"CSV file not found: {self.csv_file} (set data.csv_file=<path>)")
        if not self.image_dir.is_dir():
            raise UserError(f"image folder not found: {self.image_dir} (set data.image_dir=<path>)")
        if image_mode not in IMAGE_MODES:
            raise UserError(f"image_mode={image_mode!r} is not valid; use one of {IMAGE_MODES}")
        self.transform, self.target_transform = transform, target_transform
        self.image_mode = image_mode
        self.image_size = tuple(image_size) if image_size is not None else None
        self.cache, self.cache_samples = cache, cache_samples
        self.cache_max_bytes = int(float(cache_max_mb) * 2**20)
        self._decoded: dict[int, Image.Image] = {}
        self._samples: dict[int, tuple[Any, Any]] = {}
        self._sample_bytes = 0

        self.follow_symlinks = bool(follow_symlinks)
        # symlinks are judged against the folder's real place (image_dir may itself be one)
        self._root = self.image_dir.resolve()
        self._inside_dirs: dict[str, bool] = {}

        self.files, labels, self.lines = read_index(self.csv_file)
        self._names = checked_names(self.csv_file, self.image_dir, self.files, labels, self.lines)
        self.classes, self.targets = encode_labels(self.csv_file, labels, self.lines, classes)
        if check_files:
            for i in range(len(self.files)):
                path = self.path(i)
                if not path.is_file():
                    # a folder, a FIFO (whose read would block) or a device is no image
                    what = "is not a regular file" if path.exists() else "does not exist"
                    raise UserError(
                        f"{self.csv_file} row {self.lines[i]}: image "
                        f"{self.image_dir / self.files[i]} {what}"
                    )

    def __len__(self) -> int:
        return len(self.files)

    def path(self, index: int) -> Path:
        """The file of row ``index``, checked to lie inside ``image_dir`` (through symlinks
        too, unless ``follow_symlinks``): checked again at every read, so a symlink swapped
        in after ``__init__`` is refused as well.

        Raises:
            UserError: naming the CSV row, the file name and where it leads.
        """
        name = self._names[index]
        target = leads_outside(
            self.image_dir, name, self.follow_symlinks, root=self._root, dirs=self._inside_dirs
        )
        if target is not None:
            raise UserError(
                f"{self.csv_file} row {self.lines[index]}: {self.files[index]!r} leads "
                f"through a symlink to {target}, outside data.image_dir={self.image_dir}; "
                f"move the file inside or set (+)data.follow_symlinks=true"
            )
        return self.image_dir / name

    def load_image(self, index: int) -> Image.Image:
        """Decode image ``index`` (converted and resized as configured), without transforms."""
        if index in self._decoded:
            return self._decoded[index]
        path = self.path(index)
        try:
            image = read_image(path, self.image_mode, self.image_size)
        except UserError as err:
            raise UserError(f"{self.csv_file} row {self.lines[index]}: {err}") from None
        if self.cache:
            self._decoded[index] = image
        return image

    def decoded_array(self, indices: Sequence[int]):
        """Images ``indices`` decoded (not transformed) as one ``(N, H, W[, C])`` tensor of
        their pixel type, or None when their sizes differ: one pass to stack a split."""
        arrays = [np.asarray(self.load_image(i)) for i in indices]
        if not arrays or any(a.shape != arrays[0].shape for a in arrays):
            return None
        return torch.from_numpy(np.stack(arrays))

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
    # lazy: scikit-learn (~1 s) only for the first export; it ships the data in the package
    from sklearn.datasets import load_digits

    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{root.name}-", dir=root.parent) as name:
            tmp = Path(name)  # renamed into place, else removed
            digits = load_digits()
            (tmp / "images").mkdir()
            rows = []
            for i, (pixels, label) in enumerate(zip(digits.images, digits.target, strict=True)):
                name = f"{i:04d}.png"
                # sklearn's pixel values are 0..16; stretch them to 0..255 grayscale
                image = (pixels * (255.0 / 16.0)).round().astype("uint8")
                Image.fromarray(image, mode="L").save(tmp / "images" / name)
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
    except OSError as err:
        raise UserError(
            f"cannot export the bundled digits to {root} ({write_problem(err)}); set "
            f"paths.data_dir=<a folder you can write>"
        ) from None
    return root
