"""torch.compile as a switch: compile the net in place, report compile time and graph
breaks, and fall back to eager rather than ever killing the run."""

from __future__ import annotations

import logging
import time

import lightning as L
import torch

from experiments.compat.torch import clear_graph_breaks, graph_breaks, suppress_dynamo_errors

log = logging.getLogger(__name__)


class TorchCompile(L.Callback):
    """Compile ``pl_module.net`` in place at fit start (``nn.Module.compile``).

    In-place compilation keeps ``state_dict`` keys free of ``_orig_mod.``, so checkpoints
    of a compiled run load into an uncompiled net. The first training step (which pays
    for compilation) is timed, and Dynamo's graph-break count and reasons are logged.
    Dynamo errors are suppressed while fitting: a frame that fails to compile runs in
    eager with a warning.

    Args:
        enabled: turn compilation on (``compile=true`` on the command line).
        mode: inductor mode: None (default), ``reduce-overhead``, ``max-autotune``, ...
        fullgraph: require one graph for the whole net (a graph break is then an error,
            reported and run in eager).
        dynamic: None lets torch decide; True/False forces dynamic/static shapes.
        backend: ``inductor`` (generates kernels), or ``eager`` / ``aot_eager`` to check
            graph capture without code generation.
    """

    def __init__(
        self,
        enabled: bool = True,
        mode: str | None = None,
        fullgraph: bool = False,
        dynamic: bool | None = None,
        backend: str = "inductor",
    ) -> None:
        self.enabled, self.mode, self.backend = enabled, mode, backend
        self.fullgraph, self.dynamic = fullgraph, dynamic
        self.compiled = False
        self.first_step_s: float | None = None
        self.graph_breaks: int | None = None
        self.break_reasons: dict[str, int] = {}
        self._t0: float | None = None
        self._suppress_before: bool | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        if not self.enabled:
            return
        net = getattr(pl_module, "net", pl_module)
        self._suppress_before = suppress_dynamo_errors(True)
        clear_graph_breaks()
        options = {"fullgraph": self.fullgraph, "dynamic": self.dynamic, "backend": self.backend}
        if self.mode is not None and self.backend == "inductor":
            options["mode"] = self.mode
        try:
            net.compile(**options)
        except Exception as err:
            log.warning("torch.compile failed (%s); training continues in eager", err)
            return
        self.compiled = True
        log.info("torch.compile on (%s): the first step includes compilation", options)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.compiled and self.first_step_s is None and self._t0 is None:
            self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.compiled or self.first_step_s is not None or self._t0 is None:
            return
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        self.first_step_s = time.perf_counter() - self._t0
        self.break_reasons = graph_breaks()
        self.graph_breaks = sum(self.break_reasons.values())
        reasons = "".join(f"\n  - {r} (x{n})" for r, n in list(self.break_reasons.items())[:5])
        log.info("compile: first step %.1f s, %d graph break(s)%s",
                 self.first_step_s, self.graph_breaks, reasons)  # fmt: skip
        for key in ("first_step_s", "graph_breaks"):
            pl_module.log(f"compile/{key}", float(getattr(self, key)), on_step=False, on_epoch=True)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self._suppress_before is not None:
            suppress_dynamo_errors(self._suppress_before)
            self._suppress_before = None
