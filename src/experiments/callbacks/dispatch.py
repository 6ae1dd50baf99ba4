"""Fewer callback calls per step: Lightning calls every per-batch hook of every callback on
every step (a profiler context and a name format each, ~2 µs), even the base class's
no-ops. A hook that a callback's class does not override is set to None on that instance,
which Lightning's dispatcher skips (it calls a hook only when it is callable)."""

from __future__ import annotations

import lightning as L

PER_BATCH_HOOKS = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
)


def skip_unused_hooks(callbacks: list) -> None:
    """Null the per-batch hooks each callback inherits unchanged from ``L.Callback``.
    Hooks a class overrides, or an instance set itself, stay."""
    for callback in callbacks:
        for name in PER_BATCH_HOOKS:
            inherited = getattr(type(callback), name, None) is getattr(L.Callback, name)
            if inherited and name not in vars(callback):
                setattr(callback, name, None)
