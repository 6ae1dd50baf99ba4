"""Every use of a library's private API in ``src/``, one module per library, each use pinned
by a test (``tests/test_compat.py``) that fails with a clear message when an upgrade changes
it. ``tests/test_private_api.py`` scans the rest of ``src/`` for private names of torch,
Lightning, Hydra, OmegaConf, Optuna, MLflow, W&B and the other libraries we use, against a
reviewed allowlist, which names any use still waiting to move here and what the scan cannot
see. The version ranges the pins were checked against are pinned in pyproject.toml.

- ``compat.hydra``: one composition for a plain run (Hydra's ``Hydra`` object and job
  runner), a failed job's exception, the basic launcher's class. Imports no torch.
- ``compat.lightning``: signal-safe fork/spawn workers, the appending CSV logger, the
  logger step, the fit loop's epoch and batch progress, a module's trainer when attached, a
  logger's experiment handle, whether the MLflow logger has started its run.
- ``compat.optuna``: a trial of a study by its number.
- ``compat.torch``: Dynamo's error switch and graph-break counters, the batch norm layers'
  base class, and the profiler's native noise on stderr (a quirk, not private API).

Nothing is imported here: ``compat.hydra`` must stay importable before torch is.
"""
