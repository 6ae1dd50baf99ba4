"""Hydra's private API (see ``experiments.compat``). One Hydra instance for the command
line: the pre-check composes the config with it, and a plain single run is then handed to
Hydra's own job runner with that same config.

``@hydra.main`` composes a single run twice (once to read ``hydra.mode``, once to run),
and the pre-check composed it a third time, ~0.1 s each on the default config. A run
whose command line is only overrides (no ``-m``, no ``--cfg``/``--info``/other flags, no
sweep values) and whose config does not switch to multirun is composed once here and run
through ``hydra.core.utils.run_job`` as ``Hydra.run`` does: the run dir, ``.hydra/*.yaml``,
logging, ``hydra.job.env_set`` and Hydra callbacks are Hydra's own. Everything else goes
through ``@hydra.main`` unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra._internal.callbacks import Callbacks
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path, run_and_report
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import JobRuntime, JobStatus, configure_log, run_job
from hydra.types import HydraContext, RunMode
from hydra.version import setbase
from omegaconf import DictConfig, open_dict, read_write


class Composer:
    """Composes ``config_name`` from ``conf_dir`` with Hydra's command-line search path."""

    def __init__(self, conf_dir: str, config_name: str) -> None:
        setbase("1.3")
        self.conf_dir, self.config_name = Path(conf_dir), config_name
        search_path = create_config_search_path(conf_dir)  # what @hydra.main builds
        GlobalHydra.instance().clear()
        self.hydra = Hydra.create_main_hydra2(task_name=config_name, config_search_path=search_path)
        GlobalHydra.instance().clear()  # initialized again only to run (run_composed)

    def compose(self, overrides: list[str]) -> DictConfig:
        """The whole config, ``hydra`` node included, composed for a single run."""
        return self.hydra.compose_config(
            config_name=self.config_name, overrides=list(overrides), run_mode=RunMode.RUN,
            from_shell=True, with_log_configuration=False,
        )  # fmt: skip


def task_view(full: DictConfig) -> DictConfig:
    """``full`` without its ``hydra`` node (what the task function receives)."""
    task = copy.deepcopy(full)
    with read_write(task), open_dict(task):
        task.pop("hydra", None)
    return task


def is_multirun(full: DictConfig) -> bool:
    mode = full.hydra.get("mode")
    return mode is not None and str(getattr(mode, "name", mode)) == "MULTIRUN"


def run_composed(composer: Composer, full: DictConfig, task_function: Callable) -> Any:
    """Run ``task_function`` on ``full`` as ``Hydra.run`` would (errors reported as Hydra
    reports them); return its value."""

    def run() -> Any:
        configure_log(full.hydra.hydra_logging, full.hydra.verbose)
        with read_write(full.hydra):
            full.hydra.mode = RunMode.RUN
        callbacks = Callbacks(full)
        callbacks.on_run_start(config=full, config_name=composer.config_name)
        context = HydraContext(config_loader=composer.hydra.config_loader, callbacks=callbacks)
        result = run_job(
            hydra_context=context, task_function=task_function, config=full,
            job_dir_key="hydra.run.dir", job_subdir_key=None, configure_logging=True,
        )  # fmt: skip
        callbacks.on_run_end(config=full, config_name=composer.config_name, job_return=result)
        return result.return_value  # raises what the task raised

    GlobalHydra.instance().initialize(composer.hydra)
    JobRuntime.instance().set("name", composer.config_name)  # the job's name, as in @hydra.main
    try:
        return run_and_report(run)
    finally:
        GlobalHydra.instance().clear()


def job_outcome(job_return) -> tuple[bool, object]:
    """``(failed, value or exception)`` of a Hydra ``JobReturn``: its public ``return_value``
    raises a failed job's exception and writes to stderr; the field holds either."""
    return job_return.status != JobStatus.COMPLETED, job_return._return_value


BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


def is_basic_launcher(launcher) -> bool:
    """Whether ``launcher`` is Hydra's basic (in-process, one job at a time) launcher: by
    its class's name, since Hydra's plugin discovery may have imported that module again."""
    return any(f"{c.__module__}.{c.__qualname__}" == BASIC_LAUNCHER for c in type(launcher).__mro__)


def as_recorded_failure(job_return) -> None:
    """Make a failed job's ``JobReturn`` one that a sweeper passes over: completed, with no
    value. Hydra's basic sweeper raises the first failed job's exception once its batch has
    run, as a traceback (and with ``max_batch_size`` set, before later batches run); a job
    whose failure is already recorded in its ``job.json`` is not the sweep's failure, and
    the summary callback ends the sweep with one line instead."""
    job_return.status = JobStatus.COMPLETED
    job_return._return_value = None
