"""The Optuna study a search's trials share: where it is stored, how it samples and how it
prunes (the callback through which a running trial reports to it is
``experiments.callbacks.TrialReporter``).

The sweeper (``hydra_plugins.experiments_optuna``) and every trial (a Hydra job, in
whatever process or machine the launcher runs it) open the same study from the same
sweeper settings, which each job finds in its own Hydra config; the sweeper tells a job
its trial number through ``hydra.job.env_set`` (``runs.sweep.TRIAL_ENV``).
"""

from __future__ import annotations

import logging
import re
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna import pruners
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from sqlalchemy.exc import SQLAlchemyError

from experiments.config.sweep_settings import DIRECTIONS, PRUNERS
from experiments.errors import UserError, one_line

log = logging.getLogger(__name__)

# what opening a storage that is not a study raises: the database driver's errors (a file
# that is not SQLite, tables of another program), Optuna's own schema-version check
# (RuntimeError), a journal line that is not JSON (ValueError)
STORAGE_ERRORS = (sqlite3.Error, SQLAlchemyError, RuntimeError, ValueError, OSError)


def storage_for(spec: str | None, sweep_dir: Path):
    """The study's storage from ``hydra.sweeper.storage``.

    None: SQLite in the sweep dir (``optuna.db``). ``journal`` or a path ending in ``.log``
    / ``.journal``: an append-only journal file (``optuna.journal`` in the sweep dir), the
    one to use on a shared file system where SQLite's locks are unreliable. Anything else is
    an RDB URL (``sqlite:///...``, ``postgresql://...``).
    """
    if not spec:
        return f"sqlite:///{(Path(sweep_dir) / 'optuna.db').resolve()}"
    if spec == "journal" or str(spec).endswith((".log", ".journal")):
        path = Path(sweep_dir) / "optuna.journal" if spec == "journal" else Path(spec)
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path.resolve())))
    return spec


def make_pruner(settings: Mapping[str, Any]):
    """Optuna's pruner for ``hydra.sweeper.pruner`` (``none`` by default).

    ``median`` stops a trial whose epoch value is worse than the median of earlier trials at
    that epoch; ``asha`` (successive halving) and ``hyperband`` keep the best third at each
    rung. None prunes before ``pruner_warmup_epochs`` epochs; ``median`` also waits for
    ``pruner_startup_trials`` trials to finish first.
    """
    name = str(settings.get("pruner") or "none")
    warmup = int(settings.get("pruner_warmup_epochs", 1))
    if name == "none":
        return pruners.NopPruner()
    if name == "median":
        startup = int(settings.get("pruner_startup_trials", 4))
        return pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=warmup)
    if name in ("asha", "hyperband"):
        kind = pruners.SuccessiveHalvingPruner if name == "asha" else pruners.HyperbandPruner
        return kind(min_resource=max(1, warmup), reduction_factor=3)
    raise ValueError(f"hydra.sweeper.pruner={name!r}: use one of {', '.join(PRUNERS)}")


def open_study(settings: Mapping[str, Any], sweep_dir: Path, name: str, create: bool):
    """The sweep's study: created (or continued) by the sweeper, loaded by its trials.

    Raises:
        UserError: the storage cannot be opened as an Optuna study (a corrupt ``optuna.db``
            or journal, a database of another program or Optuna version): one line naming
            it and the way out.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage = storage_for(settings.get("storage"), sweep_dir)
        return _open(settings, storage, name, create)
    except STORAGE_ERRORS as err:  # not KeyError: load_study of a missing study says so itself
        where = _storage_name(settings.get("storage"), sweep_dir)
        raise UserError(
            f"{where} cannot be opened as an Optuna study ({type(err).__name__}: "
            f"{one_line(err)[:160]}); delete it to start the search afresh (its trials are "
            f"lost), or set hydra.sweeper.storage to another place"
        ) from None


def _open(settings: Mapping[str, Any], storage, name: str, create: bool):
    pruner = make_pruner(settings)
    if not create:
        return optuna.load_study(study_name=name, storage=storage, pruner=pruner)
    objectives = dict(settings.get("objectives") or {})
    directions = [DIRECTIONS[d] for d in objectives.values()] or None
    seed = settings.get("seed")
    if settings.get("sampler", "tpe") == "random":
        sampler = optuna.samplers.RandomSampler(seed=seed)
    else:
        startup = int(settings.get("n_startup_trials", 3))
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)
    return optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=sampler,
        pruner=pruner,
        direction=None if directions else DIRECTIONS[settings.get("direction", "maximize")],
        directions=directions,
        load_if_exists=True,
    )


def _storage_name(spec: str | None, sweep_dir: Path) -> str:
    """The storage as the user knows it: a file's path, or a URL without its password."""
    if not spec:
        return str(Path(sweep_dir) / "optuna.db")
    if spec == "journal":
        return str(Path(sweep_dir) / "optuna.journal")
    if str(spec).startswith("sqlite:///"):
        return str(spec)[len("sqlite:///") :]
    return "hydra.sweeper.storage=" + re.sub(r"//[^@/]*@", "//***@", str(spec))
