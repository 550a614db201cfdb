"""The local cluster: control planes and worker agents as background processes on this machine.

``stockade up`` / ``stockade down`` and the end-to-end tests drive a :class:`LocalCluster`.
Everything it knows lives in one state folder (``.stockade/`` in the current directory, or
``$STOCKADE_STATE_DIR``)::

    cluster.json    the database URL, every process's id, kind, address and arguments, and
                    the workers hosted in fleets (id, address, capacity, fleet)
    pg/             the embedded PostgreSQL server (ops.launcher.pg), unless DATABASE_URL is given
    logs/<id>.log   each process's stdout and stderr
    pids/<id>.pid   each process's pid
    fleets/<id>.json  each fleet's spec file (the workers it hosts; see agent.fleet)
    workers/<id>/   each worker's work dir (agent.jsonl, jobs/<job>-<assignment>/std*.log)

Each process is ``python -m ops.cli cp|agent|fleet ...`` in its own session, so closing the
terminal does not stop the cluster. Workers run one per ``agent`` process, or, with
``fleet_size`` K > 0, K per ``fleet`` process (fleet-1, fleet-2, ...): each still has its own
id, port, registration, heartbeats and work dir, but a fleet lives and dies as one process.
A pid file counts only while it names a live process whose command line is that process's
(pids are reused). Every process carries the state
folder in its environment (``STOCKADE_CLUSTER_DIR``), so ``down`` can find and stop
stragglers whose pid file was lost, including the agents' job processes.

``up`` is idempotent: the first run picks free ports and records them; later runs reuse
them, leave live processes alone and start dead ones again (a killed leader comes back as a
standby, a killed worker registers a new incarnation). Asked for other counts, ``up`` changes
the cluster: it adds control planes and workers, or stops the surplus ones cleanly and drops
them from cluster.json (:mod:`ops.launcher.plan`). Every process it adds serves Prometheus
metrics on a port of its own, recorded in cluster.json (:meth:`ClusterConfig.metrics_addresses`).

With ``up --docker`` the same folder and record describe a cluster in containers
(:class:`ops.launcher.docker.DockerCluster`): the database, control planes and workers each in a
container on a private Docker network; :func:`cluster_at` gives the right one for a folder.

This module is the public face: the code lives in :mod:`ops.launcher` (state, plan, control,
docker).
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
