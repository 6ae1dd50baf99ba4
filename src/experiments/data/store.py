"""The batch-level data path: a split whose samples can all be cached is stacked once into
one tensor, and its batches are cut from it with no per-sample Python and no collate
(``experiments.data.loaders.StoreLoader``: one gather per chunk of batches, then views).
Random augmentation that works on a whole batch (shifts = crop with padding, horizontal
flips) then runs on the batch, on the model's device (``ImageData.on_after_batch_transfer``).

The order of samples stays the sampler's (seeded per epoch, exact mid-epoch resume, DDP
shards), and the augmentation draws from torch's global generator on the device, whose
state every checkpoint carries, so a resumed run draws what the uninterrupted one did.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset, Subset
from torchvision import tv_tensors

from experiments.data.transforms import RandomShift

log = logging.getLogger(__name__)


@dataclass(eq=False, repr=False)
class TensorStore(Dataset):
    """All samples of a split as two tensors: ``x`` (N, ...) and ``y`` (N, ...)."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index]

    @property
    def nbytes(self) -> int:
        return self.x.nbytes + self.y.nbytes

    def to(self, device) -> TensorStore:
        return TensorStore(self.x.to(device), self.y.to(device))


def stack(split: Dataset, max_mb: float, name: str) -> TensorStore | None:
    """``split``'s samples as one TensorStore, or None (with the reason logged) when they
    are not tensors of one shape or would take more than ``max_mb``."""
    if len(split) == 0:
        return None
    x0, y0 = split[0]
    if not isinstance(x0, torch.Tensor):
        return None
    y0 = torch.as_tensor(y0)
    size_mb = len(split) * (x0.nbytes + y0.nbytes) / 2**20
    if size_mb > max_mb:
        log.info("data: the %s split (%.0f MB as tensors) exceeds data.cache_max_mb=%g; its "
                 "batches are collated sample by sample", name, size_mb, max_mb)  # fmt: skip
        return None
    whole = _whole(split, x0.shape)
    if whole is not None:
        return TensorStore(*whole)
    x = torch.empty((len(split), *x0.shape), dtype=x0.dtype)
    y = torch.empty((len(split), *y0.shape), dtype=y0.dtype)
    for i in range(len(split)):
        xi, yi = split[i]
        if not isinstance(xi, torch.Tensor) or xi.shape != x0.shape:
            return None  # samples of different shapes: leave them to the collate
        x[i] = xi
        y[i] = torch.as_tensor(yi)
    return TensorStore(x, y)


def _raw(split: Dataset):
    """``(uint8 images (N, C, H, W), targets, transform)`` of the samples of ``split`` before
    their transform, or None when its dataset offers no such array: a torchvision-style
    set (``.data``, ``.targets``) or one with ``decoded_array`` (CsvImageDataset)."""
    subset = isinstance(split, Subset)
    base = split.dataset if subset else split
    targets = getattr(base, "targets", None)
    if targets is None or getattr(base, "target_transform", None) is not None:
        return None
    # a whole set is taken as it is (a view of its array), a subset by its indices
    pick = torch.as_tensor(list(split.indices), dtype=torch.long) if subset else None
    if hasattr(base, "decoded_array"):
        images = base.decoded_array(list(range(len(base))) if pick is None else pick.tolist())
    elif getattr(base, "data", None) is not None:
        images = torch.as_tensor(base.data)
        images = images if pick is None else images[pick]
    else:
        return None
    if images is None or images.ndim not in (3, 4) or images.dtype != torch.uint8:
        return None
    images = images.unsqueeze(1) if images.ndim == 3 else images.permute(0, 3, 1, 2)  # NCHW
    y = torch.as_tensor(targets)
    return images, y if pick is None else y[pick], getattr(base, "transform", None)


def _whole(split: Dataset, shape: torch.Size, chunk: int = 4096):
    """``(x, y)`` of a split made by running its transform on chunks of the raw uint8
    images at once (``_raw``), instead of one image at a time (MNIST's 70k: ~0.3 s instead
    of ~8 s). None when there is no raw array, or when a spot check finds any sample that
    differs from what indexing the split gives (then the caller goes sample by sample)."""
    try:
        raw = _raw(split)
        if raw is None:
            return None
        images, y, transform = raw
        parts = []
        for start in range(0, len(images), chunk):
            part = tv_tensors.Image(images[start : start + chunk].contiguous())
            parts.append(torch.as_tensor(transform(part) if transform is not None else part))
        x = torch.cat(parts)
    except Exception:  # a transform that takes PIL images only, odd arrays: sample by sample
        return None
    if x.shape[1:] != shape:
        return None
    gen = torch.Generator().manual_seed(len(split))
    probe = {0, len(split) - 1, *torch.randint(len(split), (14,), generator=gen).tolist()}
    for i in probe:
        xi, yi = split[i]
        if not (torch.equal(x[i], torch.as_tensor(xi)) and int(y[i]) == int(yi)):
            return None
    return x.as_subclass(torch.Tensor), y


def batch_augmenter(augment) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The whole-batch form of ``augment`` (None, RandomShift, RandomHorizontalFlip or a
    Compose of them), or None when some part of it has no batch form."""
    parts = [] if augment is None else [augment]
    if type(augment).__name__ == "Compose":
        parts = augment.transforms
    steps = []
    for part in parts:
        if isinstance(part, RandomShift) and part.padding_mode in _Shift.MODES:
            steps.append(_Shift(part.padding, part.padding_mode))
        elif type(part).__name__ == "RandomHorizontalFlip":
            steps.append(_Flip(float(part.p)))
        else:
            return None
    return _Chain(steps)


class _Chain:
    def __init__(self, steps) -> None:
        self.steps = steps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for step in self.steps:
            x = step(x)
        return x


class _Flip:
    """Mirror each image of a batch left-right with probability ``p``."""

    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flip = torch.rand(x.shape[0], device=x.device) < self.p
        return torch.where(flip.view(-1, *([1] * (x.ndim - 1))), x.flip(-1), x)


class _Shift:
    """Pad a batch (B, C, H, W) by ``padding`` and crop each image back to H x W at its own
    random offset: ``RandomShift`` for a whole batch in one gather."""

    MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}

    def __init__(self, padding: int, mode: str) -> None:
        self.padding, self.mode = int(padding), self.MODES[mode]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        p = self.padding
        if p == 0:
            return x
        b, _, h, w = x.shape
        padded = torch.nn.functional.pad(x, (p, p, p, p), mode=self.mode)
        dy = torch.randint(0, 2 * p + 1, (b, 1), device=x.device)
        dx = torch.randint(0, 2 * p + 1, (b, 1), device=x.device)
        rows = (dy + torch.arange(h, device=x.device)).view(b, 1, h, 1)
        cols = (dx + torch.arange(w, device=x.device)).view(b, 1, 1, w)
        batch = torch.arange(b, device=x.device).view(b, 1, 1, 1)
        channel = torch.arange(x.shape[1], device=x.device).view(1, -1, 1, 1)
        return padded[batch, channel, rows, cols]


def plan(dm, full_eval: Dataset, train_idx: list[int], eligible: bool):
    """``({split: TensorStore}, batch augmentation or None)`` for a data module whose
    splits are set up: a split gets a store when its samples may be kept (``eligible``: the
    module's ``data.tensor_store`` rule) and, for train, when its augmentation has a batch
    form and its transform equals the eval one."""
    if not eligible:
        return {}, None
    stores = {
        "val": stack(dm.val_set, dm.cache_max_mb, "val"),
        "test": stack(dm.test_set, dm.cache_max_mb, "test"),
    }
    augment = batch_augmenter(dm.augment)
    same = repr(dm.train_transform) == repr(dm.eval_transform)
    if augment is not None and same:
        stores["train"] = stack(Subset(full_eval, train_idx), dm.cache_max_mb, "train")
    stores = {k: v for k, v in stores.items() if v is not None}
    if "train" not in stores:
        augment = None
    if stores:  # to train.log only
        log.info("data: batches cut by index from in-memory tensors for %s (%.1f MB)%s",
                 "/".join(stores), sum(s.nbytes for s in stores.values()) / 2**20,
                 "; the augmentation runs on whole batches" if dm.augment is not None and augment
                 else "", extra={"console": False})  # fmt: skip
    return stores, augment


def resident(store: TensorStore, device: torch.device, setting, name: str) -> TensorStore:
    """``store`` on ``device`` when ``data.device_resident`` allows (``auto``: on an
    accelerator, when it takes at most a quarter of the free memory)."""
    if device.type == "cpu" or setting is False or store.x.device == device:
        return store
    if setting == "auto" and device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if store.nbytes > free / 4:
            log.info("data.device_resident=auto: the %s split (%.0f MB) stays in host memory "
                     "(over a quarter of the %.0f MB free on %s)",
                     name, store.nbytes / 2**20, free / 2**20, device)  # fmt: skip
            return store
    return store.to(device)
