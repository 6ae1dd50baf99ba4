"""``callbacks.weight_averaging.kind=ema|last_k``: validate, test, checkpoint as best and
export an average of the trained weights, for any LightningModule (the classifier, the
regression and segmentation modules, a module of your own)."""

from __future__ import annotations

import logging
from collections import deque
from typing import Annotated, Any, Literal

import lightning as L
import torch

from experiments.config.hints import Ge, Gt, Lt
from experiments.errors import UserError

log = logging.getLogger(__name__)

KINDS = ("none", "ema", "last_k")


class WeightAveraging(L.Callback):
    """Keep an average of the module's weights (every parameter and persistent buffer)
    and put it in the module whenever the module is not training a batch: validation,
    the weights ``StateDictCheckpoint`` saves (``best``/``last.safetensors``), the end of
    fit and so the test. The raw weights are put back before the next training batch.

    Why not Lightning's ``WeightAveraging``/``EMAWeightAveraging`` (2.6): they swap the
    average back out at ``on_validation_epoch_end``, before ``on_validation_end`` where
    ``StateDictCheckpoint`` saves the best weights, so ``best.safetensors`` would hold the
    raw weights; their EMA has no warm-up (a short run's average would be mostly its random
    start); an average of the last k epochs is not an ``AveragedModel`` update rule; and
    their checkpoint state does not restore an epoch-based window. Here the average goes in
    when a training epoch's last batch ends (or a validation starts) and comes out when a
    training batch starts, whatever the order of the other callbacks.

    Full checkpoints keep the module's raw weights in ``state_dict`` (a resume trains on
    exactly them) and the average, the window and the step count in this callback's
    state, so a resumed run continues the average bit for bit.

    Args:
        kind: ``none`` (not built), ``ema`` (exponential moving average, updated after
            every optimizer step) or ``last_k`` (the mean of the weights at the end of each
            of the last ``k`` training epochs).
        decay: the EMA's decay in (0, 1); it warms up as ``min(decay, (1 + t) / (10 + t))``
            at optimizer step t, so a short run's average is not dominated by its start.
        k: how many epochs ``last_k`` averages (fewer until that many have ended).
    """

    def __init__(
        self,
        kind: Literal["none", "ema", "last_k"] = "none",
        decay: Annotated[float, Gt(0), Lt(1)] = 0.999,
        k: Annotated[int, Ge(1)] = 3,
    ) -> None:
        if kind not in KINDS:
            raise UserError(
                f"callbacks.weight_averaging.kind={kind!r} is not valid; use one of "
                f"{', '.join(KINDS)}"
            )
        if isinstance(decay, bool) or not isinstance(decay, int | float) or not 0 < decay < 1:
            raise UserError(
                f"callbacks.weight_averaging.decay={decay} must be in (0, 1), e.g. 0.999"
            )
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise UserError(f"callbacks.weight_averaging.k={k} must be a whole number >= 1")
        self.kind, self.decay, self.k = kind, float(decay), int(k)
        self._names: list[str] = []
        self._live: list[torch.Tensor] = []  # the module's own tensors
        self._other: list[torch.Tensor] = []  # the average, or the raw weights while swapped
        self._window: deque[list[torch.Tensor]] = deque(maxlen=self.k)  # last_k's epochs
        self._swapped = False  # the module holds the average now
        self._last_step = 0  # the optimizer step the EMA was last updated at
        self._loaded: dict[str, Any] | None = None  # a resumed run's state, until fit starts

    @torch.no_grad()
    def _swap(self) -> None:
        for live, other in zip(self._live, self._other, strict=True):
            kept = live.clone()
            live.copy_(other)
            other.copy_(kept)
        self._swapped = not self._swapped

    def _swap_in(self) -> None:
        # only where there is an average (last_k: once an epoch has ended)
        if not self._swapped and self._live and (self.kind == "ema" or self._window):
            self._swap()

    @torch.no_grad()
    def _ema_step(self, step: int) -> None:
        decay = min(self.decay, (1 + step) / (10 + step))
        for live, avg in zip(self._live, self._other, strict=True):
            if avg.dtype.is_floating_point:
                avg.lerp_(live, 1.0 - decay)
            else:  # BatchNorm's num_batches_tracked: the latest count
                avg.copy_(live)

    @torch.no_grad()
    def _epoch_snapshot(self) -> None:
        self._window.append([t.detach().clone() for t in self._live])
        for i, avg in enumerate(self._other):
            if avg.dtype.is_floating_point:
                avg.copy_(torch.stack([w[i] for w in self._window]).mean(0))
            else:
                avg.copy_(self._window[-1][i])

    def setup(self, trainer, pl_module, stage: str) -> None:
        others = [c for c in trainer.callbacks if isinstance(c, WeightAveraging)]
        if len(others) > 1:
            raise UserError(
                "two weight averagings (model.ema_decay and callbacks.weight_averaging, or "
                "a callback of your own): keep one, e.g. callbacks.weight_averaging.kind=ema "
                "with model.ema_decay=null"
            )

    def on_fit_start(self, trainer, pl_module) -> None:
        # here the module is on its device, and a resumed run's weights are restored
        seen: set[int] = set()
        self._names, self._live = [], []
        persistent = set(pl_module.state_dict().keys())
        for name, tensor in [*pl_module.named_parameters(), *pl_module.named_buffers()]:
            if name in persistent and id(tensor) not in seen:
                seen.add(id(tensor))
                self._names.append(name)
                self._live.append(tensor.data)
        self._other = [t.detach().clone() for t in self._live]
        self._window.clear()
        self._swapped = False
        if self._loaded is not None:
            self._restore(self._loaded)
            self._loaded = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._swapped:
            self._swap()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self._live:
            return
        step = trainer.global_step
        if self.kind == "ema" and step > self._last_step:
            self._ema_step(step)
            self._last_step = step
        steps = trainer.max_steps
        last = trainer.is_last_batch or batch_idx + 1 >= trainer.num_training_batches
        if last or (steps is not None and 0 < steps <= step):  # the epoch's (or run's) end
            if self.kind == "last_k":
                self._epoch_snapshot()
            # from here to the next batch (validation, the epoch's checkpoints, the end of
            # fit) the module holds the average
            self._swap_in()

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._swap_in()  # a validation inside an epoch, or trainer.validate after fit

    def on_train_end(self, trainer, pl_module) -> None:
        self._swap_in()  # tested (and best.safetensors, where none was saved) is the average

    def state_dict(self) -> dict[str, Any]:
        if not self._live:
            return {"kind": self.kind}
        average = self._live if self._swapped else self._other  # wherever it is now
        return {
            "kind": self.kind,
            "decay": self.decay,
            "k": self.k,
            "last_step": self._last_step,
            "average": dict(zip(self._names, [t.clone() for t in average], strict=True)),
            "window": [dict(zip(self._names, w, strict=True)) for w in self._window],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        kind = state_dict.get("kind")
        if kind != self.kind:
            raise UserError(
                f"callbacks.weight_averaging.kind={self.kind}: the checkpoint was trained with "
                f"kind={kind}; resume with the kind it was trained with"
            )
        self._loaded = dict(state_dict) if "average" in state_dict else None

    @torch.no_grad()
    def _restore(self, state: dict[str, Any]) -> None:
        average = state["average"]
        known = set(self._names)
        if not set(average) <= known:
            extra = sorted(set(average) - known)[:3]
            raise UserError(
                f"the checkpoint's averaged weights do not fit the model ({', '.join(extra)} "
                f"not in it): resume the run with the model it was trained with"
            )
        # a tensor the checkpoint lacks (an older run's EMA covered the net only) starts at
        # the module's own value
        for name, avg in zip(self._names, self._other, strict=True):
            if name in average:
                avg.copy_(average[name])
        self._window.clear()
        for saved in state.get("window") or []:
            self._window.append(
                [saved[n].to(t.device) if n in saved else t.clone()
                 for n, t in zip(self._names, self._live, strict=True)]
            )  # fmt: skip
        self._last_step = int(state.get("last_step", 0))

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        if not self._swapped:
            return
        # the module holds the average now: the checkpoint's state_dict gets the raw
        # weights, which a resume trains on (its tensors share storage with the module's)
        pairs = zip(self._live, self._other, strict=True)
        raw = {t.data_ptr(): other for t, other in pairs if t.numel()}
        state = checkpoint["state_dict"]
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.numel() and value.data_ptr() in raw:
                state[key] = raw[value.data_ptr()].clone()
