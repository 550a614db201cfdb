"""The local cluster: control planes and worker agents as background processes on this machine.

``stockade up`` / ``stockade down`` and the end-to-end tests drive a :class:`LocalCluster`.
Everything it knows lives in one state folder (``.stockade/`` in the current directory, or
``$STOCKADE_STATE_DIR``)::

    cluster.json    the database URL, every process's id, kind, address and arguments, and
                    the workers hosted in fleets (id, address, capacity, fleet)
    pg/             the embedded PostgreSQL server (ops.pg), unless DATABASE_URL is given
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

This module is the public face: the code lives in :mod:`ops.launcher` (state, plan, control).
"""

from __future__ import annotations

import os
from pathlib import Path

from ops.launcher.control import READY_TIMEOUT_S, STOP_TIMEOUT_S, DownReport, LocalCluster, UpResult
from ops.launcher.state import (
    LISTEN_HOST,
    MARKER_ENV,
    STATE_DIR_ENV,
    WORKER_CAPACITIES,
    ClusterConfig,
    ClusterError,
    ProcessSpec,
    StateDir,
    WorkerSpec,
    iter_worker_logs,
    metrics_address,
)
from runtime import identifiers

__all__ = [
    "CONTROL_PLANES_ENV",
    "LISTEN_HOST",
    "MARKER_ENV",
    "READY_TIMEOUT_S",
    "STATE_DIR_ENV",
    "STOP_TIMEOUT_S",
    "WORKER_CAPACITIES",
    "ClusterConfig",
    "ClusterError",
    "DownReport",
    "LocalCluster",
    "ProcessSpec",
    "StateDir",
    "UpResult",
    "WorkerSpec",
    "default_state_dir",
    "iter_worker_logs",
    "metrics_address",
    "parse_addresses",
    "resolve_addresses",
]

CONTROL_PLANES_ENV = "STOCKADE_CONTROL_PLANES"
"""Environment variable with comma-separated control-plane addresses for client commands."""


def default_state_dir() -> Path:
    """``$STOCKADE_STATE_DIR``, else ``.stockade`` in the current directory (absolute)."""
    return Path(os.environ.get(STATE_DIR_ENV) or ".stockade").absolute()


def parse_addresses(text: str) -> list[str]:
    """``"a:1, b:2"`` -> ``["a:1", "b:2"]`` (empty items dropped; spaces around an item are
    the list's, not the item's).

    Raises:
        InvalidArgument: an item is not ``host:port`` (:func:`runtime.identifiers.parse_address`).
    """
    addresses = [item.strip() for item in text.split(",") if item.strip()]
    identifiers.parse_addresses(addresses, field="control_planes")
    return addresses


def resolve_addresses(option: str | None, state: StateDir | None = None) -> list[str]:
    """Control-plane addresses for a client command.

    The ``--control-planes`` option, else ``$STOCKADE_CONTROL_PLANES``, else cluster.json.

    Raises:
        ClusterError: none of the three names any address.
    """
    for text in (option, os.environ.get(CONTROL_PLANES_ENV)):
        if text:
            addresses = parse_addresses(text)
            if addresses:
                return addresses
    state = state or StateDir(default_state_dir())
    config = state.load()
    if config is None or not config.control_planes:
        raise ClusterError(
            f"no control-plane addresses: pass --control-planes host:port,..., set "
            f"{CONTROL_PLANES_ENV}, or run `stockade up` (no cluster recorded in {state.root})"
        )
    return config.control_plane_addresses
