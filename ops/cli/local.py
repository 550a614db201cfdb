"""Commands of the local cluster under ``.stockade/``: ``up``, ``down``, ``kill-leader``,
``kill-worker``, ``prometheus-config``. ``up`` records the cluster in the user config
(:mod:`ops.config`) so client commands find it from any folder; ``down`` removes that record.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typer._click.exceptions import BadOptionUsage, BadParameter, NoSuchOption, UsageError

from ops.cli import local_report, params
from ops.cli.base import app
from ops.cli.common import (
    EXIT_INVALID,
    client_tls,
    console,
    control_plane_addresses,
    err_console,
    errors,
    fail,
    interruptible,
    local_state,
    recorded_local_state,
    shown_path,
    warn_insecure,
)
from ops.cli.options import ControlPlanesOption, quiet_option
from ops.config import (
    STATE_DIR_ENV,
    ClusterError,
    ClusterRequestRefused,
    forget_local_cluster,
    user_config_path,
)

if TYPE_CHECKING:
    from ops.cluster import ClusterDriver
    from protocol import pb

WaitTimeoutOption = Annotated[float, typer.Option(min=0, help="How long --wait waits, seconds.")]


@app.command("up")
def up(
    control_planes: Annotated[
        int | None,
        quiet_option(
            min=1, max=9, help="Number of control planes (cp-1..cp-N). [default: as recorded, else 3]"
        ),
    ] = None,
    workers: Annotated[
        int | None,
        quiet_option(min=0, max=1000, help="Number of workers (w-1..w-M). [default: as recorded, else 5]"),
    ] = None,
    fleet_size: Annotated[
        int,
        typer.Option(
            min=0, help="Host new workers this many per process (stockade fleet); 0: one agent process each."
        ),
    ] = 0,
    agent_args: Annotated[
        str,
        typer.Option(
            help="Extra options for new agent or fleet processes, one string, e.g. "
            "'--heartbeat-interval-s 1'."
        ),
    ] = "",
    cp_args: Annotated[
        str, typer.Option(help="Extra options for new control planes, one string, e.g. '--dead-after-s 5'.")
    ] = "",
    json_logs: Annotated[
        bool,
        typer.Option(
            "--json-logs",
            help="Start every new control plane, agent and fleet process with --json-logs: their "
            "logs (.stockade/logs/) are JSON lines, each line about a job keyed by job_id, "
            "assignment_id, epoch and worker_id.",
        ),
    ] = False,
    timeout_s: Annotated[
        float,
        typer.Option(
            min=0,
            help="How long to wait for the cluster without progress, seconds; the wait goes on "
            "while more control planes answer or more workers register or go live, up to this "
            "plus 1 s per worker in all.",
        ),
    ] = 60.0,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Run every process without TLS or identities, for development only (anyone who "
            "reaches a port may submit jobs or pose as a worker).",
        ),
    ] = False,
    ha_db: Annotated[
        bool,
        typer.Option(
            "--ha-db",
            help="Run the database as a PostgreSQL failover pair (two servers managed by Patroni, "
            "three etcd members) under .stockade/hadb instead of one embedded server; needs etcd "
            "and `pip install -e '.[ha]'` (see docs/ha-database.md).",
        ),
    ] = False,
    ha_db_strict: Annotated[
        bool,
        typer.Option(
            "--ha-db-strict",
            help="With --ha-db, create the pair in Patroni's strict synchronous mode: no commit is "
            "acknowledged while the primary is alone, so writes stall after a failover until the "
            "failed server rejoins (default: the primary goes on alone).",
        ),
    ] = False,
    docker: Annotated[
        bool,
        typer.Option(
            "--docker",
            help="Run the database, the control planes and the workers each in a container of the "
            "image stockade:<version> (build it with `stockade image build`) on a private Docker "
            "network; see docs/containers.md.",
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Start this folder's cluster even while the cluster the user config names (of "
            "another state folder) runs: client commands then reach this one, and the other keeps "
            "running, reached with STOCKADE_STATE_DIR=<its folder>.",
        ),
    ] = False,
) -> None:
    """Start the local cluster in the background and wait for a leader and every worker.

    Every connection is mutual TLS: the first start makes a cluster CA and certificates for
    every control plane and worker and for the operator and viewer clients under
    .stockade/certs, and client commands present the operator's (see `stockade certs`).

    The state folder is ./.stockade (or $STOCKADE_STATE_DIR). PostgreSQL is DATABASE_URL
    when set, else an embedded server under .stockade/pg; with --ha-db, a primary and a
    synchronous standby under .stockade/hadb that Patroni fails over, reached through one
    multi-host URL (a running cluster does not switch: `stockade down` first). Safe to run
    again: live processes are left alone, dead ones are started again. Processes are recorded
    with their options when first planned: --fleet-size, --agent-args and --cp-args apply to
    the processes this run adds (`stockade down` and removing .stockade/cluster.json start afresh),
    and so does --json-logs.

    Other counts change the running cluster: added control planes and workers are started;
    surplus ones (beyond cp-N, w-M) are stopped with SIGTERM, so a worker leaves cleanly, and
    dropped from cluster.json. Workers hosted in a fleet stop only with their whole fleet: a
    count that would split one is refused (exit 2), naming what it would split and what the nearest
    counts that would not do. Every
    process added serves Prometheus metrics on a free 127.0.0.1 port (the metrics column), and
    every control plane added a read-only web console on another (`stockade console` opens it).

    The cluster is also recorded in the user config (~/.config/stockade/config.toml, or
    $STOCKADE_CONFIG), so client commands find it from any folder until `stockade down`; it
    is recorded before the first process (or the database) is started. Ctrl-C stops the
    waiting, not the processes already started: it says which run and how to stop them, and
    they stay findable from any folder.

    While the cluster the user config names belongs to another state folder and still runs,
    up refuses (exit 1), naming that folder and how to stop it: starting a second cluster would
    take the client commands away from the first. --force starts it anyway, saying so.
    """
    from ops.cluster import DockerCluster, LocalCluster

    _refuse_conflicting_options(docker=docker, ha_db=ha_db, ha_db_strict=ha_db_strict, fleet_size=fleet_size)
    process_args = {
        "agent": process_options("--agent-args", agent_args, "fleet" if fleet_size else "agent"),
        "cp": process_options("--cp-args", cp_args, "cp"),
    }
    state = local_state()
    _refuse_second_cluster(state.root, force=force)
    if insecure:
        warn_insecure("the cluster")
    if json_logs:
        for args in process_args.values():
            if "--json-logs" not in args:
                args.append("--json-logs")
    cluster: ClusterDriver
    if docker:
        cluster = DockerCluster(
            state,
            agent_args=process_args["agent"],
            cp_args=process_args["cp"],
            insecure=insecure,
            on_start=lambda: local_report.record_quietly(state.root),
        )
    else:
        cluster = LocalCluster(
            state,
            fleet_size=fleet_size,
            agent_args=process_args["agent"],
            cp_args=process_args["cp"],
            insecure=insecure,
            ha_db=ha_db,
            ha_db_strict=ha_db_strict,
            on_start=lambda: local_report.record_quietly(state.root),
        )
    with interruptible(lambda: local_report.left_running(cluster)):
        with errors(), console().status("starting the cluster..."):
            try:
                result = cluster.up(
                    control_planes=control_planes,
                    workers=workers,
                    timeout_s=timeout_s,
                    on_progress=lambda line: err_console().print(line, markup=False, soft_wrap=True),
                )
            except ClusterRequestRefused:  # refused before anything started: nothing to say about that
                raise
            except ClusterError as exc:
                raise ClusterError(f"{exc}; {local_report.left_running(cluster)}") from exc
        local_report.print_up(result, cluster)
        if json_logs:
            local_report.warn_json_logs_not_applied(result, cluster)
        local_report.record(cluster)


_LAUNCHER_OPTIONS: dict[str, tuple[str, ...]] = {
    "agent": (
        "--id", "w-1", "--host", "127.0.0.1", "--port", "0", "--cpu-millis", "1000", "--memory-mb", "1024",
        "--control-planes", "127.0.0.1:1", "--work-dir", "w-1",
    ),
    "fleet": (
        "--id", "fleet-1", "--spec", "fleet-1.json", "--host", "127.0.0.1", "--control-planes", "127.0.0.1:1",
    ),
    "cp": ("--id", "cp-1", "--host", "127.0.0.1", "--port", "0"),
}  # fmt: skip
"""Placeholders of what the launcher puts before the extra options on each kind of process's
command line."""


def process_options(option: str, text: str, command: str) -> list[str]:
    """The extra options ``text`` given with ``option`` (``--agent-args``) for every new
    ``stockade <command>`` process, split as a shell would and read by that command's own
    parser without running it: ``up`` records them, so what the process would refuse is refused
    here, before anything starts (exit 2, naming ``option``, the refusal and the text).
    """
    import typer.main

    from ops.cli import load_commands

    try:
        args = shlex.split(text)
    except ValueError as exc:  # an unclosed quote
        fail(
            f"{option} must be options as a shell reads them ({str(exc).lower()}), got {text!r}", EXIT_INVALID
        )
    if not args:
        return args
    group = typer.main.get_command(load_commands([command]))
    assert isinstance(group, typer.core.TyperGroup)
    process = group.commands[command]
    answers = [a for a in args if a in ("--help", "-h")]  # would print the help and exit
    if answers:
        fail(f"{option}: {answers[0]} prints help and runs no stockade {command}, got {text!r}", EXIT_INVALID)
    try:
        process.make_context(f"stockade {command}", [*_LAUNCHER_OPTIONS[command], *args])
    except UsageError as exc:
        fail(f"{option}: {_refusal(exc, command)}, got {text!r}", EXIT_INVALID)
    return args


def _refusal(exc: UsageError, command: str) -> str:
    """What ``stockade <command>`` refuses in its extra options, in a few words."""
    from runtime.errors import InvalidArgument

    cause = exc.__cause__
    if isinstance(cause, InvalidArgument):
        return f"{cause.field} {cause.rule} for stockade {command} ({cause.value!r})"
    if isinstance(exc, NoSuchOption):
        return f"no such option {exc.option_name} for stockade {command}"
    if isinstance(exc, BadOptionUsage) and " requires " in exc.message:
        return f"{exc.option_name} must be given a value for stockade {command}"
    extra = re.fullmatch(r"Got unexpected extra argument\S* \((.*)\)", exc.message)
    if extra is not None:
        return f"stockade {command} takes options only, not {extra.group(1)!r}"
    field = params.param_field(exc.param) if isinstance(exc, BadParameter) and exc.param is not None else ""
    text = exc.format_message().rstrip(".")
    text = f"{field} {text}" if field and not text.startswith(field) else text
    return f"{text[:1].lower()}{text[1:]} for stockade {command}"


def _refuse_conflicting_options(*, docker: bool, ha_db: bool, ha_db_strict: bool, fleet_size: int) -> None:
    """Exit 2 on options of `up` that do not go together, or --ha-db without its tools."""
    if docker:
        for given, name in ((ha_db, "--ha-db"), (fleet_size, "--fleet-size")):
            if given:
                fail(f"{name} is not available with --docker: drop one of them", EXIT_INVALID)
    if ha_db_strict and not ha_db:
        fail("--ha-db-strict is a mode of --ha-db: give both, or neither", EXIT_INVALID)
    if ha_db:
        from ops.launcher.hadb_members import INSTALL_HINT, missing_tools

        missing = missing_tools()
        if missing:
            fail(f"--ha-db needs {', '.join(missing)}: {INSTALL_HINT}", EXIT_INVALID)
        if os.environ.get("DATABASE_URL"):
            fail(
                "--ha-db starts its own database, and DATABASE_URL is set; unset it, or drop --ha-db "
                "to use that database",
                EXIT_INVALID,
            )


def _refuse_second_cluster(root: Path, *, force: bool) -> None:
    """Exit 1 while another folder's cluster runs and the user config names it (--force: warn)."""
    other = local_report.other_running_cluster(root)
    if other is not None:
        other_root, running = other
        reach = f"{STATE_DIR_ENV}={shlex.quote(str(other_root))}"
        if not force:
            fail(
                f"the cluster of {other_root} runs ({running}) and the user config "
                f"{shown_path(user_config_path())} names it, so client commands reach it from any "
                f"folder; `stockade up` here would start a second cluster in {shown_path(root)} "
                f"and point them here instead. Stop it first (`{reach} stockade down`), or run "
                f"`stockade up --force` to start a second one anyway"
            )
        err_console().print(
            f"warning: the cluster of {other_root} runs ({running}); starting a second one here "
            f"(--force): client commands will reach this one, and that one stays reachable with "
            f"`{reach} stockade status` (`{reach} stockade down` stops it)",
            markup=False,
            soft_wrap=True,
        )


@app.command("down")
def down() -> None:
    """Stop every process of the local cluster and the embedded database, and remove the
    cluster from the user config when `up` recorded it there.

    The workers' processes go first: each gets SIGTERM, stops its jobs and tells a control
    plane that its workers left, and is SIGKILLed only when still running past its deadline
    (its --leave-timeout-s + 10 s + 0.5 s per worker it hosts); then the control planes
    (SIGKILL after 10 s)."""
    from ops.cluster import LocalCluster, cluster_at

    with errors():
        cluster = cluster_at(local_state())
        docker_mode = not isinstance(cluster, LocalCluster)
        report = cluster.down()
    said = []
    if report.terminated:
        said.append("stopped " + " ".join(report.terminated))
    if report.killed:
        said.append("killed " + local_report.killed_line(report.killed, report.stop_deadlines_s))
    if report.stragglers:
        said.append("killed stray processes " + " ".join(str(p) for p in report.stragglers))
    if report.database_stopped:
        said.append("stopped the database container" if docker_mode else "stopped embedded PostgreSQL")
    if report.ha_db_stopped:
        said.append("stopped HA PostgreSQL " + " ".join(report.ha_db_stopped))
    if report.removed:
        containers = [r for r in report.removed if not r.startswith("network ")]
        networks = [r for r in report.removed if r.startswith("network ")]
        what = [f"the containers of {' '.join(containers)}"] if containers else []
        said.append("removed " + " and the ".join(what + networks))
    for line in said or ["nothing was running"]:
        console().print(line)
    try:
        forgotten = forget_local_cluster(cluster.state.root)
    except ClusterError as exc:
        err_console().print(f"note: {exc}", markup=False, soft_wrap=True)
        return
    if forgotten is not None:
        console().print(f"removed it from {forgotten}")


def _recorded_cluster_now(control_planes: str | None) -> tuple[ClusterDriver, list[str], pb.StatusReply]:
    """The local cluster recorded in cluster.json, its control planes' addresses (``--control-planes``
    first) and its status now: what ``kill-leader`` and ``kill-worker`` pick their victim from."""
    from ops import rpc
    from ops.cluster import cluster_at

    cluster = cluster_at(recorded_local_state())
    addresses = control_plane_addresses(control_planes)
    return cluster, addresses, rpc.status(addresses, tls=client_tls())


@app.command("kill-leader")
def kill_leader(
    control_planes: ControlPlanesOption = None,
    wait: Annotated[bool, typer.Option(help="Wait for a new leader and print how long it took.")] = False,
    timeout_s: WaitTimeoutOption = 30.0,
) -> None:
    """SIGKILL the current leader's process (a local cluster's; found through cluster.json)."""
    from ops import faults, rpc

    with errors():
        cluster, addresses, status = _recorded_cluster_now(control_planes)
        if not status.leader:
            fail(f"there is no leader right now (last epoch {status.epoch})")
        since = time.monotonic()
        pid = cluster.kill(status.leader)
        console().print(f"killed leader {status.leader} (pid {pid}) at epoch {status.epoch}")
        if not wait:
            return
        leader, epoch, elapsed_s = rpc.with_client(
            addresses,
            lambda _: faults.new_leader(
                cluster, status.leader, status.epoch, since=since, timeout_s=timeout_s, tls=client_tls()
            ),
        )
        console().print(f"new leader {leader} at epoch {epoch}, {elapsed_s:.2f} s after the kill")


@app.command("kill-worker")
def kill_worker(
    control_planes: ControlPlanesOption = None,
    wait: Annotated[
        bool, typer.Option(help="Wait until its jobs run on other workers and print how long it took.")
    ] = False,
    timeout_s: WaitTimeoutOption = 60.0,
) -> None:
    """SIGKILL the busiest live worker (most CPU allocated) of the local cluster."""
    from ops import faults, rpc

    with errors():
        cluster, addresses, status = _recorded_cluster_now(control_planes)
        config = cluster.config()
        victim = faults.busiest_worker(status, cluster.pids(config))
        if victim is None:
            if config.fleets:
                fleets = ", ".join(f.id for f in config.fleets)
                fail(
                    f"no live worker runs in a process of its own: the workers run in fleets ({fleets}); "
                    "killing a fleet kills all its workers"
                )
            fail("no live worker of this cluster to kill")
        job_ids = [int(j) for j in victim.job_ids]
        killed_at = time.time()
        pid = cluster.kill(victim.id)
        console().print(
            f"killed worker {victim.id} (pid {pid}) with {victim.cpu_allocated_millis} cpu_millis "
            f"allocated; its jobs: {' '.join(map(str, job_ids)) or 'none'}"
        )
        if not wait or not job_ids:
            return
        moved = rpc.with_client(
            addresses,
            lambda client: faults.jobs_moved(
                client, cluster.state, victim.id, job_ids, killed_at, timeout_s=timeout_s
            ),
            timeout_s=1.0,
            tls=client_tls(),
        )
        where = ", ".join(f"{j.job_id} on {j.worker_id or '-'} ({j.state})" for j in moved.jobs)
        console().print(f"its jobs run elsewhere {moved.seconds:.2f} s after the kill: {where}")


@app.command("prometheus-config")
def prometheus_config(
    out: Annotated[
        Path | None,
        quiet_option(
            help="Folder to write prometheus.yml and stockade-targets.json into. "
            "[default: prometheus/ in the state folder]"
        ),
    ] = None,
    scrape_interval_s: Annotated[
        float, typer.Option(min=0.001, help="How often Prometheus scrapes each process, seconds.")
    ] = 1.0,
) -> None:
    """Write a Prometheus configuration that scrapes every process of the local cluster.

    prometheus.yml scrapes the targets listed in stockade-targets.json (file_sd_configs): each
    control plane, agent and fleet at the metrics address cluster.json records for it, labelled
    process (cp-1, w-3, fleet-1) and role (cp, agent, fleet). Prometheus rereads the targets file
    when it changes: run this again after an `up` that adds processes. Run Prometheus with
    `prometheus --config.file DIR/prometheus.yml`, and see docs/metrics.md for Grafana and the
    dashboard (ops/grafana/stockade.json).
    """
    from ops.monitoring import write_prometheus_config

    with errors():
        state = recorded_local_state()
        config = state.load()
        if config is None:
            fail(f"no cluster is recorded in {shown_path(state.root)}: run `stockade up` first")
        folder = out if out is not None else state.root / "prometheus"
        try:
            written = write_prometheus_config(config, folder, scrape_interval_s=scrape_interval_s)
        except OSError as exc:
            fail(f"cannot write the configuration into {shown_path(folder)}: {exc.strerror or exc}")
    if not written.targets:
        err_console().print(
            "note: no process of this cluster serves metrics (planned without them): nothing to scrape",
            markup=False,
            soft_wrap=True,
        )
    targets = f"{written.targets} targets in {shown_path(written.targets_path)}"
    console().print(f"wrote {shown_path(written.config_path)} ({targets})")
    console().print(f"run   prometheus --config.file {shown_path(written.config_path)}")
