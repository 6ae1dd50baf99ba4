"""An Optuna sweeper for Hydra: ask Optuna for trials, launch them as Hydra jobs through the
configured launcher, tell Optuna the returned metric. Failed trials are recorded as failed
and the search goes on; the study lives in SQLite under the sweep dir, so re-running the
same command with the same ``hydra.sweep.dir`` resumes it."""

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

DIRECTIONS = {"max": "maximize", "maximize": "maximize", "min": "minimize", "minimize": "minimize"}


class SweepFailed(Exception):
    """Some trials failed (the others ran; see the sweep summary)."""


@dataclass
class OptunaSweeperConf:
    _target_: str = "hydra_plugins.experiments_optuna.sweeper.OptunaSweeper"
    # maximize | minimize (max / min accepted)
    direction: str = "maximize"
    # total trials of the study, counting those of an earlier, interrupted run
    n_trials: int = 10
    # trials launched together (parallel with a parallel launcher, e.g. joblib)
    n_jobs: int = 1
    seed: int | None = None
    # random trials before TPE starts modelling (Optuna's default of 10 makes short
    # searches purely random)
    n_startup_trials: int = 3
    # None: sqlite:///<sweep_dir>/optuna.db
    storage: str | None = None
    study_name: str | None = None
    # search space in Hydra's sweep syntax: key: interval(a, b) | tag(log, interval(a, b))
    # | choice(a, b, ...) | range(start, stop, step)
    params: dict[str, str] = field(default_factory=dict)


ConfigStore.instance().store(
    group="hydra/sweeper",
    name="experiments_optuna",
    node=OptunaSweeperConf,
    provider="experiments",
)


class OptunaSweeper(Sweeper):
    def __init__(
        self,
        direction: str,
        n_trials: int,
        n_jobs: int,
        seed: int | None,
        n_startup_trials: int,
        storage: str | None,
        study_name: str | None,
        params: dict[str, str],
    ) -> None:
        if direction not in DIRECTIONS:
            raise ValueError(f"hydra.sweeper.direction={direction!r}: use maximize or minimize")
        if n_trials < 1 or n_jobs < 1:
            raise ValueError("hydra.sweeper.n_trials and n_jobs must be >= 1")
        self.direction = DIRECTIONS[direction]
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        self.seed = seed
        self.n_startup_trials = n_startup_trials
        self.storage = storage
        self.study_name = study_name
        self.params = dict(params or {})
        self.config: DictConfig | None = None
        self.launcher = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:  # noqa: C901 (one linear loop)
        import optuna
        from optuna.trial import TrialState

        parser = OverridesParser.create()
        space_overrides = parser.parse_overrides([f"{k}={v}" for k, v in self.params.items()])
        cli = parser.parse_overrides(arguments)
        space = {o.get_key_element(): _distribution(o) for o in space_overrides}
        fixed = []
        for override in cli:  # command-line sweeps join the space; plain values stay fixed
            if override.is_sweep_override():
                space[override.get_key_element()] = _distribution(override)
            else:
                space.pop(override.get_key_element(), None)
                fixed.append(override.input_line)
        if not space:
            raise ValueError("hydra.sweeper.params is empty: nothing to search")

        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        storage = self.storage or f"sqlite:///{(sweep_dir / 'optuna.db').resolve()}"
        name = self.study_name or sweep_dir.name
        sampler = optuna.samplers.TPESampler(seed=self.seed, n_startup_trials=self.n_startup_trials)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            sampler=sampler,
            direction=self.direction,
            load_if_exists=True,
        )
        for stale in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            study.tell(stale.number, state=TrialState.FAIL)  # interrupted last time
        finished = len(study.trials)
        if finished:
            log.info("resuming study %s: %d trials already done (%s)", name, finished, storage)
        job_idx, failures = finished, []
        while finished < self.n_trials:
            batch = min(self.n_jobs, self.n_trials - finished)
            trials = [study.ask(space) for _ in range(batch)]
            jobs = [fixed + [f"{k}={_format(v)}" for k, v in t.params.items()] for t in trials]
            returns = self.launcher.launch(jobs, initial_job_idx=job_idx)
            for trial, ret in zip(trials, returns, strict=True):
                value = ret._return_value if ret.status == JobStatus.COMPLETED else None
                if isinstance(value, int | float) and math.isfinite(value):
                    study.tell(trial, float(value))
                else:
                    study.tell(trial, state=TrialState.FAIL)
                    failures.append(trial.number)
                    log.warning("trial %d failed: %s", trial.number, _describe(ret, value))
            job_idx += batch
            finished += batch

        done = [t for t in study.trials if t.state == TrialState.COMPLETE]
        if done:
            best = study.best_trial
            result = {
                "name": name,
                "storage": storage,
                "direction": self.direction,
                "best_value": best.value,
                "best_params": best.params,
                "best_trial": best.number,
                "n_trials": len(study.trials),
            }
            OmegaConf.save(OmegaConf.create(result), sweep_dir / "optimization_results.yaml")
            log.info(
                "best %s = %.4f with %s",
                self.config.get("optimized_metric", "value"),
                best.value,
                best.params,
            )
        if failures:
            raise SweepFailed(
                f"{len(failures)} of {finished} trials failed "
                f"(trials {failures}); see {sweep_dir / 'summary.md'}"
            )
        return study


def _distribution(override: Override):
    import optuna.distributions as d

    value = override.value()
    key = override.get_key_element()
    if isinstance(value, ChoiceSweep):
        # Optuna stores only primitives: lists/dicts travel as their override text
        return d.CategoricalDistribution([_choice(v) for v in value.list])
    if isinstance(value, RangeSweep):
        return d.CategoricalDistribution(list(override.sweep_iterator()))
    if isinstance(value, IntervalSweep):
        log_scale = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return d.IntDistribution(value.start, value.end, log=log_scale)
        return d.FloatDistribution(value.start, value.end, log=log_scale)
    raise ValueError(f"{key}: use interval(...), choice(...) or range(...) in a search space")


def _choice(value: Any) -> Any:
    if isinstance(value, list):
        return "[" + ",".join(str(_choice(v)) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_choice(v)}" for k, v in value.items()) + "}"
    return value


def _format(value: Any) -> str:
    if isinstance(value, str) and value[:1] in "[{":
        return value  # a list/dict choice, already in override syntax
    if isinstance(value, str) and any(c in value for c in " ,=()'\""):
        return repr(value)
    return str(value)


def _describe(ret, value) -> str:
    if ret.status != JobStatus.COMPLETED:
        from experiments.errors import one_line

        err = ret._return_value
        return f"{type(err).__name__}: {one_line(err, last=True)}"
    return f"returned {value!r}, not a finite number (is optimized_metric logged?)"
