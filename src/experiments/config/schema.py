"""The composed config checked once, before anything is built: constructor signatures are
the schema.

Every ``_target_``'s arguments come from its constructor's signature (read from source by
``experiments.config.signatures``, so torch is not imported yet): an unknown key gets a
did-you-mean, and a value its type hint does not admit -- ``int``, ``float``, ``bool``,
``str``, ``Literal[...]`` choices, ``Annotated[..., Ge(1)]`` bounds -- gets one line naming
the key, the value and what would be valid. Adding an argument to a constructor is the
whole change: the config, the command line and this check follow.

Only two things are written here by hand: ``REFINED``, bounds and choices of third-party
constructors whose signatures cannot say them (torch's ``lr: float``), and the rules that
join several keys (``_cross_key_rules``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from experiments.config import source_cache
from experiments.config.lookup import target_problem
from experiments.config.signatures import Signature, signature
from experiments.config.typecheck import show, type_of
from experiments.errors import UserError
from experiments.runs.sweep import parse_budget, parse_target

# keys Hydra's instantiate reads itself, and our switch for callbacks (see build.callbacks)
HYDRA_KEYS = frozenset({"_target_", "_partial_", "_recursive_", "_convert_", "_args_", "enabled"})

# top-level sections no constructor takes, described by dataclasses in config.options
SECTIONS = {
    "": "experiments.config.options.RunOptions",
    "sweep": "experiments.config.options.SweepOptions",
    "cv": "experiments.config.options.CrossValidation",
    "remedies": "experiments.config.options.Remedies",
}

# Bounds of third-party arguments whose hints cannot say them, chosen where a value out of
# range would fail late with a traceback or, worse, run and mislead: 0 epochs or batches
# "train" nothing and report the untrained net's scores.
# an int is a count of batches, a float a fraction of the split
_LIMIT_BATCHES = "Annotated[int, Ge(1)] | Annotated[float, Gt(0), Le(1)] | None"
_UNIT = "Annotated[float, Ge(0), Lt(1)]"
_OPTIMIZER = {
    # lr=0 stays valid: it is asked for on purpose (weights frozen while the loop runs; the
    # suite's checks of epoch metrics and early stopping use it), never reached by mistake
    "lr": "Annotated[float, Ge(0)]",
    "weight_decay": "Annotated[float, Ge(0)]",
    "eps": "Annotated[float, Gt(0)]",
}
REFINED = {
    "lightning.pytorch.Trainer": {
        "accelerator": "Literal['auto', 'cpu', 'gpu', 'cuda', 'mps', 'tpu'] | Accelerator",
        "max_epochs": (
            "Annotated[int, Ge(1), Why('0 epochs would test untrained weights; -1 is no "
            "limit (with trainer.max_steps or trainer.max_time)')] | Literal[-1] | None"
        ),
        "min_epochs": "Annotated[int, Ge(0)] | None",
        "max_steps": (
            "Annotated[int, Ge(1), Why('0 steps would test untrained weights; -1 is no "
            "limit')] | Literal[-1]"
        ),
        "min_steps": "Annotated[int, Ge(0)] | None",
        "limit_train_batches": (
            "Annotated[int, Ge(1), Why('0 batches would train nothing')] "
            "| Annotated[float, Gt(0), Le(1)] | None"
        ),
        "limit_val_batches": _LIMIT_BATCHES,
        "limit_test_batches": _LIMIT_BATCHES,
        "limit_predict_batches": _LIMIT_BATCHES,
        "val_check_interval": _LIMIT_BATCHES,
        "overfit_batches": "Annotated[int, Ge(0)] | Annotated[float, Ge(0), Le(1)]",
        "num_sanity_val_steps": "Annotated[int, Ge(-1)] | None",
        "check_val_every_n_epoch": "Annotated[int, Ge(1)] | None",
        "num_nodes": "Annotated[int, Ge(1)]",
        "gradient_clip_val": "Annotated[float, Ge(0)] | None",
        "log_every_n_steps": "Annotated[int, Ge(1)] | None",
        "accumulate_grad_batches": "Annotated[int, Ge(1)]",
    },
    "torch.optim.SGD": {**_OPTIMIZER, "momentum": _UNIT, "dampening": _UNIT},
    "torch.optim.AdamW": {**_OPTIMIZER, "betas": f"Annotated[Sequence[{_UNIT}], Length(2)]"},
    "torch.optim.Adam": {**_OPTIMIZER, "betas": f"Annotated[Sequence[{_UNIT}], Length(2)]"},
    "torch.optim.lr_scheduler.StepLR": {
        "step_size": "Annotated[int, Ge(1)]",
        "gamma": "Annotated[float, Gt(0)]",
    },
    "torch.optim.lr_scheduler.CosineAnnealingLR": {
        "T_max": (
            "Annotated[int, Ge(1), Why('the cosine period in epochs; with "
            "trainer.max_epochs=-1 set scheduler.T_max=<N>')]"
        ),
        "eta_min": "Annotated[float, Ge(0)]",
    },
    "torch.optim.lr_scheduler.ReduceLROnPlateau": {
        "factor": "Annotated[float, Gt(0), Lt(1)]",
        "patience": "Annotated[int, Ge(0)]",
        "cooldown": "Annotated[int, Ge(0)]",
        "threshold": "Annotated[float, Ge(0)]",
        "min_lr": "Annotated[float, Ge(0)] | Sequence[Annotated[float, Ge(0)]]",
        "eps": "Annotated[float, Ge(0)]",
    },
    "lightning.pytorch.callbacks.EarlyStopping": {
        "patience": "Annotated[int, Ge(0)]",
        "min_delta": "Annotated[float, Ge(0)]",
    },
    "lightning.pytorch.callbacks.ModelCheckpoint": {
        "save_top_k": "Annotated[int, Ge(-1)]",
        "every_n_epochs": "Annotated[int, Ge(0)] | None",
        "every_n_train_steps": "Annotated[int, Ge(0)] | None",
    },
}


def check(cfg: DictConfig) -> None:
    """Raise UserError naming the first key of ``cfg`` that no constructor would accept."""
    try:
        _check(cfg)
    finally:
        source_cache.save()  # what reading sources found, for the next start


def _check(cfg: DictConfig) -> None:
    missing = sorted(k for k in _missing_keys(cfg, "") if not k.startswith("hydra"))
    if missing:
        raise UserError(
            f"missing value for {', '.join(missing)}: set it on the command line, "
            f"e.g. {missing[0]}=<value>"
        )
    plain = OmegaConf.to_container(cfg, resolve=False)
    _objects_have_targets(plain)
    for section, target in SECTIONS.items():
        node = plain.get(section) if section else plain
        if isinstance(node, dict):
            _check_node(cfg, section, target, node, known_only=not section)
    for key, target, node in walk_targets(plain):
        if not isinstance(target, str) or "${" in target:
            continue
        problem = target_problem(target)
        if problem:
            raise UserError(f"{key}._target_={target!r}: {problem}")
        _check_node(cfg, key, target, node, known_only=False)
    _cross_key_rules(cfg)


# sections train() builds: a mapping there without ``_target_`` cannot be built
BUILT = ("data", "model", "optimizer", "scheduler", "trainer")


def _objects_have_targets(plain: dict) -> None:
    """``experiment=finetune scheduler=none`` left ``scheduler: {warmup_epochs: 1}``: keys the
    experiment sets for an option the command line replaced. One line, not a traceback."""
    for section in BUILT:
        node = plain.get(section)
        if isinstance(node, dict) and "_target_" not in node:
            keys = ", ".join(f"{section}.{k}" for k in node)
            raise UserError(
                f"{section} has {keys} but no _target_: these keys belong to a {section} "
                f"option that is not chosen (an experiment sets them, or a {section}=none "
                f"replaced it); choose a {section}= option that takes them, or drop them"
            )


def walk_targets(node: Any, key: str = "") -> Iterator[tuple[str, Any, dict]]:
    """Yield ``(dotted key, target, mapping)`` for every plain mapping with a ``_target_``."""
    if isinstance(node, dict):
        if "_target_" in node:
            yield key or "<root>", node["_target_"], node
        for k, v in node.items():
            yield from walk_targets(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk_targets(v, f"{key}.{i}" if key else str(i))


def _check_node(cfg: DictConfig, key: str, target: str, node: dict, known_only: bool) -> None:
    sig = signature(target)
    if sig is None:
        return  # source cannot tell: the constructor checks its own arguments
    for name, value in node.items():
        if name in HYDRA_KEYS:
            continue
        path = f"{key}.{name}" if key else str(name)
        param = sig.params.get(name)
        if param is None:
            if not (sig.any_key or known_only):
                raise UserError(_unknown_key(path, name, sig))
            continue
        if isinstance(value, dict) and "_target_" in value:
            continue  # built by its own target, checked on its own
        if isinstance(value, str) and "${" in value:
            try:
                value = OmegaConf.select(cfg, path, throw_on_missing=False)
            except Exception:  # an interpolation only Hydra's run can resolve
                continue
        spec = type_of(param, REFINED.get(target, {}).get(name))
        if not spec.admits(value):
            why = f"; {spec.reason()}" if spec.reason() else ""
            raise UserError(f"{path}={show(value)} is not valid: expected {spec.describe()}{why}")


def _unknown_key(path: str, name: Any, sig: Signature) -> str:
    names = sorted(sig.params)
    close = difflib.get_close_matches(str(name), names, n=1)
    if close:
        parent = path.rpartition(".")[0]
        hint = f"did you mean {parent + '.' if parent else ''}{close[0]}?"
    else:
        more = f", ... ({len(names)} in all)" if len(names) > 12 else ""
        hint = f"it takes {', '.join(names[:12])}{more}"
    return f"{path}: {sig.target} has no argument '{name}'; {hint}"


# -- rules that join keys ----------------------------------------------------------------


def _cross_key_rules(cfg: DictConfig) -> None:
    epochs = _select(cfg, "trainer.max_epochs")
    if epochs == -1 and _select(cfg, "trainer.max_steps") in (None, -1):
        if _select(cfg, "trainer.max_time") is None:
            raise UserError(
                "trainer.max_epochs=-1 trains forever: also set trainer.max_steps=<N> or "
                "trainer.max_time=DD:HH:MM:SS, or give trainer.max_epochs=<N>"
            )
    warmup = _select(cfg, "scheduler.warmup_epochs")
    if warmup is not None and epochs is not None and epochs > 0 and not 0 <= warmup < epochs:
        raise UserError(
            f"scheduler.warmup_epochs={warmup} is not valid: the warmup must be shorter than the "
            f"run (trainer.max_epochs={epochs})"
        )
    for key, parse in (("sweep.target", parse_target), ("sweep.time_budget", parse_budget)):
        value = _select(cfg, key)
        if value is not None:
            parse(value)
    metric = cfg.get("optimized_metric")
    if metric is not None and "/" not in str(metric):
        raise UserError(
            f"optimized_metric={metric!r} is not valid: expected stage/name, e.g. val/acc"
        )


def _missing_keys(node, prefix: str):
    """``???`` values, found without resolving interpolations (``${hydra:...}`` may not be set)."""
    items = node.items_ex(resolve=False) if isinstance(node, DictConfig) else enumerate(node)
    for key, _ in items:
        child = node._get_node(key)
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(child, DictConfig | ListConfig):
            if not child._is_missing() and not child._is_none():
                yield from _missing_keys(child, path)
        elif child._is_missing():
            yield path


def _select(cfg: DictConfig, key: str):
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=False)
    except Exception as err:  # an interpolation that cannot resolve
        raise UserError(f"{key}: {err}") from None
