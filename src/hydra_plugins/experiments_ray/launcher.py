"""The Ray launcher. Locally it starts Ray itself; ``address=<head>:<port>`` joins a cluster.

Each job runs in a Ray worker process, in the sweep's working dir, through Hydra's own
``run_job``: the job dir, logging, ``env_set`` and callbacks (the sweep summary) are Hydra's,
as with the joblib and submitit launchers. As Ray does by default, CPU jobs may run one
after another in the same worker process (as joblib's workers do; the basic launcher runs
all jobs in one), and a GPU job gets a fresh process, so that CUDA starts with only the GPUs
Ray gave it (``CUDA_VISIBLE_DEVICES``) and frees their memory when it ends.

A job Ray loses (its worker or node died, or Ray's memory monitor killed it) is recorded as
``lost`` in its ``job.json`` and run again, ``lost_retries`` times, wherever a slot frees; the
run continues from its last checkpoint when it saved one. Its summary row says so.

With the Optuna sweeper each of its ``n_jobs`` workers asks for a trial as soon as its last
one ends, so every free slot takes the next trial (no batch barrier)."""

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from experiments.runs.sweep import LOST_ENV, NODE_ENV

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


def _lost_errors() -> tuple[type[BaseException], ...]:
    import ray.exceptions as e

    return (e.WorkerCrashedError, e.NodeDiedError, e.OutOfMemoryError, e.ObjectLostError,
            e.LocalRayletDiedError)  # fmt: skip


def job(
    hydra_context, task_function, config: DictConfig, singleton_state, cwd: str, lost: str | None
) -> JobReturn:
    """One sweep job, in a Ray worker: Hydra's ``run_job`` in the sweep's working dir.
    ``lost``: why an earlier attempt was lost (its job.json says so)."""
    import ray
    from hydra.core.singleton import Singleton
    from hydra.core.utils import run_job, setup_globals

    from experiments.console import filter_upstream_warnings

    filter_upstream_warnings()  # as the command line does (this is a new process)
    os.chdir(cwd)
    Singleton.set_state(singleton_state)
    setup_globals()
    os.environ[NODE_ENV] = ray.get_runtime_context().get_node_id()
    os.environ.pop(LOST_ENV, None)  # a worker runs several jobs: not an earlier job's
    if lost:
        os.environ[LOST_ENV] = lost
    return run_job(
        hydra_context=hydra_context,
        task_function=task_function,
        config=config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


class RayLauncher(Launcher):
    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from hydra.core.singleton import Singleton
        from hydra.core.utils import configure_log, setup_globals

        from experiments.config.ray import connect

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

        def submit(cfg, lost=None):
            return remote.remote(self.hydra_context, self.task_function, cfg, state, cwd, lost)

        pending = {submit(cfg): (k, 0) for k, cfg in enumerate(configs)}
        results: list[JobReturn | None] = [None] * len(configs)
        retries = int(s.get("lost_retries") or 0)
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            k, attempt = pending.pop(ref)
            try:
                results[k] = ray.get(ref)
            except _lost_errors() as err:
                reason = _first_line(err)
                cfg = configs[k]
                _record_lost(cfg, reason, retried=attempt < retries)
                if attempt < retries:
                    log.warning("job %s lost (%s): running it again", cfg.hydra.job.num, reason,
                                extra={"sweep_line": True})  # fmt: skip
                    pending[submit(cfg, reason)] = (k, attempt + 1)
                else:
                    results[k] = _failed(cfg, err)
            except ray.exceptions.RayError as err:  # the task could not run at all
                _record_lost(configs[k], _first_line(err), retried=False, status="failed")
                results[k] = _failed(configs[k], err)
        return results

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
    from experiments.tracking.sweep_summary import record_lost

    record_lost(_job_dir(cfg), int(cfg.hydra.job.num), list(cfg.hydra.overrides.task), reason,
                retried, status)  # fmt: skip


def _failed(cfg: DictConfig, err: BaseException) -> JobReturn:
    """The JobReturn of a job that did not come back from Ray."""
    from experiments.compat.hydra import failed_job

    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(_job_dir(cfg))
    return failed_job(cfg, err, os.getcwd())


def _first_line(err: BaseException) -> str:
    from experiments.errors import one_line

    return f"{type(err).__name__}: {one_line(err)}"[:300]
