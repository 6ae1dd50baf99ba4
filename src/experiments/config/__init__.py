"""Everything decided before a model is built: where the configs live, the command-line
check that runs before Hydra, value checks, the one rule for secrets, and ``_target_``
checks (existence, constructor keys, what a saved run may build).

Nothing in this package imports torch or Lightning (a test asserts it), so a mistake in
the command line answers in well under a second.
"""

from pathlib import Path

# The configs ship inside the package (`experiments/conf`); in a source checkout that is
# a link to the top-level `conf/` folder users edit, so both find the same files.
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"

from experiments.config import resolvers  # noqa: E402

resolvers.register()
