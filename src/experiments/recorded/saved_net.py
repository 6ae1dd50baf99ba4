"""A saved run's net built again: from the closed vocabulary (``allowlist.build``), with its
checkpoint's weights. What eval, predict, calibrate and export run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from experiments.recorded import allowlist
from experiments.runs.weights import load_state_dict_file


def build_net(
    node: dict, in_shape: Sequence[int], num_classes: int, weights: Path
) -> torch.nn.Module:
    """The net a saved ``model.net`` (already passed ``allowlist.check``) describes, with no
    pretrained weights loaded first (the checkpoint's replace them, and the file may be gone),
    with ``weights`` loaded, in eval mode."""
    node = dict(node)
    given: dict[str, Any] = {"num_classes": int(num_classes)}
    if str(node["_target_"]).startswith("torchvision.models."):
        given["weights"] = None  # a torchvision builder: no in_shape, never a download
    else:
        given["in_shape"] = tuple(int(v) for v in in_shape)
    for key, off in (("pretrained", None), ("download", False), ("weights", None)):
        if key in node:
            given[key] = off
    net = allowlist.build(node, "net", "model.net", **given)
    load_state_dict_file(net, weights)
    return net.eval()
