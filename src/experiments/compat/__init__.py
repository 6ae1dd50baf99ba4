"""Every use of a library's private API, one module per library, each use pinned by a test
(``tests/test_compat.py``) that fails with a clear message when an upgrade changes it.
The version ranges they were checked against are pinned in pyproject.toml.

- ``compat.hydra``: one composition for a plain run (Hydra's ``Hydra`` object and job
  runner), a failed job's exception, the basic launcher's class. Imports no torch.
- ``compat.lightning``: signal-safe fork/spawn workers, the appending CSV logger, the
  logger step, a module's trainer when attached, a logger's experiment handle.
- ``compat.optuna``: a trial of a study by its number.

Nothing is imported here: ``compat.hydra`` must stay importable before torch is.
"""
