"""The local cluster's public face: the launchers (:class:`LocalCluster`, :class:`DockerCluster`,
both a :class:`ClusterDriver`), :func:`cluster_at` for a state folder, and the record's names,
from :mod:`ops.launcher` (docs/design.md, "The local cluster's state folder").
"""

from __future__ import annotations

from ops.config import (
    CONTROL_PLANES_ENV,
    STATE_DIR_ENV,
    ClusterError,
    default_state_dir,
    parse_addresses,
    resolve_addresses,
)
from ops.launcher.control import LocalCluster
from ops.launcher.docker import DockerCluster
from ops.launcher.driver import ClusterDriver, DownReport, UpResult
from ops.launcher.procs import STOP_TIMEOUT_S
from ops.launcher.state import (
    LISTEN_HOST,
    MARKER_ENV,
    WORKER_CAPACITIES,
    ClusterConfig,
    ProcessSpec,
    StateDir,
    WorkerSpec,
    iter_worker_logs,
    metrics_address,
)
from ops.launcher.up import READY_TIMEOUT_S

__all__ = [
    "CONTROL_PLANES_ENV",
    "LISTEN_HOST",
    "MARKER_ENV",
    "READY_TIMEOUT_S",
    "STATE_DIR_ENV",
    "STOP_TIMEOUT_S",
    "WORKER_CAPACITIES",
    "ClusterConfig",
    "ClusterDriver",
    "ClusterError",
    "DockerCluster",
    "DownReport",
    "LocalCluster",
    "ProcessSpec",
    "StateDir",
    "UpResult",
    "WorkerSpec",
    "cluster_at",
    "default_state_dir",
    "iter_worker_logs",
    "metrics_address",
    "parse_addresses",
    "resolve_addresses",
]


def cluster_at(state: StateDir) -> ClusterDriver:
    """The launcher of the cluster recorded in ``state``: a :class:`DockerCluster` when it runs
    in containers, else (also when nothing is recorded) a :class:`LocalCluster`.

    Raises:
        ClusterError: cluster.json cannot be read.
    """
    config = state.load()
    if config is not None and config.docker is not None:
        return DockerCluster(state)
    return LocalCluster(state)
