"""Segmentation data: images with a class per pixel. A seeded generator of shapes (circles,
squares, triangles) on noisy backgrounds -- the set the tests and the docs share, made in
memory, nothing downloads -- or a folder of your own image and mask PNGs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import torch

from experiments.config.hints import Ge, Le
from experiments.data.datasets import read_image
from experiments.data.loaders import SplitLoaders
from experiments.errors import UserError

SHAPES = ("background", "circle", "square", "triangle")


def generate_shapes(
    n: int, size: int = 32, seed: int = 0, noise: float = 0.1, max_shapes: int = 3
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` images ``(n, 1, size, size)`` float32 in [0, 1] and their masks ``(n, size,
    size)`` int64 (0 background, 1 circle, 2 square, 3 triangle: ``SHAPES``).

    Each image has 1 to ``max_shapes`` shapes of random kind, place, size (radius ``size/8``
    to ``size/4``) and brightness on a background of random brightness, plus Gaussian pixel
    noise of std ``noise``. Shapes do not touch: a shape whose box (and a pixel around it)
    would meet one already drawn is placed again, and left out after 20 tries, so every
    shape is seen whole. The same arguments give the same images on every machine (numpy's
    seeded PCG64)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    images = np.empty((n, size, size), dtype=np.float64)
    masks = np.zeros((n, size, size), dtype=np.int64)
    low, high = max(2, size // 8), max(3, size // 4)
    for i in range(n):
        image = np.full((size, size), rng.uniform(0.0, 0.35))
        taken = np.zeros((size, size), dtype=bool)
        for _ in range(rng.integers(1, max_shapes + 1)):
            kind = int(rng.integers(1, len(SHAPES)))
            r = int(rng.integers(low, high + 1))
            for _ in range(20):
                cy, cx = (int(v) for v in rng.integers(r, size - r, size=2))
                box = (slice(max(cy - r - 1, 0), cy + r + 2), slice(max(cx - r - 1, 0), cx + r + 2))
                if not taken[box].any():
                    break
            else:
                continue
            taken[box] = True
            dy, dx = yy - cy, xx - cx
            if kind == 1:
                inside = dy * dy + dx * dx <= r * r
            elif kind == 2:
                inside = (np.abs(dy) <= r) & (np.abs(dx) <= r)
            else:  # apex up: half-width grows from 0 at the top row to r at the bottom
                inside = (dy >= -r) & (dy <= r) & (2 * np.abs(dx) <= dy + r)
            masks[i][inside] = kind
            image[inside] = rng.uniform(0.55, 1.0)
        images[i] = image
    images += rng.normal(scale=noise, size=images.shape)
    pixels = torch.from_numpy(np.clip(images, 0.0, 1.0)).float().unsqueeze(1)
    return pixels, torch.from_numpy(masks)


def read_folder(
    folder: str | Path, num_classes: int, size: Sequence[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Images ``(N, 1, H, W)`` in [0, 1], masks ``(N, H, W)`` and file names of a folder
    with ``images/`` and ``masks/``: each ``images/<name>`` (any image format, read as
    grayscale) has ``masks/<stem>.png`` whose pixel values are class indices. ``size``
    ``(H, W)`` resizes images (bilinear) and masks (nearest); None: all must share one.

    Raises:
        UserError: a missing folder or mask, a mask whose size differs from its image's, a
            class index of ``num_classes`` or more, images of different sizes; each names
            the file.
    """
    folder = Path(folder)
    image_dir, mask_dir = folder / "images", folder / "masks"
    for sub in (image_dir, mask_dir):
        if not sub.is_dir():
            raise UserError(f"data.folder={folder}: no {sub.name}/ inside (images/ and masks/)")
    files = sorted(p for p in image_dir.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise UserError(f"data.folder={folder}: images/ is empty")
    images, masks = [], []
    for path in files:
        mask_path = mask_dir / (path.stem + ".png")
        if not mask_path.is_file():
            raise UserError(f"{path}: no mask {mask_path} (a PNG of class indices per pixel)")
        image = read_image(path, "L")
        mask = read_image(mask_path, "L")
        if mask.size != image.size:  # PIL sizes are (W, H)
            raise UserError(
                f"{mask_path}: mask is {mask.size[1]}x{mask.size[0]} (HxW) but its image "
                f"{path.name} is {image.size[1]}x{image.size[0]}; a mask must match its image"
            )
        if size is not None and image.size != tuple(size)[::-1]:
            image = image.resize(tuple(size)[::-1], resample=2)  # bilinear
            mask = mask.resize(tuple(size)[::-1], resample=0)  # nearest: indices stay indices
        values = np.asarray(mask, dtype=np.int64)
        if values.max() >= num_classes:
            raise UserError(
                f"{mask_path}: class index {int(values.max())} in the mask; data.class_names "
                f"has {num_classes} classes (0..{num_classes - 1})"
            )
        if images and values.shape != masks[0].shape:
            raise UserError(
                f"{path}: {values.shape[0]}x{values.shape[1]}, but {files[0].name} is "
                f"{masks[0].shape[0]}x{masks[0].shape[1]}; set data.image_size=[H,W]"
            )
        images.append(np.asarray(image, dtype=np.float32) / 255.0)
        masks.append(values)
    x = torch.from_numpy(np.stack(images)).unsqueeze(1)
    return x, torch.from_numpy(np.stack(masks)), [p.name for p in files]


@dataclass(eq=False, repr=False, kw_only=True)
class ShapesData(SplitLoaders):
    """Batches of ``(images (B, 1, H, W) in [0, 1], masks (B, H, W) int64)``, split
    train/val/test with a seed (the split and loader keys: ``SplitLoaders``).

    Args:
        folder: a folder with ``images/`` and ``masks/`` (``read_folder``); None: the
            generated shapes.
        samples: generated images (all splits together).
        image_size: ``[H, W]`` of a generated image (square: H = W); with ``folder``,
            resize to it (None: as read).
        noise: std of the generated images' pixel noise.
        data_seed: the generator's seed: which images (the training seed does not move it).
        class_names: one name per class index; None: ``SHAPES``.
    """

    unit = "images"
    no_augment = (
        "data.augment: an image augmentation would move images without their masks: augment=none"
    )

    folder: str | None = None
    samples: Annotated[int, Ge(3)] = 1000
    image_size: Sequence[int] | None = (32, 32)
    noise: Annotated[float, Ge(0), Le(1)] = 0.1
    max_shapes: Annotated[int, Ge(1)] = 3
    data_seed: int = 0
    class_names: list[str] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        size = None if self.image_size is None else [int(v) for v in self.image_size]
        if size is not None and (len(size) != 2 or min(size) < 8):
            raise UserError(f"data.image_size={self.image_size}: expected [H, W], each at least 8")
        if self.folder is None and (size is None or size[0] != size[1]):
            raise UserError(
                f"data.image_size={self.image_size}: the generated shapes need a square [S, S]"
            )
        self.image_size = size
        self.class_names = list(SHAPES if self.class_names is None else self.class_names)
        if len(self.class_names) < 2:
            raise UserError("data.class_names: at least two (the background and one class)")
        self.file_names: list[str] = []

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of an image; known after ``setup``."""
        return tuple(self.train_set.tensors[0].shape[1:])

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:  # build sets the data up before the trainer does
            return
        if self.folder is None:
            images, masks = generate_shapes(
                self.samples, self.image_size[0], self.data_seed, self.noise, self.max_shapes
            )
            if self.class_names != list(SHAPES):
                raise UserError(
                    f"data.class_names: the generated shapes have {list(SHAPES)}; other names "
                    f"need data.folder"
                )
        else:
            images, masks, self.file_names = read_folder(
                self.folder, self.num_classes, self.image_size
            )
        self.split(images, masks)
