"""Each use of a library's private API (experiments.compat), pinned: when an upgrade changes
one, these fail and say which, before a run does."""

from __future__ import annotations

import inspect


def test_fork_launcher_is_made_signal_safe():
    import lightning as L

    from experiments.compat import _SignalSafeLauncher, signal_safe_workers

    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp_fork", logger=False, enable_progress_bar=False
    )
    assert hasattr(trainer.strategy, "_launcher"), "Lightning: Strategy._launcher is gone"
    signal_safe_workers(trainer)
    assert type(trainer.strategy._launcher) is _SignalSafeLauncher, (
        "Lightning's ddp_fork launcher is no longer _MultiProcessingLauncher: "
        "compat.signal_safe_workers leaves it as it is (workers would hang on SIGTERM)"
    )
    params = list(inspect.signature(_SignalSafeLauncher.__mro__[1]._wrapping_function).parameters)
    assert params[:4] == ["self", "process_idx", "trainer", "function"], (
        f"Lightning: _MultiProcessingLauncher._wrapping_function takes {params} now"
    )
