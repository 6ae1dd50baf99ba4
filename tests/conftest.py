"""Shared fixtures: composed configs pointed at temp dirs, small image folders on disk."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from PIL import Image

from experiments.config import CONF_DIR

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """One data dir per test session (the digits export is made once and reused)."""
    path = tmp_path_factory.mktemp("data")
    from experiments.data import export_digits

    export_digits(path / "digits")
    return path


@pytest.fixture
def make_cfg(tmp_path, data_dir):
    """Compose ``train.yaml`` with overrides, data and outputs under temp dirs."""

    def _make(*overrides: str, config_name: str = "train") -> DictConfig:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(
                config_name,
                overrides=[
                    f"paths.data_dir={data_dir}",
                    f"paths.log_dir={tmp_path / 'outputs'}",
                    f"paths.output_dir={tmp_path / 'run'}",
                    "paths.sweep_group=null",
                    "paths.job_name=null",
                    *overrides,
                ],
            )
        return cfg

    return _make


def write_image_folder(
    root: Path, n: int = 40, classes=("cat", "dog"), size=(12, 10), mode="RGB", vary=False
) -> tuple[Path, Path]:
    """A folder of random images + ``labels.csv`` with string labels. Returns (csv, dir)."""
    rng = np.random.default_rng(0)
    image_dir = root / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        label = classes[i % len(classes)]
        h, w = size if not vary or i % 3 else (size[0] + 5, size[1] + 3)
        shape = (h, w, 3) if mode == "RGB" else (h, w)
        # class-dependent brightness, so there is something to learn
        base = 60 + 120 * (i % len(classes))
        pixels = np.clip(rng.normal(base, 30, shape), 0, 255).astype("uint8")
        Image.fromarray(pixels, mode=mode).save(image_dir / f"img_{i:03d}.png")
        rows.append((f"img_{i:03d}.png", label))
    csv_file = root / "labels.csv"
    with open(csv_file, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["filename", "label"])
        writer.writerows(rows)
    return csv_file, image_dir


def run_cli(*args: str, cwd: Path, timeout: float = 300, env_extra: dict | None = None):
    """Run ``python -m experiments.train ...`` (or another module via args) in a subprocess."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
