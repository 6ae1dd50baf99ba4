#!/usr/bin/env python3
"""Derive a training CSV (``filename,label``, for ``data=image_csv``) from another: a
balanced labelled subset, or a long-tailed (imbalanced) one. The rows point at the same
image files and keep their order in the input; which rows are kept depends on ``--seed``.

  # 100 images per class: a 1,000-image Fashion-MNIST subset for fine-tuning
  python scripts/subset_csv.py data/fashion_mnist_png/train.csv --per-class 100
  # 10:1 long-tailed Fashion-MNIST (class c of K keeps n * 10 ** (-c / (K - 1)) rows)
  python scripts/subset_csv.py data/fashion_mnist_png/train.csv --imbalance 10

``--classes a,b,...`` first keeps only the rows of those classes (e.g. four similar classes
of Fashion-MNIST). ``--profile step`` keeps n rows for the first half of the classes and
n / R for the rest;
``--order a,b,...`` sets the class order from frequent to rare (default: the order the
data module gives the classes: numeric when every label is an integer, else by name).
n is the smallest class' count in the input. Writes ``<input stem>_per<N>.csv`` or
``<input stem>_lt<R>_<profile>.csv`` next to the input unless ``--out`` says otherwise.
Exit 2 with one ``error:`` line on bad input.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from pathlib import Path
from typing import NoReturn

import numpy as np


class Refused(Exception):
    """Bad input: printed as one ``error:`` line, exit 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage block
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def read_rows(path: Path) -> list[tuple[str, str]]:
    """``(filename, label)`` of every row, stripped as the data module strips them."""
    if not path.is_file():
        raise Refused(f"CSV file not found: {path}")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in ("filename", "label") if c not in (reader.fieldnames or [])]
        if missing:
            raise Refused(
                f"{path} lacks the column(s) {','.join(missing)} (header: filename,label)"
            )
        rows = [((r["filename"] or "").strip(), (r["label"] or "").strip()) for r in reader]
    for line, (name, label) in enumerate(rows, start=2):
        if not name or not label:
            raise Refused(f"{path} row {line}: empty filename or label")
    if not rows:
        raise Refused(f"{path} has no rows after the header")
    return rows


def class_key(label: str, numeric: bool) -> str:
    return str(int(label)) if numeric else label  # "07" and "7" are one class, as in the loader


def class_order(classes: set[str], numeric: bool, order: str | None) -> list[str]:
    """The classes from frequent to rare: ``--order`` if given, else the data module's order."""
    if order is None:
        return sorted(classes, key=int) if numeric else sorted(classes)
    wanted = [c.strip() for c in order.split(",")]
    if numeric:
        wanted = [class_key(c, True) if c.lstrip("-").isdigit() else c for c in wanted]
    unknown = [c for c in wanted if c not in classes]
    missing = sorted(classes - set(wanted), key=int if numeric else str)
    doubled = sorted({c for c in wanted if wanted.count(c) > 1})
    named = (("unknown", unknown), ("missing", missing), ("repeated", doubled))
    problems = [f"{what} {','.join(names)}" for what, names in named if names]
    if problems:
        raise Refused(f"--order must name each class once: {'; '.join(problems)}")
    return wanted


def keep_classes(rows: list[tuple[str, str]], names: str, numeric: bool) -> list[tuple[str, str]]:
    """Only the rows whose class is one of the comma-separated ``names`` (each must occur)."""
    wanted = {c.strip() for c in names.split(",")}
    if numeric:
        wanted = {class_key(c, True) if c.lstrip("-").isdigit() else c for c in wanted}
    present = {class_key(label, numeric) for _, label in rows}
    unknown = sorted(wanted - present)
    if unknown or len(wanted) < 2:
        why = f"unknown {','.join(unknown)}" if unknown else "name at least two"
        raise Refused(f"--classes {names}: {why} (classes: {','.join(sorted(present))})")
    return [row for row in rows if class_key(row[1], numeric) in wanted]


def target_sizes(
    counts: dict[str, int], classes: list[str], args: argparse.Namespace
) -> dict[str, int]:
    """How many rows each class keeps; ``classes`` runs from frequent to rare."""
    if args.per_class is not None:
        if args.per_class < 1:
            raise Refused(f"--per-class must be >= 1, got {args.per_class}")
        short = [f"class {c!r} has {counts[c]}" for c in classes if counts[c] < args.per_class]
        if short:
            raise Refused(f"--per-class {args.per_class}: too few rows: {', '.join(short)}")
        return dict.fromkeys(classes, args.per_class)
    ratio, k, n = args.imbalance, len(classes), min(counts.values())
    if not (math.isfinite(ratio) and ratio >= 1):
        raise Refused(f"--imbalance must be a number >= 1, got {ratio:g}")
    if args.profile == "exp":
        sizes = [round(n * ratio ** (-c / max(k - 1, 1))) for c in range(k)]
    else:
        sizes = [n if c < k // 2 else round(n / ratio) for c in range(k)]
    return {c: max(size, 1) for c, size in zip(classes, sizes, strict=True)}


def write_csv(out: Path, rows: list[tuple[str, str]]) -> None:
    """Write ``rows`` under a header, atomically (a temporary sibling, then ``os.replace``)."""
    if not out.parent.is_dir():
        raise Refused(f"output folder not found: {out.parent}")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "x", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(["filename", "label"])
            writer.writerows(rows)
        os.replace(tmp, out)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise Refused(f"cannot write {out}: {err.strerror or err}") from None


def run(args: argparse.Namespace) -> str:
    if (args.per_class is None) == (args.imbalance is None):
        raise Refused("give exactly one of --per-class N or --imbalance R")
    rows = read_rows(args.input)
    numeric = all(label.lstrip("-").isdigit() for _, label in rows)
    if args.classes is not None:
        rows = keep_classes(rows, args.classes, numeric)
    by_class: dict[str, list[int]] = {}
    for i, (_, label) in enumerate(rows):
        by_class.setdefault(class_key(label, numeric), []).append(i)
    classes = class_order(set(by_class), numeric, args.order)
    sizes = target_sizes({c: len(v) for c, v in by_class.items()}, classes, args)
    if args.per_class is not None:
        name = f"{args.input.stem}_per{args.per_class}.csv"
    else:
        name = f"{args.input.stem}_lt{args.imbalance:g}_{args.profile}.csv"
    out: Path = args.out or args.input.with_name(name)
    if out.resolve() == args.input.resolve():
        raise Refused(f"--out {out} would overwrite the input")
    # One permutation per class, drawn in the default class order whatever --order says, so
    # a class's rows depend on the seed alone and smaller subsets are prefixes of larger ones.
    rng = np.random.default_rng(args.seed)
    keep: list[int] = []
    for c in class_order(set(by_class), numeric, None):
        perm = rng.permutation(len(by_class[c]))
        keep.extend(by_class[c][int(j)] for j in perm[: sizes[c]])
    write_csv(out, [rows[i] for i in sorted(keep)])
    report = f"{out}: {len(keep)} rows ({', '.join(f'{c}={sizes[c]}' for c in classes)})"
    if args.imbalance is not None:
        report += f", max/min {max(sizes.values()) / min(sizes.values()):.2f}"
    return report


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("input", type=Path, help="CSV with columns filename,label")
    parser.add_argument("--per-class", type=int, help="keep N rows of every class")
    parser.add_argument("--imbalance", type=float, help="long-tailed: frequent/rare ratio R >= 1")
    parser.add_argument("--profile", choices=("exp", "step"), default="exp")
    parser.add_argument("--classes", help="comma-separated labels: keep only these classes")
    parser.add_argument("--order", help="comma-separated labels, frequent to rare")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="output CSV (default: next to the input)")
    args = parser.parse_args(argv)
    try:
        print(run(args))
    except Refused as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
