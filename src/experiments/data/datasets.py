"""Datasets that know nothing of Lightning: a lazy CSV-indexed image folder and the
bundled scikit-learn digits, exported once to PNG files so they take the same path."""

from __future__ import annotations

import csv
import io
import logging
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from PIL import Image
from torch.utils.data import Dataset

from experiments.errors import UserError, one_line

log = logging.getLogger(__name__)

IMAGE_MODES = ("L", "RGB")
# more classes than any classification set we know of; above it a label column is almost
# surely wrong (an id, a float, a file name), and an integer label of 10^9 would otherwise
# build 10^9 class names until the process is killed
MAX_CLASSES = 10_000
# a plain integer label: ASCII digits only ('²'.isdigit() is True, but int('²') fails)
_INTEGER = re.compile(r"-?[0-9]+")


def _as_int(label: str) -> int:
    """A plain integer label's value; one of more than 12 digits counts as out of range
    without parsing (``int`` of 5000 digits raises, and no class index is that large)."""
    return int(label) if len(label) <= 12 else MAX_CLASSES * (-1 if label[0] == "-" else 1)


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

        self.follow_symlinks = bool(follow_symlinks)
        # symlinks are judged against the folder's real place (image_dir may itself be one)
        self._root = self.image_dir.resolve()
        self._inside_dirs: dict[str, bool] = {}

        files, raw_labels, self.lines = _read_index(self.csv_file)
        self.files = files
        self._names = _checked_names(self.csv_file, self.image_dir, files, raw_labels, self.lines)
        self.classes, self.targets = _encode_labels(self.csv_file, raw_labels, self.lines, classes)
        if check_files:
            for i in range(len(files)):
                path = self.path(i)
                if not path.is_file():
                    # a folder, a FIFO (whose read would block) or a device is no image
                    what = "is not a regular file" if path.exists() else "does not exist"
                    raise UserError(
                        f"{self.csv_file} row {self.lines[i]}: image {self.image_dir / files[i]} "
                        f"{what}"
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
        path = self.image_dir / name
        if self.follow_symlinks:
            return path
        parent = os.path.dirname(name)
        # one lstat for a file directly in the folder; a subfolder is resolved once
        leaves = parent and not self._dir_inside(parent)
        if leaves or path.is_symlink():
            target = path.resolve()
            if not target.is_relative_to(self._root):
                raise UserError(
                    f"{self.csv_file} row {self.lines[index]}: {self.files[index]!r} leads "
                    f"through a symlink to {target}, outside data.image_dir={self.image_dir}; "
                    f"move the file inside or set data.follow_symlinks=true"
                )
        return path

    def _dir_inside(self, parent: str) -> bool:
        inside = self._inside_dirs.get(parent)
        if inside is None:
            inside = (self.image_dir / parent).resolve().is_relative_to(self._root)
            self._inside_dirs[parent] = inside
        return inside

    def load_image(self, index: int) -> Image.Image:
        """Decode image ``index`` (converted and resized as configured), without transforms."""
        if index in self._decoded:
            return self._decoded[index]
        path = self.path(index)
        try:
            image = decode(path, self.image_mode)
        except UserError as err:
            raise UserError(f"{self.csv_file} row {self.lines[index]}: {err}") from None
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


def _csv_text(csv_file: Path) -> str:
    """The CSV as text: UTF-8, a BOM allowed (Excel writes one); anything else is one line
    naming the line of the first byte that is not UTF-8."""
    try:
        raw = csv_file.read_bytes()
    except OSError as err:
        raise UserError(
            f"{csv_file}: cannot read it ({err.strerror or type(err).__name__})"
        ) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise UserError(
            f"{csv_file} line {line}: not UTF-8 text (byte 0x{raw[err.start]:02x}; Latin-1 or "
            f"Windows-1252 perhaps): save the CSV as UTF-8"
        ) from None


def _read_index(csv_file: Path) -> tuple[list[str], list[str], list[int]]:
    """``(file names, labels, line numbers)`` of the CSV's rows."""
    reader = csv.DictReader(io.StringIO(_csv_text(csv_file), newline=""))
    files, labels, lines, padded = [], [], [], set()
    try:
        fields = [c.strip() for c in reader.fieldnames or []]
        if "filename" not in fields or "label" not in fields:
            raise UserError(
                f"{csv_file}: header must have 'filename' and 'label' columns, found {fields}"
            )
        reader.fieldnames = fields
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
            lines.append(row)
    except csv.Error as err:  # a NUL byte, a field past csv's size limit, a stray quote
        # DictReader copies line_num only after a row parsed; its reader's is current
        line = reader.reader.line_num
        raise UserError(f"{csv_file} line {line}: not valid CSV ({err})") from None
    if not files:
        raise UserError(f"{csv_file}: no rows (expected 'filename,label' lines after the header)")
    if padded:
        shown = ", ".join(repr(p) for p in sorted(padded)[:5])
        log.warning("%s: labels with surrounding spaces were stripped: %s", csv_file, shown)
    return files, labels, lines


def _short(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "...")


def _checked_names(
    csv_file: Path, image_dir: Path, files: list[str], labels: list[str], lines: list[int]
) -> list[str]:
    """The file names normalized (``a/./b.png`` -> ``a/b.png``), each a relative path that
    stays inside ``image_dir`` and listed once.

    A file listed twice is refused even with the same label: the copy weighs double in
    training and, split independently, can land in both the training and the test split,
    so the test score is partly a memory test.
    """
    names, first_row = [], {}
    for name, label, line in zip(files, labels, lines, strict=True):
        if "\0" in name:
            raise UserError(
                f"{csv_file} row {line}: file name {_short(name, 200)} holds a NUL byte"
            )
        if os.path.isabs(name):
            raise UserError(
                f"{csv_file} row {line}: file name {_short(name, 200)} is an absolute path; file "
                f"names must be relative to data.image_dir={image_dir}"
            )
        norm = os.path.normpath(name)
        if norm == os.curdir or norm == os.pardir or norm.startswith(os.pardir + os.sep):
            raise UserError(
                f"{csv_file} row {line}: file name {_short(name, 200)} leads outside "
                f"data.image_dir={image_dir}; file names must be relative paths inside it"
            )
        if norm in first_row:
            i = first_row[norm]
            same = labels[i] == label
            raise UserError(
                f"{csv_file} rows {lines[i]} and {line}: {_short(norm, 200)} is listed twice "
                + (f"(both {label!r})" if same else f"(as {labels[i]!r} and {label!r})")
                + "; list each file once (a copy can end up in both training and test)"
            )
        first_row[norm] = len(names)
        names.append(norm)
    return names


def _encode_labels(
    csv_file: Path, raw: list[str], lines: list[int], classes: Sequence[str] | None
) -> tuple[list[str], list[int]]:
    numeric = all(_INTEGER.fullmatch(s) for s in raw)
    if classes is None:
        if numeric:
            for s, line in zip(raw, lines, strict=True):
                if not 0 <= _as_int(s) < MAX_CLASSES:
                    shown = s if len(s) <= 20 else s[:20] + "..."
                    raise UserError(
                        f"{csv_file} row {line}: integer label {shown} is not a class "
                        f"index in 0..{MAX_CLASSES - 1} (integer labels are class indices, at most "
                        f"{MAX_CLASSES} classes); write class names for ids outside that range"
                    )
            classes = [str(i) for i in range(max(_as_int(s) for s in raw) + 1)]
        else:
            classes = sorted(set(raw))
            if len(classes) > MAX_CLASSES:
                raise UserError(
                    f"{csv_file}: {len(classes)} distinct labels, more than the {MAX_CLASSES} "
                    f"classes allowed; is the label column the class of each image?"
                )
        if len(set(raw)) < 2:
            raise UserError(
                f"{csv_file}: needs at least 2 classes to classify, found 1 ({raw[0]!r} on "
                f"every row)"
            )
    classes = [str(c) for c in classes]
    index = {name: i for i, name in enumerate(classes)}
    targets = []
    for line, label in zip(lines, raw, strict=True):
        key = str(_as_int(label)) if numeric else label
        if key not in index:
            raise UserError(
                f"{csv_file} row {line}: label {_short(label)} was not seen in the training "
                f"data (known classes: {', '.join(classes[:20])}"
                f"{' ...' if len(classes) > 20 else ''})"
            )
        targets.append(index[key])
    return classes, targets


def _open(f) -> Image.Image:
    """``Image.open`` behind the decompression-bomb limit: Pillow only warns between
    ``MAX_IMAGE_PIXELS`` and twice that, and would then decode it; we refuse both."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        return Image.open(f)


def _eight_bit(im: Image.Image) -> Image.Image:
    """16-bit and float grayscale as 8-bit ``L``, scaled (``convert`` would clip: a 16-bit
    image of 0..65535 became all but white)."""
    import numpy as np

    if not (im.mode.startswith("I;16") or im.mode in ("I", "F")):
        return im
    pixels = np.asarray(im)
    if im.mode == "F":
        if not (np.isfinite(pixels).all() and pixels.min() >= 0 and pixels.max() <= 1):
            raise ValueError("float pixels outside 0..1; save it as an 8- or 16-bit image")
        return Image.fromarray((pixels * 255.0).round().astype(np.uint8))
    if pixels.min() < 0 or pixels.max() > 65535:
        raise ValueError("32-bit pixels outside 0..65535; save it as an 8- or 16-bit image")
    return Image.fromarray((pixels.astype(np.float32) / 257.0).round().astype(np.uint8))


def decode(path: str | os.PathLike, mode: str) -> Image.Image:
    """The image at ``path`` decoded and converted to ``mode`` (``L`` or ``RGB``), 16-bit and
    float images scaled to 8 bits (see ``CsvImageDataset``).

    Raises:
        UserError: naming the file and the problem (missing, unreadable, truncated, not an
            image, past the decompression-bomb limit, pixel values out of range).
    """
    try:
        with open(path, "rb") as f, _open(f) as im:
            return _eight_bit(im).convert(mode)
    except UserError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise UserError(
            f"cannot read image {path}: refused as a decompression bomb ({one_line(err)})"
        ) from None
    except Exception as err:  # noqa: BLE001
        # a decoder handed a hostile file raises many types (OSError, SyntaxError,
        # struct.error, zlib.error, IndexError, ...): each means the file is not a readable
        # image, and must be one line naming it rather than a traceback from a worker
        raise UserError(f"cannot read image {path}: {one_line(err)}") from None


def peek_image(path: str | os.PathLike) -> tuple[str, tuple[int, int]]:
    """Mode (``"L"`` or ``"RGB"``) and ``(height, width)`` of one image file (its header only).

    Raises:
        UserError: naming the file: unreadable, not an image, or a decompression bomb.
    """
    try:
        with open(path, "rb") as f, _open(f) as im:
            gray = im.mode in ("1", "L", "LA", "I", "F") or im.mode.startswith("I;16")
            return "L" if gray else "RGB", (im.height, im.width)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise UserError(
            f"cannot read image {path}: refused as a decompression bomb ({one_line(err)})"
        ) from None
    except Exception as err:  # noqa: BLE001  (as in decode: any decoder error is the file's)
        raise UserError(f"cannot read image {path}: {one_line(err)}") from None


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
