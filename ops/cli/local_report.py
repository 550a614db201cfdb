"""What the local cluster's commands (:mod:`ops.cli.local`) say about it: ``up``'s result, what
an interrupted ``up`` leaves running, another folder's cluster that still runs, the user config."""

from __future__ import annotations

import contextlib
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from ops.cli.common import console, err_console, shown_path
from ops.config import (
    STATE_DIR_ENV,
    ClusterError,
    record_local_cluster,
    recorded_local_cluster,
    user_config_path,
)

if TYPE_CHECKING:
    from ops.cluster import ClusterDriver, LocalCluster, UpResult

__all__ = [
    "down_command",
    "ha_roles",
    "killed_line",
    "left_running",
    "other_running_cluster",
    "print_up",
    "record",
    "record_quietly",
    "warn_json_logs_not_applied",
]


def print_up(result: UpResult, cluster: ClusterDriver) -> None:
    import rich.box
    from rich.table import Table

    from ops.cluster import LocalCluster

    roles = {cp.id: cp.role for cp in result.status.control_planes}
    workers = {w.id: w for w in result.status.workers}
    metrics = result.config.metrics_addresses()
    table = Table(box=rich.box.SIMPLE_HEAD, title="processes", title_justify="left", padding=(0, 1))
    for column in ("id", "pid", "address", "metrics", "state", "capacity", ""):
        table.add_column(column, no_wrap=True)
    for spec in result.config.processes:
        capacity = ""
        note = "started" if spec.id in result.started else "was running"
        if spec.kind == "cp":
            state = "leader" if spec.id == result.status.leader else roles.get(spec.id, "?")
        elif spec.kind == "fleet":
            hosted = result.config.workers_in(spec.id)
            alive = sum(1 for w in hosted if (s := workers.get(w.id)) is not None and s.state == "alive")
            state = f"{alive}/{len(hosted)} alive"
            capacity = f"{len(hosted)} workers: {hosted[0].id}..{hosted[-1].id}" if hosted else "no workers"
        else:
            worker = workers.get(spec.id)
            state = worker.state if worker else "?"
            capacity = f"{worker.cpu_millis}m / {worker.memory_mb} MiB" if worker else ""
        pid = str(result.pids.get(spec.id, "-"))
        table.add_row(spec.id, pid, spec.address or "-", metrics.get(spec.id, "-"), state, capacity, note)
    for hosted_worker in result.config.hosted_workers:
        worker = workers.get(hosted_worker.id)
        table.add_row(
            hosted_worker.id,
            str(result.pids.get(hosted_worker.process_id, "-")),
            hosted_worker.address,
            "-",
            worker.state if worker else "?",
            f"{worker.cpu_millis}m / {worker.memory_mb} MiB" if worker else "",
            f"in {hosted_worker.process_id}",
        )
    console().print(table)
    if result.removed:
        stopped = f" (stopped {' '.join(result.stopped)})" if result.stopped else ""
        console().print(f"removed   {' '.join(result.removed)}{stopped}")
    if result.killed:
        console().print(f"killed    {killed_line(result.killed, result.stop_deadlines_s)}")
    if (docker := result.config.docker) is not None:
        database = f"PostgreSQL in a container on {docker.network} ({docker.subnet})"
    elif result.config.ha_db:
        assert isinstance(cluster, LocalCluster)
        database = f"HA PostgreSQL (Patroni + etcd, {ha_roles(cluster)})"
    elif result.config.embedded_pg_port:
        database = "embedded PostgreSQL"
    else:
        database = "DATABASE_URL"
    if result.database_started:
        database += " (started)"

    console().print(f"database  {database}: {result.config.database_url}")
    console().print(f"leader    {result.status.leader} at epoch {result.status.epoch}")
    console().print(f"logs      {shown_path(cluster.state.root / 'logs')}/<id>.log")
    if docker is not None:
        console().print(
            f"docker    image {docker.image}; containers {docker.prefix}-<id>, network {docker.network}"
        )
    if result.config.cert_dir is None:
        console().print("tls       off (--insecure): plaintext, no identities")
    else:
        certs = shown_path(Path(result.config.cert_dir))
        console().print(f"tls       mutual TLS with {certs}/; client commands present {certs}/operator.crt")
    consoles = result.config.console_urls()
    if consoles:
        login = (
            "plain HTTP on 127.0.0.1, no login (--insecure)"
            if result.config.cert_dir is None
            else "open one with `stockade console` (it prints each URL with a login token)"
        )
        console().print(f"console   {' '.join(consoles.values())}: {login}")


def killed_line(killed: tuple[str, ...], deadlines_s: dict[str, float]) -> str:
    """The processes SIGKILLed at their stop deadline, each with its deadline."""
    each = ", ".join(f"{p} ({deadlines_s[p]:g} s)" if p in deadlines_s else p for p in killed)
    return (
        f"{each}: still running that long after SIGTERM; workers of these that had not left "
        "will be declared dead"
    )


def ha_roles(cluster: LocalCluster) -> str:
    """The HA pair's members and roles in a few words, e.g. ``pg-1 primary, pg-2 sync standby``."""
    from ops.launcher.hadb_members import HaDatabaseError

    try:
        members = cluster.ha_database().members()
    except HaDatabaseError as exc:
        return f"members unknown: {exc}"
    names = {"leader": "primary", "sync_standby": "sync standby"}
    return ", ".join(f"{m.name} {names.get(m.role, m.role)}" for m in members)


def warn_json_logs_not_applied(result: UpResult, cluster: ClusterDriver) -> None:
    """Name the processes that keep their recorded options without ``--json-logs``."""
    kept = [
        spec.id
        for spec in result.config.processes
        if spec.kind in ("cp", "agent", "fleet") and "--json-logs" not in spec.args
    ]
    if kept:
        err_console().print(
            "note: --json-logs reaches only processes new to this cluster; these keep the options "
            f"recorded for them and log console lines: {' '.join(kept)} (`{down_command(cluster)}` "
            "then `stockade up --json-logs` starts them all with it)",
            markup=False,
            soft_wrap=True,
        )


def down_command(cluster: ClusterDriver) -> str:
    """The command that stops ``cluster``, as typed in the current folder."""
    if os.environ.get(STATE_DIR_ENV):
        return f"{STATE_DIR_ENV}={shlex.quote(str(cluster.state.root))} stockade down"
    return "stockade down"


def left_running(cluster: ClusterDriver) -> str:
    """What an interrupted ``up`` leaves running, in one line, and how to stop it."""
    from ops.cluster import LocalCluster
    from ops.launcher.hadb_members import HaDatabaseError

    if not isinstance(cluster, LocalCluster):
        with contextlib.suppress(ClusterError):
            running = sorted(cluster.pids())
            if running:
                return (
                    f"the containers of {' '.join(running)} still run (the cluster may not be ready); "
                    f"`{down_command(cluster)}` removes them, `stockade up --docker` again waits for "
                    f"them{findable(cluster)}"
                )
        return f"no container of {shown_path(cluster.state.root)} runs"
    with contextlib.suppress(ClusterError, HaDatabaseError):
        running, database = processes_running(cluster)
        what = " ".join(running)
        if database:
            what = f"{what} and the embedded PostgreSQL" if what else "the embedded PostgreSQL"
        if cluster.ha_database().is_running():
            what = f"{what} and the HA PostgreSQL" if what else "the HA PostgreSQL"
        if what:
            return (
                f"{what} of {shown_path(cluster.state.root)} still run in the background (the cluster "
                f"may not be ready); `{down_command(cluster)}` stops them, `stockade up` again "
                f"waits for them{findable(cluster)}"
            )
    return f"nothing of {shown_path(cluster.state.root)} runs"


def processes_running(cluster: LocalCluster) -> tuple[list[str], bool]:
    """The ids of ``cluster``'s live processes, and whether its embedded database runs."""
    from ops.launcher.pg import EmbeddedPostgres

    config = cluster.state.load()
    running = sorted(cluster.pids(config)) if config is not None else []
    # The embedded server starts before cluster.json is first written: look at its data
    # folder, whatever the record says (the port only names it; is_running reads the pid).
    port = config.embedded_pg_port if config is not None and config.embedded_pg_port else 5432
    return running, EmbeddedPostgres(data_dir=cluster.state.pg_dir, port=port).is_running()


def other_running_cluster(here: Path) -> tuple[Path, str] | None:
    """The state folder the user config names, when it is not ``here`` and something of its
    cluster still runs, with what runs; else None."""
    from ops.cluster import LocalCluster, cluster_at
    from ops.launcher.state import StateDir

    other = recorded_local_cluster()
    if other is None or other == here.absolute() or not other.is_dir():
        return None
    running: list[str] = []
    with contextlib.suppress(ClusterError):  # its record unreadable: its processes are not known
        cluster = cluster_at(StateDir(other))
        if not isinstance(cluster, LocalCluster):
            containers = sorted(cluster.pids())
            running = [f"the containers of {' '.join(containers)}"] if containers else []
        else:
            running, database = processes_running(cluster)
            if database:
                running.append("embedded PostgreSQL")
    if not running:
        return None
    return other, " ".join(running)


def findable(cluster: ClusterDriver) -> str:
    """``; the user config X names it: ...`` when the user config records ``cluster``."""
    if recorded_local_cluster() != cluster.state.root.absolute():
        return ""
    return f"; {shown_path(user_config_path())} names it: client commands find it from any folder"


def record_quietly(state_dir: Path) -> None:
    """Record ``state_dir`` in the user config before ``up`` starts anything; errors are said
    once ``up`` is done (:func:`record`)."""
    with contextlib.suppress(ClusterError):
        record_local_cluster(state_dir)


def record(cluster: ClusterDriver) -> None:
    """Record the cluster in the user config; a config that cannot be written is said, not fatal."""
    try:
        path = record_local_cluster(cluster.state.root)
    except ClusterError as exc:
        err_console().print(
            f"note: client commands outside this folder will not find this cluster: {exc}",
            markup=False,
            soft_wrap=True,
        )
        return
    console().print(f"config    {path} names it: client commands find it from any folder")
