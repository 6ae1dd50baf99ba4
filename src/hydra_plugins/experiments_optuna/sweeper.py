"""An Optuna sweeper for Hydra with asynchronous workers: each of ``n_jobs`` workers asks
Optuna for a trial, runs it as a Hydra job through the configured launcher, tells Optuna
the result and asks for the next, so no worker waits on another's trial (there is no batch
barrier). Trials report ``optimized_metric`` every epoch, and a pruner (``median``,
``asha``, ``hyperband``) can stop losers early. ``objectives`` makes the study
multi-objective, with the Pareto front in ``optimization_results.yaml`` and the summary.

Failed trials are recorded as failed and the search goes on. The study lives in SQLite
(or a journal file) under the sweep dir, so re-running the same command with the same
``hydra.sweep.dir`` resumes it."""

import logging
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from experiments.compat.hydra import is_basic_launcher, job_outcome
from experiments.config.sweep_settings import DIRECTIONS, check_settings
from experiments.errors import UserError, exit_with, one_line
from experiments.runs.files import read_json_object
from experiments.runs.layout import RunDir, SweepDir
from experiments.runs.sweep import TRIAL_ENV
from experiments.tracking.importance import is_replicate

# Hydra imports every plugin module at the start of every run, a sweep or not: optuna (and
# the summary's plotting) load only once a search runs (the imports marked lazy below)

log = logging.getLogger(__name__)


def _job_record(ret) -> dict:
    """The job's ``job.json`` ({} when it wrote none, or it cannot be read: the summary
    lists such a job as broken)."""
    try:
        return read_json_object(SweepDir.job_file(Path(ret.hydra_cfg.hydra.runtime.output_dir)))
    except (UserError, AttributeError):
        return {}


def importance_evaluator():
    """The evaluator of the importance the summary shows, named rather than Optuna's default
    (which changed from fANOVA to PED-ANOVA in Optuna 5): fANOVA, the share of the metric's
    variance each parameter explains, seeded so a rebuilt summary shows the same numbers."""
    from optuna.importance import FanovaImportanceEvaluator  # lazy: see the top

    return FanovaImportanceEvaluator(seed=0)


def _importance(study) -> dict[str, float]:
    """The fANOVA importance (:func:`importance_evaluator`) of each parameter except seeds,
    which replicate a trial rather than set it ({} with too few finished trials)."""
    from optuna.importance import get_param_importances  # lazy: see the top

    names = {k for t in study.get_trials(deepcopy=False) for k in t.params}
    params = sorted(k for k in names if not is_replicate(k))
    if not params:
        return {}
    try:
        found = get_param_importances(study, evaluator=importance_evaluator(), params=params)
    except (ValueError, RuntimeError) as err:  # fewer than 2 complete trials, one param value
        log.info("no parameter importance: %s", err)
        return {}
    return {k: round(float(v), 6) for k, v in found.items()}


class SweepFailed(Exception):
    """Some trials failed (the others ran; see the sweep summary)."""


@dataclass
class OptunaSweeperConf:
    _target_: str = "hydra_plugins.experiments_optuna.sweeper.OptunaSweeper"
    # maximize | minimize (max / min accepted)
    direction: str = "maximize"
    # total trials of the study, counting those of an earlier, interrupted run
    n_trials: int = 10
    # workers, each running one trial at a time (in parallel with a parallel launcher,
    # e.g. hydra/launcher=joblib; Hydra's basic launcher runs one trial at a time)
    n_jobs: int = 1
    seed: int | None = None
    # tpe | random (random: the same trials whatever the results, e.g. to measure pruning)
    sampler: str = "tpe"
    # random trials before TPE starts modelling (Optuna's default of 10 makes short
    # searches purely random)
    n_startup_trials: int = 3
    # none | median | asha | hyperband: stop trials whose epoch values are losing
    pruner: str = "none"
    # epochs every trial runs before it may be pruned
    pruner_warmup_epochs: int = 1
    # median: trials that must finish before any is pruned
    pruner_startup_trials: int = 4
    # None: sqlite:///<sweep_dir>/optuna.db; journal: <sweep_dir>/optuna.journal (shared
    # file systems); or any Optuna storage URL
    storage: str | None = None
    study_name: str | None = None
    # search space in Hydra's sweep syntax: key: interval(a, b) | tag(log, interval(a, b))
    # | choice(a, b, ...) | range(start, stop, step)
    params: dict[str, str] = field(default_factory=dict)
    # multi-objective: {metric: maximize|minimize}, read from each job's metrics.json
    # (e.g. {val/acc: maximize, params: minimize}); None: optimized_metric and direction
    # (typed Any: OmegaConf cannot merge a dict from the command line into a None dict)
    objectives: Any = None
    # trials to run first, e.g. [{optimizer.lr: 0.01}] (a known good config)
    enqueue: list[dict[str, Any]] = field(default_factory=list)


ConfigStore.instance().store(
    group="hydra/sweeper", name="experiments_optuna", node=OptunaSweeperConf, provider="experiments"
)


class OptunaSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        settings = {k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v
                    for k, v in settings.items()}  # fmt: skip
        check_settings(settings)
        self.settings = settings
        self.n_trials = settings["n_trials"]
        self.n_jobs = settings["n_jobs"]
        self.objectives = dict(settings.get("objectives") or {})
        self.params = dict(settings.get("params") or {})
        self.config: DictConfig | None = None
        self.launcher = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        from experiments.tracking.optuna_study import open_study  # lazy: see the top

        states = _states()
        space, fixed = self._space(arguments)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        name = self.settings.get("study_name") or sweep_dir.name
        try:
            study = open_study(self.settings, sweep_dir, name, create=True)
        except UserError as err:  # a corrupt storage: one line, before any trial runs
            exit_with(err)
        for stale in study.get_trials(deepcopy=False, states=(states.RUNNING,)):
            study.tell(stale.number, state=states.FAIL)  # interrupted last time
        if not study.trials:
            for params in self.settings.get("enqueue") or []:
                study.enqueue_trial(dict(params))
        # trials enqueued but not yet run (WAITING) are still to do
        done_before = sum(t.state != states.WAITING for t in study.trials)
        if done_before:
            log.info("resuming study %s: %d trials already done", name, done_before)
        failures = self._run_workers(study, space, fixed, done_before)
        self._write_results(study, sweep_dir, name)
        if failures:
            # Hydra skips on_multirun_end when a sweeper raises: the summary (and its plots)
            # is rebuilt here from every finished trial, with the importance just written
            from experiments.tracking.sweep_summary import write_summary  # lazy: see the top

            metric = str(self.config.get("optimized_metric", ""))
            write_summary(sweep_dir, metric, str(self.config.get("optimized_mode", "max")))
            raise SweepFailed(
                f"{len(failures)} of {self.n_trials - done_before} trials failed "
                f"(trials {sorted(failures)}); see {SweepDir(sweep_dir).summary_md}"
            )
        return study

    def _space(self, arguments: list[str]):
        """The search space (config params + command-line sweeps) and the fixed overrides."""
        parser = OverridesParser.create()
        space_overrides = parser.parse_overrides([f"{k}={v}" for k, v in self.params.items()])
        space = {o.get_key_element(): _distribution(o) for o in space_overrides}
        fixed = []
        for override in parser.parse_overrides(arguments):
            # command-line sweeps join the space; plain values stay fixed
            if override.is_sweep_override():
                space[override.get_key_element()] = _distribution(override)
            else:
                space.pop(override.get_key_element(), None)
                fixed.append(override.input_line)
        if not space:
            raise ValueError("hydra.sweeper.params is empty: nothing to search")
        return space, fixed

    def _run_workers(self, study, space, fixed, done_before: int) -> list[int]:
        """Run the remaining trials on ``n_jobs`` workers; each asks for its next trial as
        soon as its last one ends. Returns the numbers of failed trials."""
        workers = self.n_jobs
        if is_basic_launcher(self.launcher) and workers > 1:
            log.warning(
                "hydra.sweeper.n_jobs=%d: Hydra's basic launcher runs one trial at a time in "
                "this process; use hydra/launcher=joblib (or a SLURM launcher) for parallel "
                "trials",
                workers,
            )
            workers = 1
        lock = threading.Lock()
        todo = {"left": self.n_trials - done_before, "next_job": done_before}
        failures: list[int] = []
        errors: list[BaseException] = []

        def worker() -> None:
            while True:
                with lock:
                    if todo["left"] <= 0 or errors:
                        return
                    todo["left"] -= 1
                    trial = study.ask(space)
                    job_idx = todo["next_job"]
                    todo["next_job"] += 1
                overrides = [
                    *fixed,
                    *(f"{k}={_format(v)}" for k, v in trial.params.items()),
                    f"+hydra.job.env_set.{TRIAL_ENV}={trial.number}",
                ]
                try:
                    (ret,) = self.launcher.launch([overrides], initial_job_idx=job_idx)
                except BaseException as err:  # the launcher itself broke: stop the search
                    with lock:
                        study.tell(trial, state=_states().FAIL)
                        errors.append(err)
                    return
                with lock:
                    # the job did not run: a stop rule of sweep.* (max_jobs, target,
                    # time_budget) holds: ask for no more trials
                    if _job_record(ret).get("status") == "stopped":
                        study.tell(trial, state=_states().FAIL)
                        todo["left"] = 0
                    elif not self._tell(study, trial, ret):
                        failures.append(trial.number)

        threads = [
            threading.Thread(target=worker, name=f"optuna-worker-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return failures

    def _tell(self, study, trial, ret) -> bool:
        """Tell Optuna how the trial's job ended; False if it failed."""
        states = _states()
        failed, value = job_outcome(ret)
        if failed:
            study.tell(trial, state=states.FAIL)
            err = f"{type(value).__name__}: {one_line(value, last=True)}"
            log.warning("trial %d failed: %s", trial.number, err)
            return False
        # its failure recorded in its job.json: the summary callback reports it at the end of
        # the sweep, in one line
        if _job_record(ret).get("status") == "failed":
            study.tell(trial, state=states.FAIL)
            return True
        # the job wrote to the storage: read it afresh (a Trial caches its attributes)
        (fresh,) = (t for t in study.get_trials(deepcopy=False) if t.number == trial.number)
        if fresh.user_attrs.get("pruned_at_epoch") is not None:
            study.tell(trial, state=states.PRUNED)
            return True
        values = self._values(ret)
        if values is None:
            study.tell(trial, state=states.FAIL)
            log.warning("trial %d failed: returned %r, not a finite number (is optimized_metric "
                        "logged?)", trial.number, value)  # fmt: skip
            return False
        study.tell(trial, values if len(values) > 1 else values[0])
        return True

    def _values(self, ret) -> list[float] | None:
        """The objective values of a finished job: its return value, or with ``objectives``
        the named metrics of its ``metrics.json``."""
        if self.objectives:
            output_dir = Path(ret.hydra_cfg.hydra.runtime.output_dir)
            try:
                metrics = read_json_object(RunDir(output_dir).metrics)
            except UserError as err:  # the summary lists the job as broken
                log.warning("%s", err)
                return None
            values = [metrics.get(k) for k in self.objectives]
        else:
            values = [job_outcome(ret)[1]]
        ok = all(isinstance(v, int | float) and math.isfinite(v) for v in values)
        return [float(v) for v in values] if ok else None

    def _write_results(self, study, sweep_dir: Path, name: str) -> None:
        """``optimization_results.yaml``: the best trial, or the Pareto front."""
        states = _states()
        done = [t for t in study.trials if t.state == states.COMPLETE]
        if not done:
            return
        ended = (states.COMPLETE, states.PRUNED, states.FAIL)
        counts = {s.name.lower(): sum(t.state == s for t in study.trials) for s in ended}
        result: dict[str, Any] = {"name": name, "n_trials": len(study.trials), **counts}
        if self.objectives:
            front = sorted(study.best_trials, key=lambda t: t.number)
            result["objectives"] = {k: DIRECTIONS[v] for k, v in self.objectives.items()}
            result["pareto_front"] = [
                {"trial": t.number, "values": dict(zip(self.objectives, t.values, strict=True)),
                 "params": t.params}
                for t in front
            ]  # fmt: skip
            log.info("Pareto front: %d of %d trials", len(front), len(study.trials))
        else:
            best = study.best_trial
            result.update(
                importance=_importance(study),
                importance_evaluator=type(importance_evaluator()).__name__,
                direction=DIRECTIONS[self.settings.get("direction", "maximize")],
                best_value=best.value, best_params=best.params, best_trial=best.number,
            )  # fmt: skip
            ended_as = ", ".join(f"{v} {k}" for k, v in counts.items())
            log.info("best %s = %.4f with %s (%s)", self.config.get("optimized_metric", "value"),
                     best.value, best.params, ended_as)  # fmt: skip
        OmegaConf.save(OmegaConf.create(result), sweep_dir / "optimization_results.yaml")


def _states():
    from optuna.trial import TrialState  # lazy: see the top

    return TrialState


def _distribution(override: Override):
    import optuna.distributions as d  # lazy: see the top

    value = override.value()
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
    key = override.get_key_element()
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
