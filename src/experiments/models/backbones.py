"""Backbones by name from timm or torchvision, fitted to the data: the classifier head is
sized to the data's classes, the input stem to its channels, and pretrained weights come
from a file or the library's own cache (a download only when asked for)."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
import torchvision
from torch import nn

from experiments.errors import UserError, one_line
from experiments.models.weights_fit import first_conv, load_fitted

log = logging.getLogger(__name__)

LIBRARIES = ("timm", "torchvision")
# what torchvision's ImageNet weights were trained with (every classification weight set)
IMAGENET_NORM = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def backbone(
    in_shape: Sequence[int],
    num_classes: int,
    name: str = "resnet18",
    library: str = "timm",
    pretrained: str | bool | None = None,
    download: bool = False,
    small_input: bool = False,
) -> nn.Module:
    """Any architecture ``library`` knows by ``name``, with a ``num_classes`` head and a
    stem taking ``in_shape[0]`` channels.

    Args:
        in_shape: shape of one sample, ``(C, H, W)``.
        name: the architecture, e.g. ``resnet18``, ``convnext_nano``, ``efficientnet_b0``.
        library: ``timm`` or ``torchvision``.
        pretrained: None/false for random weights; a path to a weights file
            (``.pt``/``.pth``/``.bin``/``.safetensors``); or true for the library's own
            cache (torch hub's checkpoints folder, or the Hugging Face cache for timm).
        download: with ``pretrained=true``, fetch weights missing from the cache
            (needs network); otherwise a missing file is an error.
        small_input: for a ResNet-style stem on images up to 64 px: a 3x3 stride-1 first
            conv and no max-pool (torchvision nets with ``conv1``/``maxpool`` only).

    The net gets a ``pretrained_norm`` attribute, ``(mean, std)`` per input channel, when
    it holds pretrained weights: the data module normalizes with it when its own
    ``mean``/``std`` are ``auto``.

    Raises:
        UserError: unknown library or name (with close matches), weights that do not fit.
    """
    if library not in LIBRARIES:
        raise UserError(f"model.net.library={library!r} is not valid; use one of {LIBRARIES}")
    channels = int(in_shape[0])
    make = _timm if library == "timm" else _torchvision
    net, norm, source = make(name, num_classes, channels, pretrained, download)
    new_ok = [head_prefix(net)]
    if small_input and max(in_shape[1:]) <= 64 and hasattr(net, "maxpool"):
        # 3x3 stride 1, no max-pool: small images keep their resolution (and the file's
        # 7x7 stem does not fit: it stays new)
        new_ok.append(_replace_first_conv(net, None, kernel_size=3, stride=1, padding=1))
        net.maxpool = nn.Identity()
    if source is not None:
        load_fitted(net, source, new_ok, label=f"model.net.pretrained={source}")
        net.pretrained_norm = _norm_for_channels(norm, channels)
    _check_input_size(net, name, in_shape)
    return net


@contextmanager
def evaluating(net: nn.Module):
    """``net`` in eval mode (BatchNorm on one image in train mode refuses a 1x1 map) and
    without gradients; its mode restored after."""
    training = net.training
    net.eval()
    try:
        with torch.no_grad():
            yield net
    finally:
        net.train(training)


def _check_input_size(net: nn.Module, name: str, in_shape) -> None:
    """One forward of an empty image: a net that downsamples more than the input allows
    (ConvNeXt on 8x8 digits) fails here in one line, not in the first training step."""
    try:
        with evaluating(net):
            net(torch.zeros(1, *in_shape))
    except RuntimeError as err:
        size = "x".join(str(int(d)) for d in in_shape[1:])
        raise UserError(
            f"model.net.name={name}: an input of {size} is too small for it "
            f"({one_line(err)[:90]}); resize the images (data.image_size=[64,64] for an image "
            f"folder), set model.net.small_input=true (ResNet-style nets), or use a small-image "
            f"net (model=cnn)"
        ) from None


def _timm(name: str, num_classes: int, channels: int, pretrained, download: bool):
    import timm  # lazy: ~1 s to import, paid only by a run that picks a timm backbone

    if name not in timm.list_models():
        _unknown(name, timm.list_models(), "timm")
    net = timm.create_model(name, pretrained=False, num_classes=num_classes, in_chans=channels)
    cfg = dict(getattr(net, "pretrained_cfg", None) or {})
    norm = (tuple(cfg.get("mean", IMAGENET_NORM[0])), tuple(cfg.get("std", IMAGENET_NORM[1])))
    return net, norm, _source(pretrained, lambda: _timm_cached(name, cfg, download))


def _timm_cached(name: str, cfg: dict, download: bool) -> Path:
    converted = cached_weights_path("timm", name)
    if converted.is_file():
        return converted
    repo = cfg.get("hf_hub_id")
    if not repo:
        raise UserError(f"timm {name} has no published weights; give model.net.pretrained=<file>")
    # lazy: reached only after timm (above) has loaded it
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    for filename in ("model.safetensors", "pytorch_model.bin"):
        found = try_to_load_from_cache(repo, filename)
        if isinstance(found, str):
            return Path(found)
    if not download:
        raise UserError(
            f"no cached weights for timm {name} (Hugging Face {repo}); set "
            "model.net.download=true to fetch them, or model.net.pretrained=<file>"
        )
    return Path(hf_hub_download(repo, "model.safetensors"))


def _torchvision(name: str, num_classes: int, channels: int, pretrained, download: bool):
    known = torchvision.models.list_models(module=torchvision.models)
    if name not in known:
        _unknown(name, known, "torchvision")
    net = torchvision.models.get_model(name, weights=None, num_classes=num_classes)
    if channels != 3:
        _replace_first_conv(net, channels)
    return net, IMAGENET_NORM, _source(pretrained, lambda: _torchvision_cached(name, download))


def _torchvision_cached(name: str, download: bool) -> Path:
    path = cached_weights_path("torchvision", name)
    if path.is_file():
        return path
    if not download:
        raise UserError(
            f"no cached weights for torchvision {name} at {path}; run make weights (mobilenet_v2), "
            f"set model.net.download=true to fetch them, or give model.net.pretrained=<file>"
        )
    torch.hub.load_state_dict_from_url(_torchvision_urls(name)[0], progress=False)
    return path


def _torchvision_urls(name: str) -> list[str]:
    """The URLs of ``name``'s published weights, the library's default first."""
    try:
        weights = torchvision.models.get_model_weights(name)
    except (ValueError, AttributeError):
        weights = None
    if not weights:
        raise UserError(
            f"torchvision {name} has no published weights; give model.net.pretrained=<file>"
        )
    return [weights.DEFAULT.url] + [w.url for w in weights if w is not weights.DEFAULT]


def cached_weights_path(library: str, name: str) -> Path:
    """Where ``pretrained=true`` finds ``name``'s ImageNet weights: for torchvision, the
    first of its published files (the default first) in torch hub's ``checkpoints/``,
    where torchvision looks too; for timm, ``checkpoints/experiments/<name>.pth`` (what
    ``make weights`` converts; timm's own cache, Hugging Face's, is looked in next).
    Where none is there yet: the path the default would have."""
    checkpoints = Path(torch.hub.get_dir()) / "checkpoints"
    if library != "torchvision":
        return checkpoints / "experiments" / f"{name}.pth"
    paths = [checkpoints / Path(url).name for url in _torchvision_urls(name)]
    return next((p for p in paths if p.is_file()), paths[0])


def _source(pretrained, cached) -> Path | None:
    if pretrained is None or pretrained is False:
        return None
    if pretrained is True or str(pretrained).lower() == "true":
        return cached()
    return Path(str(pretrained)).expanduser()


def _unknown(name: str, known: list[str], library: str) -> None:
    close = difflib.get_close_matches(name, known, n=4, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}" if close else ""
    raise UserError(f"model.net.name={name!r}: {library} has no such model{hint}")


def head_prefix(net: nn.Module) -> str:
    """Parameter-name prefix of the classifier head: timm's own record of it, else the last
    ``nn.Linear`` (or 1x1 conv classifier) in the net."""
    modules = dict(net.named_modules())
    cfg = getattr(net, "pretrained_cfg", None)
    classifier = cfg.get("classifier") if isinstance(cfg, dict) else None
    if isinstance(classifier, str) and classifier in modules:
        return classifier
    linears = [name for name, module in modules.items() if name and isinstance(module, nn.Linear)]
    if not linears:
        raise UserError(f"{type(net).__name__} has no Linear layer to treat as its head")
    return linears[-1]


def _replace_first_conv(net: nn.Module, channels: int | None, **changes) -> str:
    """A new stem conv taking ``channels`` inputs (None: as many as before), with
    ``changes`` to its options; returns its name."""
    found = first_conv(net)
    if found is None:
        raise UserError(f"{type(net).__name__} has no Conv2d stem to adapt to the input channels")
    name, conv = found
    options = {"kernel_size": conv.kernel_size, "stride": conv.stride, "padding": conv.padding}
    conv_in = conv.in_channels if channels is None else channels
    new = nn.Conv2d(conv_in, conv.out_channels, bias=conv.bias is not None, **options | changes)
    parent, _, child = name.rpartition(".")
    setattr(net.get_submodule(parent), child, new)
    return name


def _norm_for_channels(norm, channels: int) -> tuple[list[float], list[float]]:
    """The weights' per-channel statistics for ``channels`` inputs: their mean over RGB for
    one channel (the stem's weights are summed over RGB the same way), else cycled."""
    mean, std = (list(map(float, v)) for v in norm)
    if channels == 1:
        return [sum(mean) / len(mean)], [sum(std) / len(std)]
    return tuple([v[i % len(v)] for i in range(channels)] for v in (mean, std))
