"""The torch.compile toggle: clean keys, graph-break report, eager fallback."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from experiments.callbacks import TorchCompile
from experiments.runs.layout import RunDir
from experiments.runs.weights import load_state_dict_file, safe_load
from experiments.training.pipeline import train
from tests.helpers import SlowNet


def _compile_callback(cfg, monkeypatch) -> list[TorchCompile]:
    """Instantiate callbacks as train() does, but keep a handle on the TorchCompile one."""
    seen: list[TorchCompile] = []
    real_init = TorchCompile.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        seen.append(self)

    monkeypatch.setattr(TorchCompile, "__init__", init)
    return seen


@pytest.mark.slow
def test_compiled_run_checkpoints_load_uncompiled(make_cfg, tmp_path, monkeypatch):
    # one real inductor compile (cold: ~30-45 s on 2 CPU cores); keep compile tests few
    seen = _compile_callback(None, monkeypatch)
    cfg = make_cfg(
        "compile=true",
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=2",
        "trainer.limit_test_batches=2",
    )
    train(cfg)
    assert seen[0].compiled and seen[0].first_step_s > 0 and seen[0].graph_breaks == 0
    best = RunDir(tmp_path / "run").best_weights
    compiled_keys = set(safe_load(best))  # as written (read_state_dict would strip a prefix)
    eager = instantiate(cfg.model.net, in_shape=(1, 8, 8), num_classes=10)
    assert compiled_keys == set(eager.state_dict())
    load_state_dict_file(eager, best)
    assert eager(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def test_data_dependent_branch_is_reported_as_a_graph_break(make_cfg, monkeypatch):
    seen = _compile_callback(None, monkeypatch)
    # backend=eager: Dynamo captures graphs (and breaks them) without generating code
    train(
        make_cfg(
            "compile=true",
            "callbacks.compile.backend=eager",
            "debug=fast",
            "model.net._target_=tests.test_torch_compile.BranchyNet",
            "~model.net.hidden_sizes",
            "~model.net.dropout",
        )
    )
    assert seen[0].compiled and seen[0].graph_breaks >= 1
    assert seen[0].break_reasons


def test_compile_failure_warns_and_trains_in_eager(make_cfg, monkeypatch, caplog):
    seen = _compile_callback(None, monkeypatch)
    metrics = train(
        make_cfg("compile=true", "callbacks.compile.backend=no_such_backend", "debug=fast")
    )
    assert not seen[0].compiled
    assert "training continues in eager" in caplog.text
    assert metrics["train/loss"] > 0


class BranchyNet(SlowNet):
    """A net with a data-dependent ``if``: torch.compile must break the graph there."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = super().forward(x)
        return h * 2 if h.sum() > 0 else h  # depends on the values: Dynamo cannot trace it
