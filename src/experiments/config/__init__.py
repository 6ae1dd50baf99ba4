"""Everything decided before a model is built: the command-line check that runs before
Hydra (``precheck``) and the schema: every ``_target_``'s keys bound to its constructor's
signature (``schema``), and what a saved run may build (``allowlist``).

Importing this package imports no torch or Lightning (a test asserts it): the cheap checks
of a command line answer in well under a second; ``schema.check`` imports the targets.
"""

from experiments.config import resolvers
from experiments.recorded import CONF_DIR

__all__ = ["CONF_DIR"]

resolvers.register()
