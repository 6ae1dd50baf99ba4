"""Load weights made for a related net: keys matched by name, a new head and an input stem
with another channel count allowed, every other difference reported in one line."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from experiments.errors import UserError
from experiments.runs.weights import safe_load

log = logging.getLogger(__name__)

# wrappers around a net's own keys in files made by common tools
_WRAPPERS = ("state_dict", "model", "model_state_dict", "net")


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """A name -> tensor dict from a ``.safetensors`` file or a weights-only torch file
    (a plain state_dict, or one under ``state_dict``/``model``; ``module.`` and
    ``_orig_mod.`` prefixes are dropped)."""
    path = Path(path)
    obj = safe_load(path)  # by suffix: safetensors, else torch.load(weights_only=True)
    if isinstance(obj, dict):
        obj = next((obj[key] for key in _WRAPPERS if isinstance(obj.get(key), dict)), obj)
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()
    ):
        raise UserError(f"weights file {path} is not a state_dict (a dict of name -> tensor)")
    return {k.replace("_orig_mod.", "").replace("module.", ""): v for k, v in obj.items()}


def adapt_channels(weight: torch.Tensor, channels: int) -> torch.Tensor:
    """A conv weight ``(O, I, kh, kw)`` for ``channels`` inputs: summed over I for one
    channel (a gray image is the sum of equal RGB planes), else cycled over I and scaled
    by ``I / channels`` so that the activations keep their size."""
    if channels == 1:
        return weight.sum(dim=1, keepdim=True)
    repeats = -(-channels // weight.shape[1])
    cycled = weight.repeat(1, repeats, 1, 1)[:, :channels]
    return cycled * (weight.shape[1] / channels)


def under(name: str, prefixes: Sequence[str]) -> bool:
    """Whether parameter / module ``name`` is one of ``prefixes`` or inside one of them."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def first_conv(net: nn.Module) -> tuple[str, nn.Conv2d] | None:
    """The first ``nn.Conv2d`` of ``net`` (its input stem) with its name, or None."""
    return next(((n, m) for n, m in net.named_modules() if isinstance(m, nn.Conv2d)), None)


def load_fitted(
    net: nn.Module,
    source: str | Path,
    new_ok: Sequence[str],
    label: str,
    strict: bool = True,
    exclude: Sequence[str] = (),
) -> None:
    """Load ``source`` into ``net`` by name and log one line of what happened.

    Tensors under ``new_ok`` (the head, a replaced stem) may be missing or of another
    shape: they keep their fresh initialization. The first conv's weight is adapted when
    only its input-channel count differs. Keys under ``exclude`` are not loaded at all.
    With ``strict`` any other missing, unexpected or wrong-shaped tensor is an error;
    without it such tensors are skipped and reported (``init_from`` a related net).

    Raises:
        UserError: one line naming the file and what does not fit (details in the log),
            or no tensor at all matched.
    """
    state = read_weights(source)
    own = net.state_dict()
    stem = first_conv(net)
    stem_weight = f"{stem[0]}.weight" if stem is not None else None
    fitted: dict[str, torch.Tensor] = {}  # the tensors loaded, the adapted ones included
    new, adapted, wrong = [], [], {}  # wrong: name -> "name (file shape) vs (net shape)"
    for key, target in own.items():
        value = state.get(key)
        if under(key, exclude) or (value is None and under(key, new_ok)):
            new.append(key)
        elif value is None:  # missing: counted below
            continue
        elif value.shape == target.shape:
            fitted[key] = value
        elif (
            key == stem_weight
            and value.ndim == 4
            and value.shape[:1] + value.shape[2:] == target.shape[:1] + target.shape[2:]
        ):
            fitted[key] = adapt_channels(value, target.shape[1])
            adapted.append(key)
        elif under(key, new_ok):
            new.append(key)
        else:
            wrong[key] = f"{key} {tuple(value.shape)} vs {tuple(target.shape)}"
    missing = [k for k in own if k not in state and k not in new]
    unexpected = [k for k in state if k not in own and not under(k, new_ok)]
    skipped = sorted([*wrong, *(k for k in state if k not in own)])
    kinds = {"missing": missing, "unexpected": unexpected, "of the wrong shape": [*wrong.values()]}
    problems = [(f"{len(names)} {kind}", names) for kind, names in kinds.items() if names]
    if (strict and problems) or not fitted:
        for head, names in problems:
            log.error("%s: %s tensors: %s", label, head, ", ".join(names))
        summary = "; ".join(f"{head} (e.g. {names[0]})" for head, names in problems)
        raise UserError(
            f"{label} does not fit {type(net).__name__}: "
            f"{summary or 'no tensor name matches'} (all names in the log)"
        )
    net.load_state_dict(fitted, strict=False)
    log.info("%s: loaded %d tensors%s, %d new (%s), %d skipped%s", label, len(fitted),
             f" ({len(adapted)} adapted to the input channels)" if adapted else "", len(new),
             _short(new), len(skipped), f" ({_short(skipped)})" if skipped else "")  # fmt: skip


def _short(names: Sequence[str], n: int = 4) -> str:
    names = list(names)
    return ", ".join(names[:n]) + (f", ... {len(names) - n} more" if len(names) > n else "")
