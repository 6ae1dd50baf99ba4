"""The CSV index of an image folder read as data: UTF-8 text (a BOM allowed), file names
that stay inside the image folder and appear once, labels that are plain integers or names,
at most ``MAX_CLASSES`` classes. Every refusal is a UserError naming the CSV line."""

from __future__ import annotations

import csv
import io
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

from experiments.errors import UserError

log = logging.getLogger(__name__)

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


def csv_text(csv_file: Path) -> str:
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


def read_index(csv_file: Path) -> tuple[list[str], list[str], list[int]]:
    """``(file names, labels, line numbers)`` of the CSV's rows."""
    reader = csv.DictReader(io.StringIO(csv_text(csv_file), newline=""))
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


def checked_names(
    csv_file: Path, image_dir: Path, files: list[str], labels: list[str], lines: list[int]
) -> list[str]:
    """The file names normalized (``a/./b.png`` -> ``a/b.png``), each a relative path that
    stays inside ``image_dir`` and listed once.

    A file listed twice is refused even with the same label: the copy weighs double in
    training and, split independently, can land in both the training and the test split,
    so the test score is partly a memory test.
    """
    names, first_row, folder = [], {}, f"data.image_dir={image_dir}"
    for name, label, line in zip(files, labels, lines, strict=True):
        norm, problem = os.path.normpath(name), None
        if "\0" in name:
            problem = "holds a NUL byte"
        elif os.path.isabs(name):
            problem = f"is an absolute path; file names must be relative to {folder}"
        elif norm in (os.curdir, os.pardir) or norm.startswith(os.pardir + os.sep):
            problem = f"leads outside {folder}; file names must be relative paths inside it"
        if problem:
            raise UserError(f"{csv_file} row {line}: file name {_short(name, 200)} {problem}")
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


def encode_labels(
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
                f"{csv_file} row {line}: label {_short(label)} was not seen in the training data "
                f"(known classes: {', '.join(classes[:20])}{' ...' if len(classes) > 20 else ''})"
            )
        targets.append(index[key])
    return classes, targets
