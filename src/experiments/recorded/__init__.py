"""A finished run's folder read back as data, never run: its saved config with overrides and
its references resolved without resolvers (``folder``, ``references``), its saved overrides
checked entry by entry before a resume or a verify replays them (``replay``).

A saved run is judged against the configs that ship with the code, so their folder is
defined here, at the lowest layer that reads it (``experiments.config`` composes from it),
and against your own config folders, named by ``EXPERIMENTS_CONFIG_PATH`` (``config_dirs``).
Nothing here imports torch.
"""

import os
from pathlib import Path
from typing import Any

from experiments.errors import UserError, printable_line
from experiments.runs.layout import CONFIG_PATH_ENV  # layout, not provenance: no hydra import

# The configs ship inside the package (`experiments/conf`); in a source checkout that is
# a link to the top-level `conf/` folder users edit, so both find the same files.
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def config_dirs() -> list[Path]:
    """The folders ``EXPERIMENTS_CONFIG_PATH`` names, absolute: train adds them to Hydra's
    search path, and a saved run's group options (``model=mine``) may be files of theirs.

    Raises:
        UserError: a named folder that does not exist.
    """
    folders = []
    for entry in os.environ.get(CONFIG_PATH_ENV, "").split(os.pathsep):
        if not entry.strip():
            continue
        folder = Path(entry).expanduser().resolve()
        if not folder.is_dir():
            raise UserError(
                f"{CONFIG_PATH_ENV}={entry!r}: no such folder; name the folder that holds your "
                f"config groups (model/, data/, experiment/ ...), several separated by "
                f"{os.pathsep!r}"
            )
        folders.append(folder)
    return folders


def shown(value: Any, limit: int = 80) -> str:
    """``value``'s repr for one line of a message (control characters escaped), cut to
    ``limit`` characters."""
    return printable_line(repr(value), limit)  # repr escapes every control character
