"""Fine-tuning: the backbone / head split, a frozen-then-unfrozen backbone, and a separate
backbone learning rate. The frozen state is a function of the epoch alone, so a resumed run
freezes and unfreezes exactly where an uninterrupted one does."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from experiments.compat.torch import is_batch_norm
from experiments.errors import UserError
from experiments.models.backbones import head_prefix
from experiments.models.weights_fit import under


def resolve_head(net: nn.Module, head: str | None) -> str:
    """The head's parameter-name prefix: ``head`` as given, or found (``auto``/None)."""
    if head in (None, "auto"):
        return head_prefix(net)
    names = [n for n, _ in net.named_parameters()]
    if not any(under(n, [head]) for n in names):
        top = sorted({n.rsplit(".", 2)[0] for n in names})[-6:]
        raise UserError(f"model.head={head!r} matches no parameter; the last modules are {top}")
    return head


def split_parameters(
    net: nn.Module, head: str, exclude: Sequence[str] = ()
) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """``(backbone, head)`` parameters of ``net``, leaving out names under ``exclude``."""
    backbone, head_params = [], []
    for name, param in net.named_parameters():
        if under(name, exclude):
            continue
        (head_params if under(name, [head]) else backbone).append(param)
    return backbone, head_params


def batchnorms_eval(net: nn.Module, head: str) -> None:
    for name, module in net.named_modules():
        if is_batch_norm(module) and not under(name, [head]):
            module.eval()


def freeze_for_good(net: nn.Module, prefixes: list[str]) -> None:
    names = [name for name, _ in net.named_parameters()]
    for prefix in prefixes:
        if not any(under(n, [prefix]) for n in names):
            top = sorted({n.split(".")[0] for n in names})
            raise UserError(
                f"model.freeze: {prefix!r} matches no parameter; top-level names are {top}"
            )
    for name, param in net.named_parameters():
        if under(name, prefixes):
            param.requires_grad_(False)
    if prefixes and not any(p.requires_grad for p in net.parameters()):
        raise UserError(f"model.freeze={prefixes} freezes every parameter; nothing would train")
