"""The composed config checked once, before anything is built: constructor signatures are
the schema. Every ``_target_`` is imported and its keys bound to its real
``inspect.signature`` and type hints (``config.hints``): an unknown key gets a did-you-mean,
a value its hint does not admit one line naming the key, the value and what is valid.
Adding an argument to a constructor is the whole change.

Written here by hand: ``REFINED`` (bounds of third-party arguments their hints cannot say),
the rules that join keys (``_cross_key_rules``) and the dataclasses of the top-level
sections no constructor takes. Importing this module imports no torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import inspect
import json
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from omegaconf import DictConfig, OmegaConf

from experiments.config.hints import Built, Ge, Gt, Le, Length, Lt, Why, show, type_of
from experiments.errors import UserError, one_line
from experiments.runs.sweep import parse_budget, parse_target

# keys Hydra's instantiate reads itself, and our switch for callbacks (see build.callbacks)
HYDRA_KEYS = frozenset({"_target_", "_partial_", "_recursive_", "_convert_", "_args_", "enabled"})


# -- the top-level sections no constructor takes -----------------------------------------


@dataclass(frozen=True)
class RunOptions:
    """Keys at the top of the config (others, such as ``paths``, are not checked here)."""

    task_name: str | int = "train"
    # numpy's range (2**32 - 1): Lightning's seed_everything fails on one outside it
    seed: Annotated[int, Ge(0), Le(4294967295)] | None = 42
    optimized_metric: str | None = "val/acc"
    optimized_mode: Literal["max", "min"] = "max"
    tags: list[str] = field(default_factory=list)
    resume: str | None = None
    test: bool = True
    profile: bool = False
    print_config: bool = False
    compile: bool = False
    target: str | None = None  # e.g. "val/acc>=0.99" (callbacks.TimeToTarget)


@dataclass(frozen=True)
class SweepOptions:
    """``sweep.*``: what ``-m`` does with a sweep dir that ran this sweep before."""

    retry_failed: bool = True
    force: bool = False
    max_jobs: Annotated[int, Ge(1)] | None = None
    target: str | None = None  # e.g. "val/acc>=0.99" (runs.sweep.parse_target)
    time_budget: str | float | None = None  # seconds or HH:MM:SS (runs.sweep.parse_budget)


@dataclass(frozen=True)
class Remedies:
    """``remedies.*``: how a run heals itself (``experiments.training.remedies``)."""

    oom: bool = True
    min_batch_size: Annotated[int, Ge(1)] = 8
    diverged_retries: Annotated[int, Ge(0)] = 0
    lr_scale: Annotated[float, Gt(0), Lt(1)] = 0.1


@dataclass(frozen=True)
class CrossValidation:
    """``cv.*``: k-fold cross-validation (one fold would validate on nothing unseen)."""

    folds: Annotated[int, Ge(2)] | None = None


SECTIONS = {"": RunOptions, "sweep": SweepOptions, "cv": CrossValidation, "remedies": Remedies}

# -- bounds of third-party arguments -----------------------------------------------------

# Chosen where a value out of range would fail late with a traceback or, worse, run and
# mislead: 0 epochs or batches "train" nothing and report the untrained net's scores.
# an int is a count of batches, a float a fraction of the split
_FRACTION = Annotated[float, Gt(0), Le(1)]
_LIMIT_BATCHES = Annotated[int, Ge(1)] | _FRACTION | None
_NO_EPOCHS = Why(
    "0 epochs would test untrained weights; -1 is no limit (with trainer.max_steps or "
    "trainer.max_time)"
)
_NO_STEPS = Why("0 steps would test untrained weights; -1 is no limit")
_NO_BATCHES = Why("0 batches would train nothing")
_PERIOD = Why("the cosine period in epochs; with trainer.max_epochs=-1 set scheduler.T_max=<N>")
_UNIT = Annotated[float, Ge(0), Lt(1)]
_OPTIMIZER = {
    # lr=0 stays valid: it is asked for on purpose (weights frozen while the loop runs; the
    # suite's checks of epoch metrics and early stopping use it), never reached by mistake
    "lr": Annotated[float, Ge(0)],
    "weight_decay": Annotated[float, Ge(0)],
    "eps": Annotated[float, Gt(0)],
}
_BETAS = Annotated[Sequence[_UNIT], Length(2)]
REFINED: dict[str, dict[str, Any]] = {
    "lightning.pytorch.Trainer": {
        "accelerator": Literal["auto", "cpu", "gpu", "cuda", "mps", "tpu"] | Built,
        "max_epochs": Annotated[int, Ge(1), _NO_EPOCHS] | Literal[-1] | None,
        "min_epochs": Annotated[int, Ge(0)] | None,
        "max_steps": Annotated[int, Ge(1), _NO_STEPS] | Literal[-1],
        "min_steps": Annotated[int, Ge(0)] | None,
        "limit_train_batches": Annotated[int, Ge(1), _NO_BATCHES] | _FRACTION | None,
        "limit_val_batches": _LIMIT_BATCHES,
        "limit_test_batches": _LIMIT_BATCHES,
        "limit_predict_batches": _LIMIT_BATCHES,
        "val_check_interval": _LIMIT_BATCHES,
        "overfit_batches": Annotated[int, Ge(0)] | Annotated[float, Ge(0), Le(1)],
        "num_sanity_val_steps": Annotated[int, Ge(-1)] | None,
        "check_val_every_n_epoch": Annotated[int, Ge(1)] | None,
        "num_nodes": Annotated[int, Ge(1)],
        "gradient_clip_val": Annotated[float, Ge(0)] | None,
        "log_every_n_steps": Annotated[int, Ge(1)] | None,
        "accumulate_grad_batches": Annotated[int, Ge(1)],
    },
    "torch.optim.SGD": {**_OPTIMIZER, "momentum": _UNIT, "dampening": _UNIT},
    "torch.optim.AdamW": {**_OPTIMIZER, "betas": _BETAS},
    "torch.optim.Adam": {**_OPTIMIZER, "betas": _BETAS},
    "torch.optim.lr_scheduler.StepLR": {
        "step_size": Annotated[int, Ge(1)],
        "gamma": Annotated[float, Gt(0)],
    },
    "torch.optim.lr_scheduler.CosineAnnealingLR": {
        "T_max": Annotated[int, Ge(1), _PERIOD],
        "eta_min": Annotated[float, Ge(0)],
    },
    "torch.optim.lr_scheduler.ReduceLROnPlateau": {
        "factor": Annotated[float, Gt(0), Lt(1)],
        "patience": Annotated[int, Ge(0)],
        "cooldown": Annotated[int, Ge(0)],
        "threshold": Annotated[float, Ge(0)],
        "min_lr": Annotated[float, Ge(0)] | Sequence[Annotated[float, Ge(0)]],
        "eps": Annotated[float, Ge(0)],
    },
    "lightning.pytorch.callbacks.EarlyStopping": {
        "patience": Annotated[int, Ge(0)],
        "min_delta": Annotated[float, Ge(0)],
    },
    "lightning.pytorch.callbacks.ModelCheckpoint": {
        "save_top_k": Annotated[int, Ge(-1)],
        "every_n_epochs": Annotated[int, Ge(0)] | None,
        "every_n_train_steps": Annotated[int, Ge(0)] | None,
    },
}

# sections train() builds: a mapping there without ``_target_`` cannot be built
BUILT = ("data", "model", "optimizer", "scheduler", "trainer")
OPTIONAL = ("optimizer", "scheduler")  # empty: none (training.build.optimizer_partials)

# digests of the configs that passed in this process: the command line checks a run's
# config before Hydra makes its run dir, and train() asks again for callers that did not
# come through the command line; the config is bound once
_PASSED: set[str] = set()


def check(cfg: DictConfig) -> None:
    """Raise UserError naming the first key of ``cfg`` that no constructor would accept.

    What needs no import comes first (missing values, sections without ``_target_``, the
    top-level sections, the rules that join keys); then each ``_target_`` is imported and
    its keys bound to its signature.
    """
    plain = OmegaConf.to_container(cfg, resolve=False)
    digest = hashlib.blake2b(json.dumps(plain, default=str).encode(), digest_size=16).hexdigest()
    if digest in _PASSED:
        return
    nodes = list(_nodes(plain))
    # ``???``: to_container keeps it as that text and resolves nothing, so a ${hydra:...}
    # that is not set yet does not fail here
    missing = sorted(k for k, v in nodes if v == "???" and not k.startswith("hydra"))
    if missing:
        raise UserError(
            f"missing value for {', '.join(missing)}: set it on the command line, "
            f"e.g. {missing[0]}=<value>"
        )
    _objects_have_targets(plain)
    for section, options in SECTIONS.items():
        node = plain.get(section) if section else plain
        if isinstance(node, dict):
            _check_node(cfg, section, options, node, known_only=not section)
    _cross_key_rules(cfg)
    for key, node in nodes:
        target = node.get("_target_") if isinstance(node, dict) else None
        if isinstance(target, str) and "${" not in target:
            _check_node(cfg, key or "<root>", target, node, known_only=False)
    _PASSED.add(digest)


def _objects_have_targets(plain: dict) -> None:
    """``experiment=finetune scheduler=none`` left ``scheduler: {warmup_epochs: 1}``: keys the
    experiment sets for an option the command line replaced. One line, not a traceback. An
    empty optimizer or scheduler (``scheduler=none ~scheduler.warmup_epochs``: every such key
    dropped) is none, as the builder reads it; an empty data, model or trainer is refused."""
    for section in BUILT:
        node = plain.get(section)
        if node == {} and section not in OPTIONAL:
            raise UserError(f"{section} is empty: choose a {section}= option")
        if isinstance(node, dict) and node and "_target_" not in node:
            keys = ", ".join(f"{section}.{k}" for k in node)
            raise UserError(
                f"{section} has {keys} but no _target_: these keys belong to a {section} "
                f"option that is not chosen (an experiment sets them, or a {section}=none "
                f"replaced it); choose a {section}= option that takes them, or drop them"
            )


def _nodes(node: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` for ``node`` and everything in it, mappings and lists too."""
    yield key, node
    if isinstance(node, dict | list):
        for k, v in node.items() if isinstance(node, dict) else enumerate(node):
            yield from _nodes(v, f"{key}.{k}" if key else str(k))


def _check_node(cfg: DictConfig, key: str, target: str | type, node: dict, known_only: bool):
    obj = _locate(key, target) if isinstance(target, str) else target
    name_of = target if isinstance(target, str) else f"{obj.__module__}.{obj.__name__}"
    try:
        signature = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return  # no signature to read (a builtin): the constructor checks its own arguments
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = {p.name: p for p in signature if p.kind in kinds}
    any_key = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature)
    hints = _hints(obj)
    for name, value in node.items():
        if name in HYDRA_KEYS:
            continue
        path = f"{key}.{name}" if key else str(name)
        param = params.get(name)
        if param is None:
            if not (any_key or known_only):
                raise UserError(_unknown_key(path, name, name_of, params))
            continue
        if isinstance(value, dict) and "_target_" in value:
            continue  # built by its own target, checked on its own
        if isinstance(value, str) and "${" in value:
            try:
                value = OmegaConf.select(cfg, path, throw_on_missing=False)
            except Exception:  # an interpolation only Hydra's run can resolve
                continue
        hint = REFINED.get(name_of, {}).get(name, hints.get(name, Any))
        spec = type_of(hint, none_default=param.default is None)
        if not spec.admits(value):
            why = f"; {spec.reason()}" if spec.reason() else ""
            raise UserError(f"{path}={show(value)} is not valid: expected {spec.describe()}{why}")


def _hints(obj: Any) -> dict[str, Any]:
    function = obj.__init__ if isinstance(obj, type) else obj
    # a dataclass's generated __init__ holds its fields' hints as text, each to be read in the
    # module of the class that declares the field (a base's bounds are not imported here)
    owner = obj if isinstance(obj, type) and dataclasses.is_dataclass(obj) else function
    try:
        return typing.get_type_hints(owner, include_extras=True)
    except Exception:  # a name imported only for type checkers: each hint on its own
        found: dict[str, Any] = {}
        for name, hint in getattr(function, "__annotations__", {}).items():
            one = types.SimpleNamespace(__annotations__={name: hint})
            try:
                namespace = getattr(function, "__globals__", None)
                found.update(typing.get_type_hints(one, namespace, include_extras=True))
            except Exception:  # left to the constructor
                pass
        return found


def _locate(key: str, target: str) -> Any:
    """Import what ``target`` names; one line with a did-you-mean when it does not exist."""
    parts = target.split(".")
    where = f"{key}._target_={target!r}"
    if not all(p.isidentifier() for p in parts):
        raise UserError(f"{where}: expected a dotted name, e.g. experiments.models.MLP")
    obj = None
    for i, part in enumerate(parts):
        dotted = ".".join(parts[: i + 1])
        if obj is not None and hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        if obj is None or isinstance(obj, types.ModuleType):
            try:
                obj = importlib.import_module(dotted)
                continue
            except ImportError as err:
                if not isinstance(err, ModuleNotFoundError) or err.name != dotted:
                    # the module exists; it, or something it imports, failed
                    why = one_line(err)
                    raise UserError(f"{where}: importing {dotted} failed: {why}") from None
        if obj is None:
            raise UserError(f"{where}: no module named '{dotted}'")
        names = [n for n in dir(obj) if not n.startswith("_")]
        close = difflib.get_close_matches(part, names, n=1)
        hint = f" (did you mean {'.'.join(parts[:i] + close)}?)" if close else ""
        raise UserError(f"{where}: '{'.'.join(parts[:i])}' has no '{part}'{hint}")
    return obj


def _unknown_key(path: str, name: Any, target: str, params: dict) -> str:
    names = sorted(params)
    close = difflib.get_close_matches(str(name), names, n=1)
    if close:
        parent = path.rpartition(".")[0]
        hint = f"did you mean {parent + '.' if parent else ''}{close[0]}?"
    else:
        more = f", ... ({len(names)} in all)" if len(names) > 12 else ""
        hint = f"it takes {', '.join(names[:12])}{more}"
    return f"{path}: {target} has no argument '{name}'; {hint}"


# -- rules that join keys ----------------------------------------------------------------


def _cross_key_rules(cfg: DictConfig) -> None:
    """Checked before the targets' own types: a rule passes over a value of the wrong type
    (binding names that one)."""
    epochs = _select(cfg, "trainer.max_epochs")
    if epochs == -1 and _select(cfg, "trainer.max_steps") in (None, -1):
        if _select(cfg, "trainer.max_time") is None:
            raise UserError(
                "trainer.max_epochs=-1 trains forever: also set trainer.max_steps=<N> or "
                "trainer.max_time=DD:HH:MM:SS, or give trainer.max_epochs=<N>"
            )
    warmup = _select(cfg, "scheduler.warmup_epochs")
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (warmup, epochs))
    if numbers and epochs > 0 and not 0 <= warmup < epochs:
        raise UserError(
            f"scheduler.warmup_epochs={warmup} is not valid: the warmup must be shorter than the "
            f"run (trainer.max_epochs={epochs})"
        )
    for key, parse in (("sweep.target", parse_target), ("sweep.time_budget", parse_budget)):
        value = _select(cfg, key)
        if value is not None:
            parse(value)
    if cfg.get("target") is not None:
        parse_target(cfg.get("target"), "target")
    metric = cfg.get("optimized_metric")
    if metric is not None and "/" not in str(metric):
        raise UserError(
            f"optimized_metric={metric!r} is not valid: expected stage/name, e.g. val/acc"
        )


def _select(cfg: DictConfig, key: str):
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=False)
    except Exception as err:  # an interpolation that cannot resolve
        raise UserError(f"{key}: {err}") from None
