"""Ray mistakes caught before any job starts, in one line each: Ray not installed, a head
address nothing answers at, and resources no node of the cluster has. The pre-check connects
(or starts Ray on this machine) once; the launcher then uses that same connection.
Imports no torch; imports ray only for a sweep on ``hydra/launcher=ray``."""

from __future__ import annotations

import os
import socket

from omegaconf import DictConfig, OmegaConf

from experiments.errors import UserError, one_line

# how long a head address may take to accept a connection, and then to answer as a Ray head
# does (a gRPC server), before it counts as no Ray head: ray.init itself would wait minutes
CONNECT_TIMEOUT_S = 5.0


def check_ray_launcher(cfg: DictConfig) -> None:
    """With ``hydra/launcher=ray``: Ray is there, reachable, and some node can run a job."""
    target = str(OmegaConf.select(cfg, "hydra.launcher._target_", default="") or "")
    if not target.endswith(".RayLauncher"):
        return
    launcher = cfg.hydra.launcher
    cpus, gpus = float(launcher.cpus_per_job), float(launcher.gpus_per_job or 0)
    if cpus <= 0 or gpus < 0:
        raise UserError(
            f"hydra.launcher.cpus_per_job={cpus:g}, gpus_per_job={gpus:g}: a job needs more "
            f"than 0 CPUs and 0 or more GPUs"
        )
    for key in ("num_cpus", "num_gpus", "lost_retries"):
        value = launcher.get(key)
        if value is not None and value < 0:
            raise UserError(
                f"hydra.launcher.{key}={value} is not valid: expected 0 or more"
                + (" (or null: all of this machine's)" if key != "lost_retries" else "")
            )
    ray = connect(launcher.get("address"), launcher.get("num_cpus"), launcher.get("num_gpus"))
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if not any(n.get("CPU", 0) >= cpus and n.get("GPU", 0) >= gpus for n in nodes):
        have = {f"{n.get('CPU', 0):g} CPU + {n.get('GPU', 0):g} GPU" for n in nodes}
        raise UserError(
            f"hydra.launcher.gpus_per_job={gpus:g} cpus_per_job={cpus:g}: no node of the Ray "
            f"cluster has that much for one job (its nodes have: "
            f"{', '.join(sorted(have)) or 'none alive'})"
        )


def connect(address: str | None, num_cpus: int | None = None, num_gpus: int | None = None):
    """Join the Ray cluster at ``address`` (``host:port`` of its head, or ``auto``), or with
    none start Ray on this machine; return the ``ray`` module. Once per process."""
    try:
        import ray  # lazy: an optional extra, seconds to import; only a sweep on Ray needs it
    except ImportError:
        raise UserError(
            "hydra/launcher=ray: Ray is not installed; pip install 'experiments[ray]'"
        ) from None
    if ray.is_initialized():
        return ray
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no reporting home from a sweep
    if address and address != "auto":
        _reachable(address)
    here = {"num_cpus": num_cpus, "num_gpus": num_gpus, "include_dashboard": False}
    try:
        ray.init(**({"address": address} if address else here), configure_logging=False,
                 log_to_driver=True)  # fmt: skip
    except (ConnectionError, RuntimeError, ValueError) as err:
        where = f"hydra.launcher.address={address}" if address else "hydra/launcher=ray"
        raise UserError(f"{where}: Ray did not start or connect: {one_line(err)}") from None
    return ray


def _reachable(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(
            f"hydra.launcher.address={address!r} is not valid: expected <host>:<port> of the "
            f"Ray head (e.g. 10.0.0.5:6379), auto (the cluster on this machine) or null "
            f"(start Ray here)"
        )
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise UserError(
            f"hydra.launcher.address={address}: no Ray head answers there ({reason}); start one "
            f"with `ray start --head --port={port}` or fix the address"
        ) from None
    if not _speaks_grpc(address):
        raise UserError(
            f"hydra.launcher.address={address}: something answers there, but not a Ray head "
            f"(no gRPC handshake in {CONNECT_TIMEOUT_S:g} s); give the port `ray start --head` "
            f"printed (6379 by default)"
        )


def _speaks_grpc(address: str) -> bool:
    """Whether ``address`` completes a gRPC (HTTP/2) handshake within the deadline, as a Ray
    head's control service does; any other server (a web server, a database) does not."""
    import grpc  # lazy: Ray's own dependency, there only with the ray extra

    channel = grpc.insecure_channel(address)
    try:
        grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT_S)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()
