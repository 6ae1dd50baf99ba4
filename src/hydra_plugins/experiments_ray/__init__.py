"""Hydra launcher plugin ``hydra/launcher=ray``: each job of a sweep is a Ray task asking for
``cpus_per_job``/``gpus_per_job``; Ray queues the rest and starts each as a slot frees, on
this machine or on every node of a cluster (``address``)."""
