"""The closed vocabulary a saved run may name: ``eval``, ``predict``, ``calibrate`` and
``export`` rebuild a run from its ``.hydra/config.yaml``, a file anyone could have edited.

Each section is checked whole -- every ``_target_`` is one of a short list of classes for its
place, every key is an argument of that class's real constructor, every value is plain data
-- before anything is built, and then built here, not by Hydra: no function from the file is
called, nothing from ``hydra.*`` is located, and a refused node is one line naming its key.

What each family (``FAMILIES``) admits is ``OURS`` and ``DESCRIBE`` below (``ImageDataModule``
is the flat name older runs saved). Nets (ours, ``backbone``'s timm or torchvision name, and
torchvision's builders by a name of ``list_models()``) are built without pretrained weights:
they come from the checkpoint. ``{_target_: hydra.utils.get_object, path: torch.float32}`` is
read as a dtype name (a lookup in ``DTYPES``, not a call).

Your own package is trusted only when you say so: ``EXPERIMENTS_TRUSTED_MODULES=pkg,other``
(module prefixes) admits any target under them, anywhere (a Dataset factory of yours, your
own net). Nothing is trusted by default.

Importing this module imports no torch: only checking or building a section does.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
from typing import Any

from experiments.errors import UserError, one_line
from experiments.recorded import shown

TRUSTED_ENV = "EXPERIMENTS_TRUSTED_MODULES"
FAMILIES = ("data", "module", "net", "transform", "dataset")
OURS = {
    "data": {
        n: "experiments.data"
        for n in ("DigitsData", "CsvData", "TorchvisionData", "DatasetData", "ImageDataModule")
    }
    | {"TabularData": "experiments.data.tabular", "ShapesData": "experiments.data.shapes"},
    "module": {
        "ClassificationModule": "experiments.models",
        "RegressionModule": "experiments.models.regression",
        "SegmentationModule": "experiments.models.segmentation",
    },
    "net": {n: "experiments.models" for n in ("CNN", "MLP", "ResNet9", "resnet18", "backbone")}
    | {"SpeedNet": "experiments.models.nets"},
}
DESCRIBE = {
    "data": "experiments.data.{DigitsData,CsvData,TorchvisionData,DatasetData,ImageDataModule}"
    ", experiments.data.tabular.TabularData or experiments.data.shapes.ShapesData",
    "module": "experiments.models.ClassificationModule, "
    "experiments.models.regression.RegressionModule or "
    "experiments.models.segmentation.SegmentationModule",
    "net": "experiments.models.{CNN,MLP,ResNet9,resnet18,backbone}, "
    "experiments.models.nets.SpeedNet or torchvision.models.<name>",
    "transform": "torchvision.transforms.v2 transforms (not Lambda) or "
    "experiments.data.transforms classes",
    "dataset": f"only targets of the modules in {TRUSTED_ENV} (none by default)",
}
# what a node of each family hands its children: a key -> the family of a node there
CHILDREN = {
    "data": {
        "dataset": "dataset",
        "train_transform": "transform",
        "eval_transform": "transform",
        "target_transform": "transform",
        "augment": "transform",
    },
    "module": {"net": "net"},
    "transform": "transform",  # Compose's list, RandomApply's, ...
    "dataset": "transform",
}
DTYPE_NODE = "hydra.utils.get_object"
DTYPES = frozenset(
    f"torch.{n}"
    for n in (
        "float32 float float64 double float16 half bfloat16 uint8 int8 int16 int32 int64 long bool"
    ).split()
)
PLAIN = (str, int, float, bool, type(None))


def trusted_prefixes() -> tuple[str, ...]:
    """The module prefixes ``EXPERIMENTS_TRUSTED_MODULES`` names (comma-separated)."""
    names = tuple(p.strip() for p in os.environ.get(TRUSTED_ENV, "").split(",") if p.strip())
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise UserError(f"{TRUSTED_ENV}={name!r} is not a module name (e.g. mypkg,lab.nets)")
    return names


def is_trusted(target: str) -> bool:
    return any(target == p or target.startswith(p + ".") for p in trusted_prefixes())


def check(node: Any, family: str, key: str, given: tuple[str, ...] = ()) -> None:
    """Refuse ``node`` (a plain, resolved section) unless everything in it is in the
    vocabulary: a ``_target_`` of ``family`` with keys its constructor takes, plain values,
    and children of the families ``CHILDREN`` allows there.

    Args:
        node: the section, e.g. the resolved ``data`` mapping.
        family: one of ``FAMILIES``.
        key: its dotted key, for messages.
        given: arguments the builder passes itself (``in_shape``, ``num_classes``, ...).

    Raises:
        UserError: one line naming the key, the target and what is allowed there.
    """
    if not isinstance(node, dict) or "_target_" not in node:
        raise UserError(f"{key}: expected a mapping with a _target_ ({DESCRIBE[family]})")
    target = node["_target_"]
    if family == "transform" and target == DTYPE_NODE:
        _check_dtype(node, key)
        return
    obj = locate(target, family, key)
    extra = set(node) - {"_target_", "_partial_"}
    if "_partial_" in node and (family != "dataset" or not isinstance(node["_partial_"], bool)):
        raise UserError(f"{key}._partial_: only a dataset factory of yours may be partial")
    _check_keys(obj, target, key, extra, given, partial=bool(node.get("_partial_")))
    children = CHILDREN.get(family, {})
    for name in sorted(extra, key=str):
        child = children if isinstance(children, str) else children.get(name)
        _check_value(node[name], child, f"{key}.{name}")


def _check_value(value: Any, family: str | None, key: str) -> None:
    if isinstance(value, dict):
        if "_target_" in value:
            if family is None:
                raise UserError(
                    f"{key}._target_={value['_target_']!r} is refused: nothing is built at "
                    f"{key} from a saved run; give plain values there"
                )
            check(value, family, key)
            return
        for name, item in value.items():
            if not isinstance(name, str):
                raise UserError(f"{key}: key {name!r} is not a string")
            _check_value(item, family, f"{key}.{name}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_value(item, family, f"{key}.{i}")
    elif not isinstance(value, PLAIN):
        raise UserError(f"{key}: a {type(value).__name__} is not plain data (refused)")


def _check_dtype(node: dict, key: str) -> None:
    # hydra's get_object is never called: {path: torch.float32} at a `dtype` key is a name
    at_dtype = key.rpartition(".")[2] == "dtype"
    if not at_dtype or set(node) != {"_target_", "path"} or node["path"] not in DTYPES:
        raise UserError(
            f"{key}._target_={DTYPE_NODE!r} is refused: it is read only as a dtype name at a "
            f"dtype key ({{path: torch.float32}}, one of {', '.join(sorted(DTYPES))}); got "
            f"path={shown(node.get('path'))}"
        )


def _check_keys(obj, target: str, key: str, keys: set, given: tuple, partial: bool) -> None:
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):  # no signature to bind to: nothing but the target
        params = {}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return  # a **kwargs sink (torchvision's model builders): the constructor checks
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = sorted((str(k) for k in keys - named), key=str)
    if unknown:
        takes = ", ".join(sorted(named - set(given))) or "no arguments"
        raise UserError(
            f"{key}.{unknown[0]}: {target} has no argument {unknown[0]!r}; it takes {takes}"
        )
    missing = [
        n
        for n, p in params.items()
        if n in named and p.default is p.empty and n not in keys and n not in given
    ]
    if missing and not partial:
        raise UserError(f"{key}: {target} needs {', '.join(missing)} (missing in the saved run)")


def locate(target: Any, family: str, key: str) -> Any:
    """The class (or model builder) ``target`` names, if the vocabulary of ``family`` has it.

    Raises:
        UserError: naming ``key``, the target and what ``family`` allows.
    """
    obj = _locate(target, family) if isinstance(target, str) else None
    if obj is None:
        raise UserError(
            f"{key}._target_={shown(target)} is refused: a saved run may name only "
            f"{DESCRIBE[family]} there (trust a package of your own with {TRUSTED_ENV}=<pkg>)"
        )
    return obj


def _locate(target: str, family: str) -> Any:
    parts = target.split(".")
    if not all(p.isidentifier() and not p.startswith("_") for p in parts) or len(parts) < 2:
        return None
    if is_trusted(target):
        return _import_attr(target)
    if family == "dataset":
        return None
    if family == "transform":
        return _transform(target)
    if family == "net" and target.startswith("torchvision.models."):
        return _torchvision_builder(parts[-1]) if len(parts) == 3 else None
    return _ours(target, family)


@functools.cache
def _ours(target: str, family: str) -> Any:
    allowed = [_import_attr(f"{m}.{n}") for n, m in OURS.get(family, {}).items()]
    if not target.startswith("experiments."):
        return None
    obj = _import_attr(target)  # our own modules only: an alias such as ...models.nets.CNN
    return obj if any(obj is a for a in allowed if a is not None) else None


@functools.cache
def _transform(target: str) -> Any:
    if target.startswith("torchvision.transforms.v2.") and target.count(".") == 3:
        from torchvision.transforms import v2  # lazy: importing this module imports no torch

        obj = getattr(v2, target.rsplit(".", 1)[1], None)
        ok = isinstance(obj, type) and issubclass(obj, v2.Transform) and obj is not v2.Lambda
        return obj if ok else None
    if target.startswith("experiments.data."):
        obj = _import_attr(target)
        if isinstance(obj, type) and obj.__module__ == "experiments.data.transforms":
            return obj
    return None


@functools.cache
def _torchvision_builder(name: str) -> Any:
    import torchvision.models  # lazy: importing this module imports no torch

    known = name in torchvision.models.list_models()
    return torchvision.models.get_model_builder(name) if known else None


def _import_attr(target: str) -> Any:
    """``module.attr`` by its dotted name, importing the longest module prefix (called only
    for names under ``experiments.`` or a trusted package)."""
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part, None)
        return None if inspect.ismodule(obj) else obj
    return None


def build(node: Any, family: str | None, key: str, **given: Any) -> Any:
    """The object ``node`` (already passed by ``check``) describes, its children built first.

    Raises:
        UserError: the constructor refused a value (one line naming the key and target).
    """
    if isinstance(node, list):
        return [build(v, family, f"{key}.{i}") for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    if "_target_" not in node or family is None:
        return {k: build(v, family, f"{key}.{k}") for k, v in node.items()}
    target = node["_target_"]
    if family == "transform" and target == DTYPE_NODE:
        import torch  # lazy: importing this module imports no torch

        return getattr(torch, node["path"].removeprefix("torch."))
    obj = locate(target, family, key)
    children = CHILDREN.get(family, {})
    kwargs = {
        name: build(value, children if isinstance(children, str) else children.get(name),
                    f"{key}.{name}")
        for name, value in node.items()
        if name not in ("_target_", "_partial_")
    }  # fmt: skip
    kwargs.update(given)
    if node.get("_partial_"):
        return functools.partial(obj, **kwargs)
    try:
        return obj(**kwargs)
    except UserError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AssertionError) as err:
        raise UserError(f"{key}: {target} refused its arguments: {one_line(err)}") from None
