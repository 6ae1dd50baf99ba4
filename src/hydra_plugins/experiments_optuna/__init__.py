"""Hydra sweeper plugin ``hydra/sweeper=experiments_optuna``: Optuna TPE with modern
Optuna and resumable SQLite storage (Hydra's own Optuna sweeper pins optuna<3)."""
