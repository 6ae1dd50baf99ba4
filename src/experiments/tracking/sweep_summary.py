"""A Hydra callback that keeps ``<sweep_dir>/summary.csv`` / ``summary.md`` (+ a plot for
one-parameter sweeps) up to date as the jobs of a multirun finish, failed ones included.

A job that fails with a user mistake (a ``UserError``: one line) is that job's failure, not
the sweep's: it is recorded in its ``job.json`` and the summary, the other jobs run, and the
sweep ends with one line and exit 1 (:data:`FAILED_EXIT`). A job whose files in the sweep dir
are corrupt is listed as ``broken``, with the reason; it never stops the summary."""

from __future__ import annotations

import csv
import fcntl
import io
import logging
import math
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from experiments.compat.hydra import as_recorded_failure, job_outcome
from experiments.errors import UserError, find_user_error, one_line
from experiments.runs.files import read_json_object, read_yaml, write_json, write_text
from experiments.runs.layout import BEST_WEIGHTS, RunDir, SweepDir, read_sidecar, sidecar_epoch
from experiments.runs.manifest import write_manifest
from experiments.runs.notes import read_tags
from experiments.runs.orphans import end_with_sweep_process, exit_if_orphaned, mark_sweep_process
from experiments.runs.sweep import KEPT, LOST_ENV, NODE_ENV, TRIAL_ENV, stop_reason
from experiments.tracking import sweep_plots
from experiments.tracking.importance import evaluator_label, is_replicate, spread, swept

log = logging.getLogger(__name__)

TEST_KEYS = ("test/acc", "test/loss")
# target=... (callbacks.TimeToTarget): wall seconds from launch to the target, a column when set
TIME_TO_TARGET = "time_to_target/from_launch_s"


def test_keys(metric: str) -> tuple[str, ...]:
    """The test columns of a sweep optimizing ``metric``: its test twin (``val/mae`` ->
    ``test/mae``) and the classifier's; a column no job has is dropped when written."""
    twin = "test/" + metric.split("/", 1)[-1]
    return TEST_KEYS if twin in TEST_KEYS else (twin, *TEST_KEYS)


# the exit status of a sweep that ran to its end with some jobs failed
FAILED_EXIT = 1
# the statuses of a job that did not give a result: the sweep ends with FAILED_EXIT
FAILED = ("failed", "lost", "broken")


class SweepSummary(Callback):
    """Write one row per job: overrides, the optimized metric, test metrics, time, status.

    Each job writes its own ``job.json`` when it ends (in whatever process or machine a
    launcher ran it), then the summary is rebuilt from every ``job.json`` of the sweep
    under a file lock, so parallel and remote jobs never lose a row and a sweep that
    stops on a failure still leaves a complete summary of what ran.
    """

    _start: float | None = None  # when this process's job started (on_job_start)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        mark_sweep_process()  # before the launcher starts any worker

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._start = time.time()
        end_with_sweep_process()  # a worker of the sweep's process dies with it

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode != RunMode.MULTIRUN:
            return
        job_dir = Path(hydra_cfg.runtime.output_dir)  # working_dir is the cwd unless chdir
        if str(job_dir) in KEPT:  # an earlier run of the sweep ended it: its record stays
            write_summary(Path(hydra_cfg.sweep.dir), *_metric(config))
            return
        failed, outcome = job_outcome(job_return)
        _write_job(
            hydra_cfg,
            job_return.overrides or [],
            status="failed" if failed else "ok",
            error=_one_line(outcome) if failed else None,
            value=None if failed else outcome,
            wall_time_s=round(time.time() - self._start, 2) if self._start else None,
        )
        write_summary(Path(hydra_cfg.sweep.dir), *_metric(config))
        if failed and isinstance(outcome, BaseException) and find_user_error(outcome):
            # a user mistake of this job alone: recorded above; the sweeper goes on to the
            # next job, and the sweep's end reports it (on_multirun_end), in one line
            log.error("job %s failed: %s", hydra_cfg.job.num, _one_line(outcome),
                      extra={"sweep_line": True})  # fmt: skip
            as_recorded_failure(job_return)
        exit_if_orphaned(1)  # the sweep's process died while this job ran: nobody waits

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = write_summary(sweep_dir, *_metric(config))
        show_summary(sweep_dir, rows)
        write_manifest(sweep_dir)  # the sweep's last write, failed jobs too (experiments-verify)
        failed = [r for r in rows if r["status"] in FAILED]
        if failed:
            print(f"error: {failed_line(failed, len(rows), sweep_dir)}", file=sys.stderr)
            sys.exit(FAILED_EXIT)


def failed_line(failed: list[dict], total: int, sweep_dir: Path) -> str:
    first = failed[0]
    more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
    return (
        f"{len(failed)} of {total} jobs failed; job {first['job']}: {first['error']}{more}; "
        f"see {SweepDir(sweep_dir).summary_md}"
    )


def _write_job(hydra_cfg, overrides, status: str, error, value, wall_time_s) -> None:
    # the Optuna trial this job ran, when our Optuna sweeper launched it
    trial = (hydra_cfg.job.get("env_set") or {}).get(TRIAL_ENV)
    write_json(
        SweepDir.job_file(hydra_cfg.runtime.output_dir),
        {
            "num": hydra_cfg.job.num,
            "trial": int(trial) if trial is not None else None,
            "overrides": list(overrides),
            "status": status,
            "error": error,
            "value": value if isinstance(value, int | float) else None,
            "wall_time_s": wall_time_s,
            "ended": round(time.time(), 3),  # unix time (with wall_time_s: when it ran)
            # the Ray node it ran on; why an earlier attempt was lost (hydra/launcher=ray)
            "node": os.environ.get(NODE_ENV),
            "lost": os.environ.get(LOST_ENV),
        },
    )


def record_lost(
    job_dir: Path, num: int, overrides: list[str], reason: str, retried: bool, status="lost"
) -> None:
    """A job its launcher lost (its worker or node died): recorded as ``lost`` (it will run
    again when ``retried``) until a new attempt writes its own record. ``status="failed"``:
    one the launcher could not run at all (not lost, so not counted as healed either)."""
    write_json(SweepDir.job_file(job_dir), {
        "num": num, "trial": None, "overrides": overrides, "status": status,
        "error": f"{reason}{'; running it again' if retried else ''}"[:300],
        "value": None, "wall_time_s": None, "node": None,
        "lost": reason if status == "lost" else None,
    })  # fmt: skip


def _metric(config) -> tuple[str, str]:
    return str(config.get("optimized_metric", "")), str(config.get("optimized_mode", "max"))


def show_summary(sweep_dir: Path, rows: list) -> None:
    if rows:
        md = SweepDir(sweep_dir).summary_md
        log.info("sweep summary (%d jobs): %s\n%s", len(rows), md, md.read_text())


def record_interrupted(config: DictConfig, reason: str) -> None:
    """The running job of a sweep was stopped by a signal (its checkpoint saved): record it
    as interrupted and write the summary of every job so far, since the sweep ends here."""
    hydra_cfg = HydraConfig.get()
    _write_job(hydra_cfg, hydra_cfg.overrides.task, "interrupted", reason[:300], None, None)
    sweep_dir = Path(hydra_cfg.sweep.dir)
    show_summary(sweep_dir, write_summary(sweep_dir, *_metric(config)))
    exit_if_orphaned(128 + signal.SIGTERM)  # stopped because the sweep's process died


def stopped_by_a_rule(config: DictConfig) -> bool:
    """A stop rule of ``sweep.*`` holds for this job (``runs.sweep.stop_reason``): it is
    recorded as ``stopped``, with the rule, and not run."""
    hydra_cfg = HydraConfig.get()
    reason = stop_reason(config, Path(hydra_cfg.sweep.dir), int(hydra_cfg.job.num))
    if reason is None:
        return False
    _write_job(hydra_cfg, hydra_cfg.overrides.task, "stopped", reason[:300], None, None)
    KEPT.add(str(Path(hydra_cfg.runtime.output_dir)))  # on_job_end leaves this record as it is
    log.info("job %s not run: %s", hydra_cfg.job.num, reason, extra={"sweep_line": True})
    return True


def _one_line(err: Any) -> str:
    if isinstance(err, BaseException):
        err = find_user_error(err) or err
        return f"{type(err).__name__}: {one_line(err, last=True)}"[:300]
    return str(err)[:300]


def collect(sweep_dir: Path, metric: str, results: dict | None = None) -> list[dict[str, Any]]:
    """One dict per job folder of ``sweep_dir`` that has a ``job.json``; a job whose files
    are corrupt is a ``broken`` row naming the file and the problem. ``results``: the
    sweep's ``optuna_results`` where read already (its Pareto front marks rows)."""
    rows = []
    front = (optuna_results(sweep_dir) if results is None else results).get("pareto_front")
    # a multi-objective search: the trials on its Pareto front
    pareto = [p.get("trial") for p in front if isinstance(p, dict)] if type(front) is list else None
    for job_file in SweepDir(sweep_dir).job_files():
        try:
            row, trial = _row(job_file, metric)
        except UserError as err:
            row, trial = {**_blank_row(job_file, metric), "error": str(err)[:300]}, None
        if pareto is not None:
            row["pareto"] = "yes" if isinstance(trial, int) and trial in pareto else ""
        rows.append(row)
    return rows


def _blank_row(job_file: Path, metric: str) -> dict[str, Any]:
    """The columns of a row, in order, as a job whose files could not be read has them."""
    name = job_file.parent.name
    return {
        "job": int(name) if name.isdigit() else name, "overrides": "", metric: None, "epoch": "",
        **dict.fromkeys(test_keys(metric)), "wall_time_s": None, TIME_TO_TARGET: None,
        "status": "broken", "error": "", "remedies": "", "tags": "", "dir": name,
    }  # fmt: skip


def _row(job_file: Path, metric: str) -> tuple[dict[str, Any], Any]:
    """The summary row of one job, and its Optuna trial number.

    Raises:
        UserError: its ``job.json`` or ``metrics.json`` is corrupt, or holds the wrong types.
    """
    job = read_json_object(job_file)
    metrics = read_json_object(RunDir(job_file.parent).metrics)
    status, overrides = job.get("status"), job.get("overrides", [])
    if not isinstance(status, str) or not isinstance(overrides, list):
        raise UserError(f"{job_file}: not a job record (status or overrides of the wrong type)")
    value, epoch = chosen_value(job_file.parent, metric, metrics)
    error = job.get("error")
    pruned = metrics.get("pruned_at_epoch")
    if status == "ok" and isinstance(pruned, int):
        status = f"pruned@{pruned + 1}"  # at the end of epoch N
    if status == "ok" and metrics.get("status") == "diverged":  # experiments.training.remedies
        status, error = "diverged", metrics.get("error")
    # how the job was healed: metrics.json's remedies (training.remedies), and a run again
    # after its launcher lost an attempt (hydra/launcher=ray)
    remedies = metrics.get("remedies") or []
    remedies = list(remedies) if isinstance(remedies, list) else [str(remedies)]
    if job.get("lost") and status != "lost":
        remedies.append(f"lost, ran again ({job['lost']})")
    row = _blank_row(job_file, metric)
    row.update({
        "job": job.get("num", row["job"]),
        "overrides": " ".join(str(o) for o in overrides),
        metric: _number(value if value is not None else job.get("value")),
        "epoch": epoch,
        **{k: _number(metrics.get(k)) for k in test_keys(metric)},
        "wall_time_s": _number(job.get("wall_time_s")),
        TIME_TO_TARGET: _number(metrics.get(TIME_TO_TARGET)),
        "status": status,
        "error": str(error or ""),
        "remedies": "; ".join(str(r) for r in remedies),
        "tags": " ".join(read_tags(job_file.parent)),  # tags=[...] at launch, experiments-runs tag
    })  # fmt: skip
    return row, job.get("trial")


def chosen_value(job_dir: Path, metric: str, metrics: dict) -> tuple[Any, str]:
    """``metric`` of a job and the epoch it is from: the epoch ``RunDir.best_weights`` keeps
    (whose weights test/* scored: ``best.json``), ``"7 of 10"``; without one, the last epoch's
    value from ``metrics.json``, labelled ``"10 of 10, last"``.

    Raises:
        UserError: ``best.json`` is corrupt (the job is listed as broken).
    """
    best = read_sidecar(RunDir(job_dir).best_json)
    epochs = metrics.get("epochs")
    of = f" of {epochs}" if _number(epochs) is not None else ""
    if best.get("monitor") == metric and best.get("value") is not None:
        return best["value"], f"{sidecar_epoch(best)}{of}"
    value = metrics.get(metric)
    if _number(value) is None:
        return None, ""
    return value, f"{epochs}{of}, last" if of else "last"


def _number(value: Any) -> float | int | None:
    """A metric read from a job's files: a number, else nothing (no text in a number cell)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return value if ok else None


def optuna_results(sweep_dir: Path) -> dict:
    """``optimization_results.yaml``, which our Optuna sweeper writes ({} without one, and
    for a corrupt one, with a warning naming it: the summary is written all the same)."""
    try:
        return read_yaml(SweepDir(sweep_dir).optimization_results, missing={}, kind=dict)
    except UserError as err:
        log.warning("%s; the summary leaves out parameter importance and the Pareto front", err)
        return {}


def importance(done: list[dict], keys: list[str], metric: str, results: dict):
    """Each swept key's importance (seeds left out) and a few words on how it was found: what
    our Optuna sweeper recorded in ``results`` (``optuna_results``), else each key's spread
    over the finished jobs ``done``."""
    recorded, evaluator = results.get("importance"), results.get("importance_evaluator")
    if isinstance(recorded, dict) and recorded:
        found = {str(k): float(v) for k, v in recorded.items()
                 if isinstance(v, int | float) and not is_replicate(str(k))}  # fmt: skip
        return found, evaluator_label(evaluator if isinstance(evaluator, str) else None)
    how = f"spread: the best minus the worst mean {metric} over each key's values"
    return spread(done, keys, metric), how


def best_first(metric: str, mode: str):
    """A sort key for result rows: finished runs best first, then pruned, then failed."""

    def key(row):
        value = row.get(metric)
        if not isinstance(value, int | float) or not math.isfinite(value):
            return (2, 0.0)  # failed / missing last
        pruned = str(row.get("status", "")).startswith("pruned")
        return (int(pruned), -value if mode == "max" else value)  # pruned after finished

    return key


def write_summary(sweep_dir: Path, metric: str, mode: str = "max") -> list[dict[str, Any]]:
    """Rebuild summary.csv, summary.md and its plots (``sweep_plots``); return the rows."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with open(sweep_dir / ".summary.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel jobs: one rebuild at a time
        results = optuna_results(sweep_dir)
        rows = sorted(collect(sweep_dir, metric, results), key=best_first(metric, mode))
        if not rows:
            return rows
        # a column only when a job was healed / tagged / has that test metric
        for column in ("remedies", "tags", *test_keys(metric), TIME_TO_TARGET):
            if not any(r[column] not in ("", None) for r in rows):
                rows = [{k: v for k, v in r.items() if k != column} for r in rows]
        fields = list(rows[0])
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
        sweep = SweepDir(sweep_dir)
        write_text(sweep.summary_csv, buf.getvalue())
        md = _markdown(rows, fields, metric, mode) + _importance(sweep_dir, rows, metric, results)
        write_text(sweep.summary_md, md)
        sweep_plots.plot_one_key(rows, metric, sweep.summary_png)
    return rows


def table_cell(value: Any) -> str:
    """A value as a markdown table cell: floats to 4 places, ``|`` escaped, None empty."""
    if isinstance(value, float):
        return f"{value:.4f}"
    return "" if value is None else str(value).replace("|", "\\|")


def markdown_table(head: list[Any], rows: Iterable[Iterable[Any]]) -> list[str]:
    """The lines of a markdown table, each cell written by ``table_cell``."""
    lines = ["| " + " | ".join(map(table_cell, head)) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(map(table_cell, row)) + " |" for row in rows]


def _markdown(rows, fields, metric, mode) -> str:
    n = Counter("pruned" if str(r["status"]).startswith("pruned") else r["status"] for r in rows)
    words = {"ok": "ok", "pruned": "pruned", "interrupted": "interrupted",
             "stopped": "not run", "diverged": "diverged"}  # fmt: skip
    counts = ", ".join(f"{n[s]} {w}" for s, w in words.items() if n[s] or s == "ok")
    failed = len(rows) - sum(n[s] for s in words)
    head = f"# Sweep summary\n\n{len(rows)} jobs, {counts}, {failed} failed; "
    head += f"sorted by {metric} ({mode}).\n\n"
    head += (
        f"{metric} is each job's value at the epoch {BEST_WEIGHTS} keeps (column epoch; test/* "
        f"scored those weights); a job without {BEST_WEIGHTS} shows its last epoch's, marked "
        f"last.\n\n"
    )
    if n["stopped"]:
        why = sorted({r["error"] for r in rows if r["status"] == "stopped"})
        head += f"Stopped early: {'; '.join(why)[:400]}.\n\n"
    shown = [f for f in fields if f != "dir"]
    return head + "\n".join(markdown_table(shown, ([r[f] for f in shown] for r in rows))) + "\n"


def _importance(sweep_dir: Path, rows: list[dict], metric: str, results: dict) -> str:
    """The summary's importance section, and its plots (``sweep_plots.draw``) from every
    finished job; '' (and no plots) with fewer than two finished jobs or nothing swept."""
    done, keys = swept(rows, metric)
    if len(done) < 2 or not keys:
        sweep_plots.draw(sweep_dir, [], keys, metric, [])  # removes the plots of before
        return ""
    found, how = importance(done, keys, metric, results)
    top = [k for k in found if k in keys][:2] or keys[:2]
    plotted = sweep_plots.draw(sweep_dir, done, keys, metric, top)
    lines = ["", "## Parameter importance", "",
             how + "; seeds are replicates, not parameters, and are left out.", "",
             *markdown_table(["key", "importance"], found.items()), "",
             f"Plots, from the {len(done)} finished jobs: {plotted}."]  # fmt: skip
    return "\n".join(lines) + "\n"
