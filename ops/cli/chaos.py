"""``chaos`` (a fresh cluster under injected failovers, then the checker) and ``check`` (the
checker on a cluster's history)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ops.cli.base import app
from ops.cli.common import (
    EXIT_INVALID,
    EXIT_UNAVAILABLE,
    console,
    err_console,
    errors,
    fail,
    interruptible,
    recorded_local_state,
)
from ops.cli.options import quiet_option
from ops.config import ClusterError, default_state_dir
from runtime.errors import InvalidArgument

if TYPE_CHECKING:
    from ops.checker import FaultEvent
    from ops.cluster import ClusterConfig


def _count(help_text: str) -> Any:
    """A ``--option`` that counts faults (0 or more)."""
    return typer.Option(min=0, help=help_text)


def _seconds(help_text: str) -> Any:
    """A ``--option`` that says how long a fault lasts (at least 10 ms)."""
    return typer.Option(min=0.01, help=help_text)


@app.command("chaos")
def chaos(
    failovers: Annotated[
        int, typer.Argument(min=0, help="Leader failovers to inject (kill, freeze, ...).")
    ] = 200,
    worker_kills: Annotated[int, _count("Workers to SIGKILL and restart along the way.")] = 0,
    worker_restarts: Annotated[
        int,
        _count(
            "Planned restarts of workers along the way: SIGHUP (the agent exits leaving its jobs "
            "running), then started again; the new agent must keep every job."
        ),
    ] = 0,
    partitions: Annotated[
        int, _count("Times to cut a worker off from every control plane, then heal it.")
    ] = 0,
    partition_s: Annotated[float, _seconds("How long each partition lasts, seconds.")] = 4.0,
    mass_partitions: Annotated[
        int, _count("Times to cut every worker off from every control plane at once, then heal them.")
    ] = 0,
    mass_partition_s: Annotated[float, _seconds("How long each cut of every worker lasts, seconds.")] = 10.0,
    db_restarts: Annotated[
        int, _count("Times to stop the database (fast shutdown or SIGKILL) for 2-12 s, then start it again.")
    ] = 0,
    ha_db: Annotated[
        bool,
        typer.Option(
            "--ha-db", help="Run the chaos cluster on a PostgreSQL failover pair (as `stockade up --ha-db`)."
        ),
    ] = False,
    db_failovers: Annotated[
        int,
        _count(
            "With --ha-db: times to SIGKILL the database's primary, let Patroni promote the standby, "
            "and start the old primary again as the standby."
        ),
    ] = 0,
    workers: Annotated[int, typer.Option(min=1, help="Workers in the chaos cluster.")] = 10,
    rate: Annotated[float, typer.Option(min=0.01, help="Jobs submitted per second.")] = 12.0,
    failing_share: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Share of the jobs made to fail (a command exiting 3, max_attempts 2): each must be "
            "retried once and end failed, every other job succeeded.",
        ),
    ] = 0.1,
    gangs: Annotated[
        bool,
        typer.Option(
            "--gangs",
            help="Make every fifth submission a gang of 2 to 8 sleep tasks (every other one spread; with "
            "devices, half of them asking 1 or 2 gpu per task) and sample the database for partial gangs "
            "during the run (docs/gangs.md).",
        ),
    ] = False,
    seed: Annotated[int, typer.Option(help="Seed of the job stream and the worker kills.")] = 1,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the results as JSON.")] = None,
    state_dir: Annotated[
        Path | None, typer.Option(help="State folder of the chaos cluster (default .stockade/chaos).")
    ] = None,
    keep: Annotated[bool, typer.Option(help="Leave the chaos cluster running afterwards.")] = False,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Run the chaos cluster without TLS (development only).")
    ] = False,
    accounts: Annotated[
        int,
        typer.Option(
            min=1,
            max=20,
            help="User accounts submitting the jobs, round-robin (chaos-1, chaos-2, ...; weights 1, 2, 3 in "
            "turn); 1: the operator alone.",
        ),
    ] = 1,
    preemption: Annotated[
        bool,
        typer.Option(
            "--preemption",
            help="Run the control planes with preemption on (grace 1 s, cooldown 5 s) under jobs that fill "
            "the cluster; every 15th job asks 4,000 cpu_millis at priority 10.",
        ),
    ] = False,
    schedule_every_s: Annotated[
        int,
        typer.Option(
            min=0,
            max=59,
            help="A schedule firing a short job every S seconds runs through the run; the checker "
            "proves each slot was recorded exactly once (0: none).",
        ),
    ] = 2,
    devices: Annotated[
        bool,
        typer.Option(
            "--devices/--no-devices",
            help="Give every worker 8 fake gpu units and make three jobs in four ask 1 to 4 of them, "
            "running 2 to 6 s; the checker also checks no unit was held by two jobs at once, and the "
            "table shows the gpu use while jobs waited (docs/devices.md).",
        ),
    ] = True,
    docker: Annotated[
        bool,
        typer.Option(
            "--docker",
            help="Run the chaos cluster in containers (as `stockade up --docker`): freezes are docker "
            "pause, partitions take a worker off the network, database restarts are container restarts.",
        ),
    ] = False,
) -> None:
    """Start a fresh cluster, inject leader failovers (alternating SIGKILL and SIGSTOP/SIGCONT,
    some frozen inside a fenced transaction), and the worker kills, partitions, cut-offs of every
    worker and database restarts asked for, under a steady job stream; wait for every job, and
    check that none was placed or run twice and that no outage killed running work. Exits 1
    when a safety count is not 0 or a job did not finish."""
    import trio

    from ops.chaos import Harness
    from ops.chaosresult import ChaosSettings, chaos_table
    from ops.cluster import ClusterDriver, DockerCluster, LocalCluster, StateDir

    if docker and preemption:
        fail("--preemption is not available with --docker yet: run it on a local cluster", EXIT_INVALID)
    if docker and ha_db:
        fail("--ha-db is not available with --docker: drop one of them", EXIT_INVALID)
    if docker and worker_restarts:
        fail("--worker-restarts is not available with --docker: a container's jobs end with it", EXIT_INVALID)
    if db_failovers and not ha_db:
        fail(
            "--db-failovers needs --ha-db (the embedded database has no standby to fail over to)",
            EXIT_INVALID,
        )
    if db_restarts and os.environ.get("DATABASE_URL") and not docker:
        fail("--db-restarts restarts the embedded database, and DATABASE_URL is set; unset it", EXIT_INVALID)
    if db_restarts and ha_db:
        fail("--db-restarts restarts the embedded database; with --ha-db use --db-failovers", EXIT_INVALID)
    if ha_db:
        from ops.launcher.hadb_members import INSTALL_HINT, missing_tools

        missing = missing_tools()
        if missing:
            fail(f"--ha-db needs {', '.join(missing)}: {INSTALL_HINT}", EXIT_INVALID)
    root = state_dir or (default_state_dir() / "chaos")
    cluster: ClusterDriver
    if docker:
        cluster = DockerCluster(StateDir(root), insecure=insecure)
    else:
        cluster = LocalCluster(StateDir(root), insecure=insecure, ha_db=ha_db)
    settings = ChaosSettings(
        failovers=failovers,
        worker_kills=worker_kills,
        worker_restarts=worker_restarts,
        partitions=partitions,
        partition_s=partition_s,
        mass_partitions=mass_partitions,
        mass_partition_s=mass_partition_s,
        db_restarts=db_restarts,
        db_failovers=db_failovers,
        ha_db=ha_db,
        docker=docker,
        workers=workers,
        submit_rate_per_s=rate,
        failing_share=failing_share,
        seed=seed,
        accounts=accounts,
        preemption=preemption,
        schedule_every_s=schedule_every_s,
        devices=devices,
        gangs=gangs,
    )
    harness = Harness(settings=settings, cluster=cluster, progress=lambda line: err_console().print(line))
    try:
        with interruptible(), errors():
            result = trio.run(harness.run)
    finally:
        if not keep:
            with contextlib.suppress(ClusterError):
                cluster.down()
    console().print(chaos_table(result))
    if json_path is not None:
        json_path.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    if not result.ok:
        raise typer.Exit(EXIT_UNAVAILABLE)


@app.command("check")
def check(
    database_url: Annotated[
        str | None, typer.Option(help="Database to read (default: the cluster's, from cluster.json).")
    ] = None,
    state_dir: Annotated[
        Path | None, typer.Option(help="State folder whose workers' logs and fault record to read.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    fault: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KIND:ID@TIME[..UNTIL]",
            help="A fault injected by hand, KIND:ID@TIME[..UNTIL]: KIND kill, freeze or partition; ID a "
            "worker, control plane or fleet; TIME and UNTIL Unix seconds or ISO 8601 "
            "(e.g. kill:w-3@1764538392.5). Repeatable; counted with events.jsonl's.",
        ),
    ] = None,
    wait_s: Annotated[
        float | None,
        quiet_option(
            min=0,
            help="Wait up to this long, seconds, for every job to finish before checking; a job still "
            "unfinished then fails the check. [default: no wait; unfinished jobs are reported as "
            "running]",
        ),
    ] = None,
) -> None:
    """Check a cluster's history: no job placed twice (database), none run twice at once (the
    workers' logs), no false dead-worker declarations, no success lost, no wrong final state.
    Exits 1 when one of those fails.

    Jobs not finished yet (pending, waiting, assigned, running) are no failure: jobs_finished
    reads `running` and jobs_unfinished says how many in each state. --wait-s S waits up to S
    seconds for them first, and then an unfinished job fails the check."""
    import trio

    from ops import checker
    from ops.cluster import LocalCluster, StateDir
    from runtime.aio import asyncio_bridge

    state = StateDir(state_dir) if state_dir is not None else recorded_local_state()
    with errors():
        config = LocalCluster(state).config() if database_url is None or state.config_path.exists() else None
        manual = [checker.parse_fault(text) for text in fault or ()]
        url = database_url or (config.database_url if config is not None else None)
        if url is None:
            fail("no database: pass --database-url or run in a cluster's folder", EXIT_INVALID)

        async def load() -> checker.History:
            nonlocal manual
            async with asyncio_bridge():
                if config is not None and manual:  # before any wait: a typo is refused at once
                    manual = _faults_in_cluster(manual, config, await checker.registered_workers(url))
                if wait_s is not None:
                    await checker.wait_for_jobs(url, timeout_s=wait_s)
                return await checker.load_history(url)

        history = trio.run(load)
    faults = [*checker.load_events(state.events_path), *manual]
    # Also the folders of workers no longer recorded: a worker an `up` stopped (and dropped) may
    # be declared dead after a leave that was not recorded, and its log says it stopped cleanly.
    worker_dirs = state.worker_dirs() if config is not None else []
    report = checker.check_logs(history, worker_dirs, faults, finish_required=wait_s is not None)
    if as_json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        console().print(checker.check_table(report))
    if not report.ok:
        raise typer.Exit(EXIT_UNAVAILABLE)


def _faults_in_cluster(
    faults: list[FaultEvent], config: ClusterConfig, registered: Collection[str] = ()
) -> list[FaultEvent]:
    """``faults`` checked against the cluster's ids, a fault of a fleet process also counted for
    every worker it hosts (they die with it). ``registered``: the workers its database knows,
    which may include workers started by hand that cluster.json does not record.

    Raises:
        InvalidArgument: a fault names an id that is neither a process or worker of the cluster's
            record nor a worker its database knows.
    """
    import attrs

    from ops.launcher.state import worker_order

    def order(process_id: str) -> tuple[str, tuple[int, str]]:  # cp-1, cp-2, fleet-1, w-1, w-2, w-10
        return process_id.rpartition("-")[0], worker_order(process_id)

    recorded = {p.id for p in config.processes} | {w.id for w in config.workers}
    known = recorded | set(registered)
    expanded = []
    for event in faults:
        if event.target not in known:
            others = sorted(set(registered) - recorded, key=order)
            by_hand = f"; workers started by hand: {', '.join(others)}" if others else ""
            raise InvalidArgument(
                "fault ID",
                event.target,
                "must name a process or worker of this cluster or a worker registered in its database "
                f"(processes {', '.join(sorted(recorded, key=order))}{by_hand})",
            )
        expanded.append(event)
        expanded += [attrs.evolve(event, target=w.id) for w in config.workers_in(event.target) if w.fleet]
    return expanded
