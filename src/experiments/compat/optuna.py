"""Optuna's private API (see ``experiments.compat``)."""

from __future__ import annotations

import optuna


def trial_by_number(study, number: int):
    """A live ``optuna.trial.Trial`` of ``study`` by its number, for a job that reports to
    a trial its sweeper asked for in another process (Optuna's public API hands out trials
    only through ``ask``)."""
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    return optuna.trial.Trial(study, trial_id)
