#!/usr/bin/env python3
"""Derive a training CSV (``filename,label``, for ``data=image_csv``) from another: a
balanced labelled subset, or a long-tailed (imbalanced) one. The rows point at the same
image files; which rows are kept depends on ``--seed`` alone.

  # 100 images per class: a 1,000-image Fashion-MNIST subset for fine-tuning
  python scripts/subset_csv.py data/fashion_mnist_png/train.csv --per-class 100
  # 10:1 long-tailed Fashion-MNIST (class c of K keeps n * 10 ** (-c / (K - 1)) rows)
  python scripts/subset_csv.py data/fashion_mnist_png/train.csv --imbalance 10

``--profile step`` keeps n rows for the first half of the classes and n / R for the rest;
``--order a,b,...`` sets the class order from frequent to rare (default: the order the
data module gives the classes: numeric when every label is an integer, else by name).
n is the smallest class' count in the input. Writes ``<input stem>_per<N>.csv`` or
``<input stem>_lt<R>_<profile>.csv`` next to the input unless ``--out`` says otherwise.
Exit 2 with one ``error:`` line on bad input.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
from pathlib import Path

import numpy as np


class Refused(Exception):
    """Bad input: printed as one line, exit 2."""


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise Refused(f"CSV file not found: {path}")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if not {"filename", "label"} <= set(reader.fieldnames or []):
            raise Refused(f"{path} needs the columns filename,label; has {reader.fieldnames}")
        return list(reader)


def class_order(labels: set[str], order: str | None) -> list[str]:
    if order:
        wanted = [c.strip() for c in order.split(",")]
        if set(wanted) != labels or len(wanted) != len(labels):
            raise Refused(f"--order must name each class once; the classes are {sorted(labels)}")
        return wanted
    if all(c.lstrip("-").isdigit() for c in labels):
        return sorted(labels, key=int)
    return sorted(labels)


def targets(counts: dict[str, int], classes: list[str], args) -> dict[str, int]:
    if args.per_class is not None:
        short = [f"{c} has {counts[c]}" for c in classes if counts[c] < args.per_class]
        if short or args.per_class < 1:
            raise Refused(f"--per-class {args.per_class}: too few rows ({', '.join(short)})")
        return {c: args.per_class for c in classes}
    ratio, k = args.imbalance, len(classes)
    if ratio < 1:
        raise Refused(f"--imbalance {ratio}: the ratio must be >= 1")
    n = min(counts.values())
    if args.profile == "exp":
        sizes = [round(n * ratio ** (-i / max(k - 1, 1))) for i in range(k)]
    else:
        sizes = [n if i < k // 2 else round(n / ratio) for i in range(k)]
    return {c: max(size, 1) for c, size in zip(classes, sizes, strict=True)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", type=Path)
    parser.add_argument("--per-class", type=int)
    parser.add_argument("--imbalance", type=float)
    parser.add_argument("--profile", choices=("exp", "step"), default="exp")
    parser.add_argument("--order")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    try:
        if (args.per_class is None) == (args.imbalance is None):
            raise Refused("give exactly one of --per-class N or --imbalance R")
        rows = read_rows(args.input)
        by_class: dict[str, list[int]] = {}
        for i, row in enumerate(rows):
            by_class.setdefault(row["label"], []).append(i)
        classes = class_order(set(by_class), args.order)
        sizes = targets({c: len(v) for c, v in by_class.items()}, classes, args)
        rng = np.random.default_rng(args.seed)
        keep: set[int] = set()
        for c in classes:  # one permutation per class, in class order: a function of seed
            picked = rng.permutation(by_class[c])[: sizes[c]]
            keep.update(int(i) for i in picked)
    except Refused as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.per_class is not None:
        name = f"{args.input.stem}_per{args.per_class}.csv"
    else:
        name = f"{args.input.stem}_lt{args.imbalance:g}_{args.profile}.csv"
    out = args.out or args.input.with_name(name)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    with os.fdopen(fd, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["filename", "label"])
        writer.writerows((rows[i]["filename"], rows[i]["label"]) for i in sorted(keep))
    os.replace(tmp, out)
    counts = ", ".join(f"{c}={sizes[c]}" for c in classes)
    ratio = max(sizes.values()) / min(sizes.values())
    print(f"{out}: {len(keep)} rows ({counts}; max/min {ratio:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
