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


def check_slurm_launcher(cfg: DictConfig) -> None:
    """With ``hydra/launcher=submitit_slurm|slurm``: the job could run on this cluster.

    ``cfg`` is composed with its ``hydra`` section. Raises UserError naming the key.
    """
    launcher = OmegaConf.select(cfg, "hydra.launcher", default=None)
    if launcher is None or "SlurmLauncher" not in str(launcher.get("_target_") or ""):
        return
    if shutil.which("sbatch") is None:
        raise UserError(
            "hydra/launcher: sbatch is not on PATH: run the sweep on a SLURM login node "
            "(or start one here with scripts/slurm-local.sh up)"
        )
    partitions = _partitions()
    if not partitions:
        raise UserError("hydra/launcher: sinfo lists no partition: is the SLURM cluster up?")
    asked = launcher.get("partition")
    name = asked or next((p for p, info in partitions.items() if info["default"]), None)
    if name not in partitions:
        raise UserError(
            f"hydra.launcher.partition={asked!r} is not a partition of this cluster; "
            f"available: {', '.join(partitions)}"
        )
    node = partitions[name]
    cpus = int(launcher.get("tasks_per_node") or 1) * int(launcher.get("cpus_per_task") or 1)
    mem_gb = float(launcher.get("mem_gb") or 0)
    fits = [
        ("tasks_per_node x cpus_per_task", cpus, node["cpus"], "CPUs"),
        ("mem_gb", mem_gb, round(node["mem_mb"] / 1024, 1), "GB of memory"),
        ("gpus_per_node", int(launcher.get("gpus_per_node") or 0), node["gpus"], "GPUs"),
        ("nodes", int(launcher.get("nodes") or 1), node["nodes"], "nodes"),
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
