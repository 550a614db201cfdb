"""Waiting for a started cluster: every control plane answers, one leads, every worker is alive."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import trio

from ops import rpc
from ops.launcher.state import ClusterConfig, ClusterError, StateDir, option_value
from protocol import pb
from runtime.client import ControlPlaneClient
from runtime.errors import Unavailable
from runtime.text import tail_lines

POLL_INTERVAL_S = 0.2
"""How often readiness is asked again, in seconds."""
STATUS_TIMEOUT_S = 1.0
"""Deadline of one readiness status call to one control plane, in seconds."""
OVERRUN_GRACE_S = 10.0
"""How long past its ``timeout_s`` a wait may run before its caller gives up on it whatever it
is doing (:func:`ops.rpc.with_client`'s ``limit_s``), in seconds: a poll in progress when the
timeout passes ends within a few status calls' deadlines."""
FRESH_HEARTBEAT_S = 2.0
"""A worker counts as alive only with a heartbeat younger than this, in seconds, or than two of
its heartbeat intervals where the cluster's workers beat less often (:func:`fresh_heartbeat_s`)."""


def fresh_heartbeat_s(config: ClusterConfig) -> float:
    """How young a worker's last heartbeat must be for readiness, in seconds.

    ``FRESH_HEARTBEAT_S``, or twice the longest ``--heartbeat-interval-s`` among the cluster's
    agent and fleet processes when that is longer (a worker beating every 3 s is never seen
    with a heartbeat younger than 2 s for long).
    """
    intervals = [
        float(value)
        for spec in config.processes
        if spec.kind in ("agent", "fleet")
        and (value := option_value(spec.args, "--heartbeat-interval-s")) is not None
    ]
    return max([FRESH_HEARTBEAT_S, *(2 * interval for interval in intervals)])


def wait_ready(
    state: StateDir,
    config: ClusterConfig,
    *,
    restarted: Mapping[str, int],
    timeout_s: float,
    check_exited: Callable[[], None],
    started_at: Mapping[str, float] | None = None,
) -> pb.StatusReply:
    """Poll until every control plane answers, one leads, and every worker is alive.

    A worker counts once the status shows it alive with a fresh heartbeat, and, for a worker
    in ``restarted`` (id -> incarnation before the restart), once its log has a ``register``
    line written since its new process started, when ``started_at`` says when that was (an
    agent that took over its predecessor's jobs continues its incarnation, and a heartbeat of
    a predecessor killed just before may commit late), else under a new incarnation.

    Args:
        state: the state folder (its logs are named in the error).
        config: the cluster to wait for.
        restarted: id -> incarnation before the restart, of the workers just started again.
        timeout_s: how long to wait, in seconds.
        check_exited: called before each poll; raises ClusterError when a process exited.
        started_at: id -> when the restarted worker's process was started (``time.time()``,
            which on a local cluster's one machine is the database's clock: its log's lines
            carry the database's clock, :mod:`agent.dbclock`).

    Every wait is bounded: each status call by :data:`STATUS_TIMEOUT_S` (a busy replica is not
    asked again within the poll), each poll by the deadline, and the whole wait, whatever a call
    does, by ``timeout_s`` plus :data:`OVERRUN_GRACE_S`; the waiting happens in a thread of its
    own, so Ctrl-C and SIGTERM end it at once (:func:`ops.rpc.with_client`, ``limit_s``).

    Raises:
        ClusterError: a process exited, or ``timeout_s`` passed; names what is missing and
            the log files to read.
        KeyboardInterrupt: Ctrl-C (or SIGTERM, turned into it by the command) while waiting.
    """

    async def poll(_client: ControlPlaneClient) -> tuple[pb.StatusReply | None, list[str]]:
        deadline = trio.current_time() + timeout_s
        status: pb.StatusReply | None = None
        missing = ["no control plane answered a status call yet"]
        while True:
            check_exited()
            with trio.move_on_at(deadline):
                status, missing = await readiness(state, config, restarted, started_at or {})
            if not missing:
                return status, []
            if trio.current_time() >= deadline:
                return status, missing
            await trio.sleep(POLL_INTERVAL_S)

    try:
        status, missing = rpc.with_client(
            config.control_plane_addresses, poll, tls=config.client_tls, limit_s=timeout_s + OVERRUN_GRACE_S
        )
    except rpc.RunOverran as exc:
        raise ClusterError(
            f"cluster not ready after {timeout_s:g} s: a status call did not end ({exc}); read "
            + ", ".join(str(state.log_path(p.id)) for p in config.control_planes)
        ) from exc
    if missing or status is None:
        raise ClusterError(
            f"cluster not ready after {timeout_s:g} s: " + "; ".join(missing or ["no control plane answered"])
        )
    return status


async def readiness(
    state: StateDir,
    config: ClusterConfig,
    restarted: Mapping[str, int],
    started_at: Mapping[str, float] | None = None,
) -> tuple[pb.StatusReply | None, list[str]]:
    """A status (the first control plane's that answered, or None) and what is not ready yet
    (see :func:`wait_ready`)."""
    started_at = started_at or {}
    missing: list[str] = []
    status: pb.StatusReply | None = None
    for spec in config.control_planes:
        client = ControlPlaneClient(
            [spec.address], timeout_s=STATUS_TIMEOUT_S, busy_retry_s=0.0, tls=config.client_tls
        )
        try:
            with trio.fail_after(STATUS_TIMEOUT_S * 2 + 1):  # its own deadline, and one more bound
                reply = await client.call("status", pb.StatusRequest())
        except (Unavailable, trio.TooSlowError) as exc:
            missing.append(
                f"{spec.id} did not answer a status call at {spec.address} within "
                f"{STATUS_TIMEOUT_S:g} s ({exc or 'no answer'}; read {state.log_path(spec.id)})"
            )
            continue
        finally:
            client.close()
        status = status or reply
    if status is None:
        return None, missing
    if not status.leader:
        logs = ", ".join(str(state.log_path(p.id)) for p in config.control_planes)
        missing.append(f"no leader elected (read {logs})")
    by_id = {w.id: w for w in status.workers}
    fresh_s = fresh_heartbeat_s(config)
    for worker_spec in config.workers:
        worker = by_id.get(worker_spec.id)
        log_hint = f"(read {state.log_path(worker_spec.process_id)})"
        if worker is None:
            missing.append(f"{worker_spec.id} not registered {log_hint}")
        elif (
            worker.state != "alive"
            or worker.last_heartbeat_age_s > fresh_s
            or (
                worker_spec.id in restarted
                and not _back(
                    worker, restarted[worker_spec.id], _registered(state, worker_spec.id, started_at)
                )
            )
        ):
            missing.append(f"{worker_spec.id} not registered alive yet {log_hint}")
    return status, missing


def _registered(state: StateDir, worker_id: str, started_at: Mapping[str, float]) -> bool | None:
    """Whether ``worker_id``'s new process registered since it was started; None when its start
    time is not known."""
    if worker_id not in started_at:
        return None
    return registered_since(state.work_dir(worker_id) / "agent.jsonl", started_at[worker_id])


def _back(worker: pb.WorkerInfo, incarnation_before: int, registered: bool | None) -> bool:
    """Whether a restarted worker's new process is back: ``registered`` (its log has a
    ``register`` line since it was started: a new incarnation, or its predecessor's continued),
    or, where that is not known (None), another incarnation than before
    (``incarnation_before``; 0: unknown, taken as back). Not its row's heartbeat alone: a
    heartbeat its killed predecessor sent may commit after the new process started."""
    if registered is not None:
        return registered
    return worker.incarnation != incarnation_before


def registered_since(log_path: Path, since_unix_s: float) -> bool:
    """Whether the worker log ``log_path`` (``agent.jsonl``) has a ``register`` line written at
    or after ``since_unix_s`` (the database's clock, as the lines'), among its last 200 lines."""
    if not log_path.exists():
        return False
    for line in reversed(tail_lines(log_path, max_lines=200).lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == "register":
            return float(record.get("time", 0.0)) >= since_unix_s
    return False
