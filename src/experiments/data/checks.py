"""Checks of the data module's options: one clear line per mistake, before any data is read."""

from __future__ import annotations

from experiments.data import sources
from experiments.errors import UserError

BUNDLED = ("digits", "image_csv", *sources.TORCHVISION)
SAMPLERS = ("shuffle", "balanced")


def check_options(
    dataset,
    csv_file,
    image_dir,
    batch_size,
    num_workers,
    cache_transformed,
    cache_max_mb,
    split,
    mixup_alpha,
    cutmix_alpha,
    val_fraction,
    test_fraction,
    sampler,
    switches: dict | None = None,
) -> None:
    """Raise a UserError naming the first option that is not valid (``switches``: options
    that take auto, true or false, by name)."""
    if isinstance(dataset, str) and dataset not in BUNDLED:
        raise UserError(f"data.dataset={dataset!r} is not valid; use one of {BUNDLED}")
    if dataset == "image_csv" and not (csv_file and image_dir):
        raise UserError("data=image_csv needs data.csv_file=<csv> and data.image_dir=<folder>")
    if int(batch_size) < 1:
        raise UserError(f"data.batch_size must be >= 1, got {batch_size}")
    if int(num_workers) < 0:
        raise UserError(f"data.num_workers must be >= 0, got {num_workers}")
    for key, value in {"cache_transformed": cache_transformed, **(switches or {})}.items():
        if (
            value not in (True, False, "auto")
            or isinstance(value, int | float)
            and not isinstance(value, bool)
        ):
            raise UserError(f"data.{key}={value!r} is not valid; use auto, true or false")
    if float(cache_max_mb) < 0:
        raise UserError(f"data.cache_max_mb must be >= 0, got {cache_max_mb}")
    if split not in ("stratified", "random"):
        raise UserError(f"data.split={split!r} is not valid; use stratified or random")
    if float(mixup_alpha) < 0 or float(cutmix_alpha) < 0:
        raise UserError("data.mixup_alpha and data.cutmix_alpha must be >= 0 (0 turns off)")
    for key, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 <= float(value) < 1.0:
            raise UserError(f"data.{key} must be in [0, 1), got {value}")
    if sampler not in SAMPLERS:
        raise UserError(f"data.sampler={sampler!r} is not valid; use one of {SAMPLERS}")
