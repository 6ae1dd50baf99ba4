"""A finished run's folder read back as data, never run: its saved config with overrides and
its references resolved without resolvers (``folder``, ``references``), its saved overrides
checked entry by entry before a resume or a verify replays them (``replay``).

A saved run is judged against the configs that ship with the code, so their folder is
defined here, at the lowest layer that reads it (``experiments.config`` composes from it).
Nothing here imports torch.
"""

from pathlib import Path

# The configs ship inside the package (`experiments/conf`); in a source checkout that is
# a link to the top-level `conf/` folder users edit, so both find the same files.
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
