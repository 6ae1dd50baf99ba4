"""Image files decoded as data: behind Pillow's decompression-bomb limit, with 16-bit and
float grayscale scaled to 8 bits (never clipped), and any decoder error one line naming the
file."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from experiments.errors import UserError, one_line


def _opened(path: str | os.PathLike, use: Callable[[Image.Image], Any]) -> Any:
    """``use`` of the image at ``path`` opened behind the decompression-bomb limit: Pillow
    only warns between ``MAX_IMAGE_PIXELS`` and twice that, and would then decode it; we
    refuse both."""
    try:
        with open(path, "rb") as f, warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(f) as im:
                return use(im)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise UserError(
            f"cannot read image {path}: refused as a decompression bomb ({one_line(err)})"
        ) from None
    except Exception as err:  # noqa: BLE001
        # a decoder handed a hostile file raises many types (OSError, SyntaxError,
        # struct.error, zlib.error, IndexError, ...): each means the file is not a readable
        # image, and must be one line naming it rather than a traceback from a worker
        raise UserError(f"cannot read image {path}: {one_line(err)}") from None


def _eight_bit(im: Image.Image) -> Image.Image:
    """16-bit and float grayscale as 8-bit ``L``, scaled (``convert`` would clip: a 16-bit
    image of 0..65535 became all but white)."""
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
    return _opened(path, lambda im: _eight_bit(im).convert(mode))


def _mode_and_size(im: Image.Image) -> tuple[str, tuple[int, int]]:
    gray = im.mode in ("1", "L", "LA", "I", "F") or im.mode.startswith("I;16")
    return "L" if gray else "RGB", (im.height, im.width)


def peek_image(path: str | os.PathLike) -> tuple[str, tuple[int, int]]:
    """Mode (``"L"`` or ``"RGB"``) and ``(height, width)`` of one image file (its header only).

    Raises:
        UserError: naming the file: unreadable, not an image, or a decompression bomb.
    """
    return _opened(path, _mode_and_size)
