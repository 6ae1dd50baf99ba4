"""Where does the training time go? torch.profiler over a window of steps, plus a cheap
whole-epoch split of waiting-for-data versus compute, and a verdict with the knob to turn."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import lightning as L
import torch
from torch.profiler import ProfilerActivity, profile, schedule

from experiments.compat.torch import quiet_profiler
from experiments.runs.files import write_json

log = logging.getLogger(__name__)


class _FetchClock:
    """Stands in for ``trainer.profiler`` during the profiled epoch to time the loop's own
    "fetch the next batch" action (Lightning reports it to its profiler), so waiting for
    data is told apart from the loop's other work between two steps."""

    ACTION = "train_dataloader_next"

    def __init__(self, inner, clock) -> None:
        self.inner = inner
        self.clock = clock
        self.total = 0.0
        self._t0: float | None = None

    def start(self, action_name: str) -> None:
        if action_name.endswith(self.ACTION):
            self._t0 = self.clock()
        self.inner.start(action_name)

    def stop(self, action_name: str) -> None:
        self.inner.stop(action_name)
        if action_name.endswith(self.ACTION) and self._t0 is not None:
            self.total += self.clock() - self._t0
            self._t0 = None

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class Profiling(L.Callback):
    """Profile one training epoch and say whether data loading or compute dominates.

    The profiled epoch's time between steps (fetching and moving the next batch: the data
    wait) is set against the time inside each step (forward, backward, optimizer), under
    ``torch.profiler`` with a wait/warmup/active schedule. At the epoch's end it writes
    ``trace.json`` (Chrome/Perfetto), ``ops.txt`` (top operators) and ``summary.json`` into
    ``dirpath``, logs ``perf/data_wait_frac``, ``perf/steps_per_s`` and ``perf/samples_per_s``
    and prints a verdict. With ``enabled: false`` every hook returns at once.

    Args:
        enabled: turn profiling on (``profile=true`` on the command line).
        dirpath: output folder; None means ``<trainer.default_root_dir>/profile``.
        epoch: which training epoch to profile (0-based; the last one if the run is
            shorter). The default, 1, skips the first epoch's one-off costs (worker
            start-up, filling data caches).
        wait: profiler schedule: steps skipped first.
        warmup: steps traced but discarded (profiler start-up noise).
        active: steps recorded into the trace.
        profile_memory: record tensor allocations (slower, bigger trace).
        row_limit: operators listed in ``ops.txt``.
        data_bound_threshold: data-wait share of step time above which the verdict says
            data loading is the bottleneck.
    """

    def __init__(
        self,
        enabled: bool = True,
        dirpath: str | None = None,
        epoch: int = 1,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        record_shapes: bool = True,
        profile_memory: bool = False,
        row_limit: int = 25,
        data_bound_threshold: float = 0.25,
    ) -> None:
        self.enabled, self.epoch = enabled, epoch
        self.dirpath = Path(dirpath) if dirpath else None
        self.wait, self.warmup, self.active = wait, warmup, active
        self.record_shapes, self.profile_memory = record_shapes, profile_memory
        self.row_limit, self.data_bound_threshold = row_limit, data_bound_threshold
        self._prof: profile | None = None
        self._trace_written = False
        self._reset_timers()
        self._clock: _FetchClock | None = None

    def now(self) -> float:
        """The clock every interval is read from (seconds; a test replaces it)."""
        return time.perf_counter()

    def _reset_timers(self) -> None:
        self._step_start: float | None = None
        self._last_end: float | None = None
        self._wait_s = 0.0
        self._compute_s = 0.0
        self._steps = 0
        self._samples = 0
        self._epoch_start = 0.0

    def _active(self, trainer) -> bool:
        if not self.enabled or trainer.sanity_checking or not trainer.is_global_zero:
            return False  # under DDP rank 0 profiles for all (one trace, one verdict)
        epoch = self.epoch
        if trainer.max_epochs is not None and trainer.max_epochs > 0:
            epoch = min(epoch, trainer.max_epochs - 1)
        return trainer.current_epoch == epoch

    def _sync(self, pl_module) -> None:
        if pl_module.device.type == "cuda":  # kernels run async: wait for them to be timed
            torch.cuda.synchronize(pl_module.device)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if not self._active(trainer):
            return
        if self.dirpath is None:
            self.dirpath = Path(trainer.default_root_dir) / "profile"
        self.dirpath.mkdir(parents=True, exist_ok=True)
        cuda = [ProfilerActivity.CUDA] if pl_module.device.type == "cuda" else []
        self._reset_timers()
        self._clock = _FetchClock(trainer.profiler, self.now)
        trainer.profiler = self._clock
        self._sync(pl_module)
        with quiet_profiler():
            self._prof = profile(
                activities=[ProfilerActivity.CPU, *cuda],
                schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1),
                record_shapes=self.record_shapes,
                profile_memory=self.profile_memory,
                on_trace_ready=self._export_trace,
            )
            self._prof.start()
        self._epoch_start = self._last_end = self.now()

    def _export_trace(self, prof: profile) -> None:
        prof.export_chrome_trace(str(self.dirpath / "trace.json"))
        self._trace_written = True

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._prof is None:
            return
        now = self.now()
        self._wait_s += now - self._last_end
        self._step_start = now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._prof is None:
            return
        self._sync(pl_module)
        now = self.now()
        self._compute_s += now - self._step_start
        self._steps += 1
        first = batch[0] if isinstance(batch, list | tuple) else batch
        self._samples += len(first) if hasattr(first, "__len__") else 0
        with quiet_profiler():
            self._prof.step()  # the trace is written when the active window ends
        self._last_end = self.now()  # the profiler's own step cost is not data wait

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        with quiet_profiler():
            prof.stop()
        trainer.profiler = self._clock.inner
        elapsed = self.now() - self._epoch_start
        step_time = self._wait_s + self._compute_s  # between steps + inside steps
        fetch = min(self._clock.total, self._wait_s)  # waiting for the next batch
        frac = fetch / step_time if step_time > 0 else 0.0
        loop_frac = (self._wait_s - fetch) / step_time if step_time > 0 else 0.0
        loader = trainer.train_dataloader
        num_workers = getattr(loader, "num_workers", 0)
        pin_memory = bool(getattr(loader, "pin_memory", False))
        cuda = pl_module.device.type == "cuda"
        cached = getattr(trainer.datamodule, "cache", None)
        verdict = self._verdict(frac, loop_frac, num_workers, pin_memory, cuda, cached)
        sort_key = "device_time_total" if cuda else "cpu_time_total"
        if self._trace_written:
            table = prof.key_averages().table(sort_by=sort_key, row_limit=self.row_limit)
        else:
            table = (
                f"(no trace: the epoch had {self._steps} steps, fewer than "
                f"wait+warmup+active={self.wait + self.warmup + self.active})\n"
            )
        (self.dirpath / "ops.txt").write_text(table)
        summary = {
            "epoch": trainer.current_epoch + 1,  # 1-based, as the console counts
            "steps": self._steps,
            "samples": self._samples,
            "epoch_time_s": round(elapsed, 4),
            "data_wait_s": round(fetch, 4),
            "between_steps_s": round(self._wait_s, 4),
            "compute_s": round(self._compute_s, 4),
            "data_wait_frac": round(frac, 4),
            "loop_overhead_frac": round(loop_frac, 4),
            "steps_per_s": round(self._steps / elapsed, 3) if elapsed > 0 else 0.0,
            "samples_per_s": round(self._samples / elapsed, 2) if elapsed > 0 else 0.0,
            "num_workers": num_workers,
            "pin_memory": pin_memory,
            "device": str(pl_module.device),
            "trace": "trace.json" if self._trace_written else None,
            "ops_sorted_by": sort_key,
            "verdict": verdict,
        }
        write_json(self.dirpath / "summary.json", summary)  # rank 0 only: _active
        for key in ("data_wait_frac", "steps_per_s", "samples_per_s"):
            pl_module.log(f"perf/{key}", float(summary[key]), rank_zero_only=True)
        log.info("profile: %s (%s)", verdict, self.dirpath)

    def _verdict(self, frac: float, loop_frac: float, num_workers: int, pin_memory: bool,
                 cuda: bool, cached: bool | None) -> str:  # fmt: skip
        pct, loop = round(100 * frac), round(100 * loop_frac)
        if frac < self.data_bound_threshold:
            return (
                f"data loading is {pct}% of step time: compute dominates "
                f"(forward/backward/optimizer {100 - pct - loop}%, the training loop's own "
                f"work between steps {loop}%); see ops.txt for the top operators"
            )
        workers = min(max(2, 2 * num_workers), os.cpu_count() or 2)
        knobs = []
        if workers > num_workers:
            knobs.append(f"data.num_workers={workers} data.persistent_workers=true")
        if cuda and not pin_memory:
            knobs.append("data.pin_memory=true")
        if cached is False:
            knobs.append("data.cache=true (if the decoded images fit in memory)")
        if not knobs:
            knobs.append("cheaper per-sample transforms, or larger data.batch_size")
        return (
            f"data loading is {pct}% of step time (num_workers={num_workers}, "
            f"pin_memory={str(pin_memory).lower()}): try {' '.join(knobs)}"
        )
