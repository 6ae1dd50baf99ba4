"""The Ray launcher. Locally it starts Ray itself; ``address=<head>:<port>`` joins a cluster.

Each job runs in a Ray worker process, in the sweep's working dir, through Hydra's own
``run_job``: the job dir, logging, ``env_set`` and callbacks (the sweep summary) are Hydra's,
as with the joblib and submitit launchers. As Ray does by default, CPU jobs may run one
after another in the same worker process (as joblib's workers do; the basic launcher runs
all jobs in one), and a GPU job gets a fresh process, so that CUDA starts with only the GPUs
Ray gave it (``CUDA_VISIBLE_DEVICES``) and frees their memory when it ends.

A job Ray loses (its worker or node died, or Ray's memory monitor killed it) is recorded as
``lost`` in its ``job.json`` and run again, ``lost_retries`` times, wherever a slot frees; the
run continues from its last checkpoint when it saved one. Its summary row says so. A job lost
once more than that (or one Ray could not run at all) is recorded ``failed``: the other jobs
go on, the summary is written, and the sweep ends with one line (exit 1), not a traceback.

With the Optuna sweeper each of its ``n_jobs`` workers asks for a trial as soon as its last
one ends, so every free slot takes the next trial (no batch barrier)."""

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from experiments.compat.hydra import as_recorded_failure
from experiments.config.ray import connect
from experiments.console import filter_upstream_warnings
from experiments.errors import one_line
from experiments.runs.sweep import LOST_ENV, NODE_ENV

# Hydra imports every plugin module at the start of every run: ray (an optional extra) and the
# sweep summary (its plots import matplotlib) load only once a sweep runs on Ray (the imports
# marked lazy below)

log = logging.getLogger(__name__)


@dataclass
class RayLauncherConf:
    _target_: str = "hydra_plugins.experiments_ray.launcher.RayLauncher"
    # null: start Ray on this machine; <host>:<port> of a cluster's head; auto: the cluster
    # `ray start` runs on this machine
    address: str | None = None
    # what each job asks Ray for (a GPU job sees only its GPUs: CUDA_VISIBLE_DEVICES)
    cpus_per_job: float = 1.0
    gpus_per_job: float = 0.0
    # Ray started here: the CPUs and GPUs it may use (null: all of this machine's)
    num_cpus: int | None = None
    num_gpus: int | None = None
    # a job whose worker or node died runs again this many times
    lost_retries: int = 1


ConfigStore.instance().store(
    group="hydra/launcher", name="ray", node=RayLauncherConf, provider="experiments"
)


def job(
    hydra_context, task_function, config: DictConfig, singleton_state, cwd: str, lost: str | None
) -> JobReturn:
    """One sweep job, in a Ray worker: Hydra's ``run_job`` in the sweep's working dir.
    ``lost``: why an earlier attempt was lost (its job.json says so)."""
    import ray  # lazy: see the top

    filter_upstream_warnings()  # as the command line does (this is a new process)
    os.chdir(cwd)
    Singleton.set_state(singleton_state)
    setup_globals()
    os.environ[NODE_ENV] = ray.get_runtime_context().get_node_id()
    os.environ.pop(LOST_ENV, None)  # a worker runs several jobs: not an earlier job's
    if lost:
        os.environ[LOST_ENV] = lost
    return run_job(
        hydra_context=hydra_context, task_function=task_function, config=config,
        job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir",
    )  # fmt: skip


class RayLauncher(Launcher):
    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        # the jobs submitted to Ray and not yet back (each sweeper thread adds its own)
        self._running: dict[Any, DictConfig] = {}
        self._lock = threading.Lock()

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function
        # SIGTERM (a scheduler's stop, `kill`) ends the sweep: the jobs running on Ray are
        # recorded as interrupted and cancelled, the summary written, exit 143. Set here, in
        # the main thread (the Optuna sweeper launches from its worker threads)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame) -> None:
        import ray  # lazy: see the top

        with self._lock:
            running = list(self._running.items())
            self._running.clear()
        for ref, cfg in running:
            _record_lost(cfg, "stopped by SIGTERM while it ran on Ray; the same command again "
                         "resumes it from its last checkpoint", retried=False,
                         status="interrupted")  # fmt: skip
            with contextlib.suppress(Exception):  # Ray is shutting down too: nothing to cancel
                ray.cancel(ref, force=True)
        if self.config is not None:
            self._write_summary(Path(str(self.config.hydra.sweep.dir)).absolute())
        log.error("SIGTERM: %d running job(s) recorded as interrupted; the same command again "
                  "resumes the sweep", len(running), extra={"sweep_line": True})  # fmt: skip
        # exit here: raised from inside ray.wait, SystemExit came back as another error
        with contextlib.suppress(Exception):
            ray.shutdown()  # the Ray this sweep started, if it did
        logging.shutdown()
        os._exit(128 + signum)

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        s = self.settings
        ray = connect(s.get("address"), s.get("num_cpus"), s.get("num_gpus"))
        remote = ray.remote(
            num_cpus=float(s.get("cpus_per_job") or 1),
            num_gpus=float(s.get("gpus_per_job") or 0),
            max_retries=0,  # a lost job is retried here, where it is recorded
        )(job)
        configs = [self._job_config(list(o), initial_job_idx + i, sweep_dir)
                   for i, o in enumerate(job_overrides)]  # fmt: skip
        state, cwd = Singleton.get_state(), os.getcwd()
        pending: dict[Any, tuple[int, int]] = {}

        def start(k: int, attempt: int, lost: str | None = None) -> None:
            ref = remote.remote(
                self.hydra_context, self.task_function, configs[k], state, cwd, lost
            )
            pending[ref] = (k, attempt)
            with self._lock:
                self._running[ref] = configs[k]

        for k in range(len(configs)):
            start(k, 0)
        results: list[JobReturn | None] = [None] * len(configs)
        retries = int(s.get("lost_retries") or 0)
        e = ray.exceptions  # a job's worker or node died, or Ray's memory monitor killed it
        lost_errors = (e.WorkerCrashedError, e.NodeDiedError, e.OutOfMemoryError,
                       e.ObjectLostError, e.LocalRayletDiedError)  # fmt: skip
        while pending:
            # a bounded wait: a signal's handler runs between two waits at the latest
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            if not ready:
                continue
            (ref,) = ready
            k, attempt = pending.pop(ref)
            with self._lock:
                self._running.pop(ref, None)
            try:
                results[k] = ray.get(ref)
            except lost_errors as err:
                reason = _first_line(err)
                cfg = configs[k]
                if attempt < retries:
                    _record_lost(cfg, reason, retried=True)
                    log.warning("job %s lost (%s): running it again", cfg.hydra.job.num, reason,
                                extra={"sweep_line": True})  # fmt: skip
                    start(k, attempt + 1, reason)
                else:
                    lost = f"lost {attempt + 1} time{'s' if attempt else ''}, last: {reason}"
                    results[k] = self._recorded_failure(cfg, lost)
            except e.RayError as err:  # the task could not run at all
                results[k] = self._recorded_failure(configs[k], _first_line(err))
        return results

    def _recorded_failure(self, cfg: DictConfig, reason: str) -> JobReturn:
        """A job that did not come back from Ray: recorded ``failed`` (with ``reason``) in
        its job.json and the summary; to the sweeper, a job that is passed over
        (``compat.hydra.as_recorded_failure``: the summary callback ends the sweep with one
        line)."""
        _record_lost(cfg, reason, retried=False, status="failed")
        log.error("job %s failed: %s", cfg.hydra.job.num, reason, extra={"sweep_line": True})
        self._write_summary(Path(str(cfg.hydra.sweep.dir)))
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = str(_job_dir(cfg))
        passed_over = JobReturn(
            overrides=list(cfg.hydra.overrides.task), cfg=cfg, hydra_cfg=cfg,
            working_dir=os.getcwd(), task_name=str(cfg.hydra.job.name),
        )  # fmt: skip
        as_recorded_failure(passed_over)
        return passed_over

    def _write_summary(self, sweep_dir: Path) -> None:
        from experiments.tracking.sweep_summary import write_summary  # lazy: see the top

        write_summary(sweep_dir, str(self.config.get("optimized_metric", "")),
                      str(self.config.get("optimized_mode", "max")))  # fmt: skip

    def _job_config(self, overrides: list[str], idx: int, sweep_dir: Path) -> DictConfig:
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(cfg):
            cfg.hydra.job.id = f"{cfg.hydra.job.name}_{idx}"
            cfg.hydra.job.num = idx
            # one resolved, absolute dir: a worker elsewhere (or later) must not resolve
            # ${now:} or a relative path again
            cfg.hydra.sweep.dir = str(sweep_dir)
        return cfg


def _job_dir(cfg: DictConfig) -> Path:
    return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)


def _record_lost(cfg: DictConfig, reason: str, retried: bool, status: str = "lost") -> None:
    from experiments.tracking.sweep_summary import record_lost  # lazy: see the top

    record_lost(_job_dir(cfg), int(cfg.hydra.job.num), list(cfg.hydra.overrides.task), reason,
                retried, status)  # fmt: skip


def _first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {one_line(err)}"[:300]
