"""SLURM mistakes caught before anything is submitted, in one line each: no ``sbatch``, a
partition the cluster does not have, resources no node of the partition can give, and a
task layout Lightning cannot use. Reads ``sinfo``; imports no torch."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from omegaconf import DictConfig, OmegaConf

from experiments.errors import UserError

SLURM_LAUNCHERS = ("submitit_slurm", "slurm")


def check_slurm_launcher(cfg: DictConfig) -> None:
    """With ``hydra/launcher=submitit_slurm|slurm``: the job could run on this cluster.

    ``cfg`` is composed with its ``hydra`` section. Raises UserError naming the key.
    """
    launcher = OmegaConf.select(cfg, "hydra.launcher", default=None)
    target = str(OmegaConf.select(cfg, "hydra.launcher._target_", default="") or "")
    if launcher is None or "SlurmLauncher" not in target:
        return
    if shutil.which("sbatch") is None:
        raise UserError(
            "hydra/launcher: sbatch is not on PATH: run the sweep on a SLURM login node "
            "(or start one here with scripts/slurm-local.sh up)"
        )
    partitions = _partitions()
    if not partitions:
        raise UserError("hydra/launcher: sinfo lists no partition: is the SLURM cluster up?")
    asked = OmegaConf.select(cfg, "hydra.launcher.partition", default=None)
    default = next((p for p, info in partitions.items() if info["default"]), None)
    name = asked or default
    if name not in partitions:
        raise UserError(
            f"hydra.launcher.partition={asked!r} is not a partition of this cluster; "
            f"available: {', '.join(partitions)}"
        )
    node = partitions[name]
    tasks = int(OmegaConf.select(cfg, "hydra.launcher.tasks_per_node", default=1) or 1)
    cpus = int(OmegaConf.select(cfg, "hydra.launcher.cpus_per_task", default=1) or 1)
    mem_gb = OmegaConf.select(cfg, "hydra.launcher.mem_gb", default=None)
    gpus = int(OmegaConf.select(cfg, "hydra.launcher.gpus_per_node", default=0) or 0)
    nodes = int(OmegaConf.select(cfg, "hydra.launcher.nodes", default=1) or 1)
    fits = [
        ("tasks_per_node x cpus_per_task", tasks * cpus, node["cpus"], "CPUs"),
        ("mem_gb", float(mem_gb or 0), round(node["mem_mb"] / 1024, 1), "GB of memory"),
        ("gpus_per_node", gpus, node["gpus"], "GPUs"),
        ("nodes", nodes, node["nodes"], "nodes"),
    ]
    for key, want, have, what in fits:
        if want > have:
            raise UserError(
                f"hydra.launcher.{key}={want:g} is more than partition {name!r} can give "
                f"({have:g} {what} per node{'' if key != 'nodes' else ' in all'})"
            )


def check_task_layout() -> None:
    """Under ``srun`` with several tasks Lightning needs ``--ntasks-per-node`` to map tasks
    to devices (it refuses ``--ntasks`` alone with a traceback on every rank)."""
    ntasks = int(os.environ.get("SLURM_NTASKS", "1") or 1)
    if ntasks > 1 and not os.environ.get("SLURM_NTASKS_PER_NODE"):
        raise UserError(
            f"SLURM started {ntasks} tasks with --ntasks alone: Lightning maps tasks to devices "
            f"per node, so submit with --ntasks-per-node={ntasks} (and -N <nodes>) instead"
        )


def _partitions() -> dict[str, dict]:
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%P|%c|%m|%G|%D"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError) as err:
        raise UserError(f"hydra/launcher: sinfo failed ({err}); is the SLURM cluster up?") from None
    partitions: dict[str, dict] = {}
    for line in out.splitlines():
        name, cpus, mem, gres, count = (line.split("|") + [""] * 5)[:5]
        gpus = sum(int(n) for n in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", gres))
        info = {
            "default": name.endswith("*"),
            "cpus": int(re.sub(r"\D", "", cpus) or 0),
            "mem_mb": int(re.sub(r"\D", "", mem) or 0),
            "gpus": gpus,
            "nodes": int(re.sub(r"\D", "", count) or 0),
        }
        previous = partitions.get(name.rstrip("*"))
        if previous:  # several node kinds: the partition can give the largest of each
            info = {k: max(v, previous[k]) for k, v in info.items()}
        partitions[name.rstrip("*")] = info
    return partitions
