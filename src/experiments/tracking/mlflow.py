"""Experiment tracking with MLflow: Lightning's ``MLFlowLogger`` on a local SQLite store by
default (any tracking URI works), the config as dotted params, one MLflow run per job, and
the best weights (``best.safetensors``, ``best.json``) logged as artifacts when the job
succeeded."""

from __future__ import annotations

import logging
import re
from argparse import Namespace
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from mlflow.entities import Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from experiments.compat.lightning import mlflow_run_opened
from experiments.console import process_rank
from experiments.errors import UserError
from experiments.recorded.dotted import dotted_leaves
from experiments.runs.layout import sidecar_of, weights_file

log = logging.getLogger(__name__)

# MLflow's limits on a param's key and value (mlflow.utils.validation, mlflow >= 2.10)
MAX_KEY_LENGTH = 250
MAX_VALUE_LENGTH = 6000
# at most this many params per log_batch call (MLflow's MAX_PARAMS_TAGS_PER_BATCH)
PARAMS_PER_BATCH = 100


def flatten_params(params: Mapping[str, Any]) -> dict[str, str]:
    """Nested config -> ``{"optimizer.lr": "0.1", ...}``, valid for MLflow's params.

    Keys are dotted as on the command line; characters MLflow refuses in a key become ``_``;
    lists stay one value; values longer than MLflow's limit are cut (ending in ``...``); keys
    longer than MLflow's limit are left out with a warning.
    """
    flat: dict[str, str] = {}
    for dotted, value in dotted_leaves(params):
        name = re.sub(r"[^/\w.\- :]", "_", dotted)
        if len(name) > MAX_KEY_LENGTH:
            log.warning(
                "MLflow: param %s... left out (key over %d characters)", name[:60], MAX_KEY_LENGTH
            )
            continue
        text = str(value)
        if len(text) > MAX_VALUE_LENGTH:
            text = text[: MAX_VALUE_LENGTH - 3] + "..."
        flat[name] = text
    return flat


class ExperimentsMLFlowLogger(MLFlowLogger):
    """Lightning's MLflow logger: params keep the config's dotted keys and full values
    (length-safe); the run's end values and the best weights are recorded at the end."""

    log_checkpoints: bool = True

    @rank_zero_only
    def log_hyperparams(self, params) -> None:
        # Lightning hands a dict or an argparse Namespace (its base class's signature);
        # log_batch is called as Lightning's own does for a logger built without
        # ``synchronous`` (as ours always is): MLflow's default
        plain = vars(params) if isinstance(params, Namespace) else params
        flat = flatten_params(plain or {})
        items = [Param(key=k, value=v) for k, v in flat.items()]
        for start in range(0, len(items), PARAMS_PER_BATCH):
            batch = items[start : start + PARAMS_PER_BATCH]
            self.experiment.log_batch(run_id=self.run_id, params=batch)

    @rank_zero_only
    def record_summary(self, summary: dict[str, float]) -> None:
        """The run's end values (``experiments.tracking.finish_loggers``): the chosen
        epoch's ``<monitor>_best`` and ``best_epoch`` as metrics (``val/acc`` and the
        other per-epoch series keep one point per epoch: their latest is the last
        epoch's), and every value, labelled, in the tag ``summary``."""
        if not mlflow_run_opened(self):  # no run was started: do not start one now
            return
        kept = {k: float(v) for k, v in summary.items()
                if k == "best_epoch" or k.endswith("_best")}  # fmt: skip
        self.log_metrics(kept)  # one point each (step 0)
        text = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in sorted(summary.items()))  # fmt: skip
        self.experiment.set_tag(self.run_id, "summary", text[:MAX_VALUE_LENGTH])

    @rank_zero_only
    def upload_checkpoints(self, checkpoint_dir: Path) -> None:
        """Log the best weights and ``best.json`` as artifacts under ``checkpoints/``."""
        if not mlflow_run_opened(self):
            return
        best = weights_file(Path(checkpoint_dir), "best")
        for path in (best, sidecar_of(best)):
            if path.is_file():
                self.experiment.log_artifact(self.run_id, str(path), "checkpoints")


def _local_path(uri: str) -> Path | None:
    """The local folder a ``sqlite:///``, ``file:`` or plain-path URI needs; None for a server."""
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///") :]
        return Path(path).parent if path and path != ":memory:" else None
    if uri.startswith("file:"):
        return Path(uri[len("file:") :].removeprefix("//"))
    if "://" not in uri:
        return Path(uri)
    return None


def _ensure_experiment(tracking_uri: str, name: str, artifact_location: str | None) -> None:
    """Create the experiment up front (Lightning would, with a warning that reads like an
    error); a deleted one of that name is a one-line error instead of MLflow's traceback."""
    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(name)
    if found is not None and found.lifecycle_stage == "deleted":
        raise UserError(
            f"MLflow experiment {name!r} is deleted: restore it (mlflow experiments restore "
            f"--experiment-id {found.experiment_id}) or set logger.mlflow.experiment_name"
        )
    if found is None:
        try:
            client.create_experiment(name, artifact_location=artifact_location)
            log.info("MLflow: created experiment %r", name)
        except MlflowException:  # a parallel job of the sweep made it first
            if client.get_experiment_by_name(name) is None:
                raise


def mlflow_logger(
    experiment_name: str = "experiments",
    tracking_uri: str = "sqlite:///outputs/mlflow.db",
    artifact_location: str | None = None,
    run_name: str | None = None,
    tags: Sequence[str] = (),
    sweep_group: str | None = None,
    log_checkpoints: bool = True,
):
    """Build Lightning's ``MLFlowLogger`` for one job's run.

    Args:
        experiment_name: MLflow experiment (made on first use).
        tracking_uri: ``sqlite:///<file>``, a tracking server's ``http(s)://`` address, or
            ``file:<folder>``. A local store's folder is created.
        artifact_location: where a new experiment keeps artifacts; a local path is made
            absolute (else MLflow would use ``./mlruns`` of whatever folder a job starts in)
            and is ignored for a tracking server. Only used when the experiment is created.
            None: the store's default.
        run_name: run name; in a sweep, the job's overrides. Empty or None: MLflow picks one.
        tags: run tags (``tags=[a,b]`` -> MLflow tags ``a`` and ``b``).
        sweep_group: in a sweep, the sweep folder's name, as tag ``sweep`` (filter on it).
    """
    if not tracking_uri:
        raise UserError("logger.mlflow.tracking_uri is empty; e.g. sqlite:///outputs/mlflow.db")
    local = _local_path(tracking_uri)
    if local is not None:
        local.mkdir(parents=True, exist_ok=True)
    if artifact_location and "://" not in artifact_location:
        # a local folder: right for a local store, wrong for a server's clients
        local_artifacts = Path(artifact_location).resolve().as_uri()
        artifact_location = local_artifacts if local is not None else None
    if process_rank() == 0:  # DDP ranks Lightning re-launched log nothing to MLflow
        _ensure_experiment(tracking_uri, experiment_name, artifact_location)
    run_tags = {str(t): "true" for t in tags}
    if sweep_group:
        run_tags["sweep"] = str(sweep_group)
    logger = ExperimentsMLFlowLogger(
        experiment_name=experiment_name,
        run_name=run_name or None,
        tracking_uri=tracking_uri,
        tags=run_tags or None,
        artifact_location=artifact_location,
        log_model=False,  # Lightning's full .ckpt files; the best weights go up instead
    )
    logger.log_checkpoints = log_checkpoints
    return logger
