"""What a saved run config may build: ``eval`` and ``predict`` build objects from a run's
``.hydra/config.yaml``, a file anyone could have edited, so every ``_target_`` in it is
checked against an allowlist before anything is built."""

from __future__ import annotations

import functools
import importlib
import types
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from experiments.config import CONF_DIR
from experiments.config.schema import walk_targets
from experiments.errors import UserError

# a run's config is a file anyone could have edited: only these may be built from it
ALLOWED_PREFIXES = ("experiments.", "torch.", "torchvision.", "lightning.")
ALLOWED_EXACT = ("hydra.utils.get_object",)
# where the object a target names must actually live: `torch.os.system` starts with
# "torch." but is os.system, so the prefix alone is not enough
ALLOWED_MODULE_ROOTS = ("experiments", "torch", "torchvision", "lightning")
# under the allowed roots, but they load or run code, spawn processes or fetch files
DENIED_MODULES = (
    "torch.hub",
    "torch.serialization",
    "torch.jit",
    "torch.package",
    "torch.utils.cpp_extension",
    "torch.utils.data.datapipes",
    "torch.ops",
    "torch.library",
    "torch.classes",
    "torch.distributed",
    "torch.multiprocessing",
    "torch.compiler",
    "torchvision.datasets.utils",
    "lightning.pytorch.cli",
    "lightning.fabric.cli",
    "lightning.app",
)


@functools.cache
def conf_targets(conf_dir: Path = CONF_DIR) -> set[str]:
    """Every literal ``_target_`` (and ``get_object`` path) in the repo's ``conf/`` tree.

    These are trusted as they ship with the code, and need no import to be checked.
    """
    targets: set[str] = set()
    for file in sorted(conf_dir.rglob("*.yaml")):
        try:
            plain = OmegaConf.to_container(OmegaConf.load(file), resolve=False)
        except Exception:  # a broken file in conf/ is train's error to report, not ours
            continue
        for _, target, node in walk_targets(plain):
            names = [target] + (_object_paths(node) if target in ALLOWED_EXACT else [])
            targets.update(n for n in names if isinstance(n, str) and "${" not in n)
    return targets


def check_allowed(plain: Any, where: str, prefix: str = "") -> None:
    """Refuse a config whose ``_target_``s reach outside the allowlist, before building any.

    A target is allowed when it equals one in the repo's ``conf/`` tree, or starts with
    one of ``ALLOWED_PREFIXES`` and names an object that really lives in those packages
    (and not in ``DENIED_MODULES``). ``hydra.utils.get_object``'s ``path`` is checked the
    same way. Interpolated targets (``${...}``) are checked once resolved (``resolved``).

    Raises:
        UserError: naming the key and the refused target.
    """
    trusted = None
    for key, target, node in walk_targets(plain):
        if isinstance(target, str) and "${" in target:
            continue
        names = [(f"{prefix}{key}._target_", target)]
        if target in ALLOWED_EXACT:
            if set(node) - {"_target_", "path", "_args_"} or len(_object_paths(node)) != 1:
                raise UserError(
                    f"{where}: {prefix}{key} calls {target} in an unexpected way (refused); "
                    f"expected only a path: key"
                )
            names = [(f"{prefix}{key}.path", p) for p in _object_paths(node)]
        for name, value in names:
            if isinstance(value, str) and "${" in value:
                continue
            if trusted is None:
                trusted = conf_targets()
            if value in trusted:
                continue
            reason = _refusal(value)
            if reason:
                raise UserError(
                    f"{where}: {name}={value!r} is refused ({reason}); allowed: targets in "
                    f"conf/ or under {', '.join(ALLOWED_PREFIXES)}"
                )


def _object_paths(node: dict) -> list[Any]:
    args = node.get("_args_") or []
    return ([node["path"]] if "path" in node else []) + (
        list(args) if isinstance(args, list) else [args]
    )


def _refusal(target: Any) -> str | None:
    """Why ``target`` may not be built, or None when it may."""
    if not isinstance(target, str):
        return "not a dotted name"
    if not target.startswith(ALLOWED_PREFIXES) or target in ALLOWED_PREFIXES:
        return "outside the allowed packages"
    if any(part.startswith("_") or not part.isidentifier() for part in target.split(".")):
        return "a private or malformed name"
    if _denied(target):
        return "it can load or run code"
    obj = _locate(target)
    if obj is None:
        return "it cannot be found"
    if isinstance(obj, types.ModuleType):
        return "a module, not a class or function"
    module = getattr(obj, "__module__", None) or type(obj).__module__ or ""
    if not isinstance(module, str) or module.split(".")[0] not in ALLOWED_MODULE_ROOTS:
        return f"it is really {module}.{getattr(obj, '__name__', '?')}"
    if _denied(module):
        return "it can load or run code"
    return None


def _denied(name: str) -> bool:
    return any(name == d or name.startswith(d + ".") for d in DENIED_MODULES)


def _locate(target: str) -> Any:
    # import the longest importable module prefix, then walk attributes: as Hydra does,
    # but only ever importing modules under the allowed prefixes (checked above)
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for part in parts[i:]:
                obj = getattr(obj, part)
        except AttributeError:
            return None
        return obj
    return None
