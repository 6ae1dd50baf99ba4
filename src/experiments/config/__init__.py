"""Everything decided before a model is built: where the configs live, the command-line
check that runs before Hydra, the one rule for secrets, and the schema: every ``_target_``'s
keys bound to its constructor's signature (``schema``), and what a saved run may build.

Importing this package imports no torch or Lightning (a test asserts it): the cheap checks
of a command line answer in well under a second; ``schema.check`` imports the targets.
"""

from pathlib import Path

# The configs ship inside the package (`experiments/conf`); in a source checkout that is
# a link to the top-level `conf/` folder users edit, so both find the same files.
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"

from experiments.config import resolvers  # noqa: E402

resolvers.register()
