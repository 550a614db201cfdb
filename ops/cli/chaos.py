"""``chaos`` (a fresh cluster under injected failovers, then the checker) and ``check`` (the
checker on a cluster's history)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ops.chaos_settings import ChaosSettings
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
from ops.cli.options import Option, Options, quiet_option, settings_fields, settings_rows, with_options
from ops.config import ClusterError, default_state_dir
from runtime.errors import InvalidArgument

if TYPE_CHECKING:
    from ops.checker import FaultEvent
    from ops.cluster import ClusterConfig


_chaos = settings_rows("chaos", functools.partial(getattr, ChaosSettings()))


def _count(field: str, help: str) -> dict[str, Option]:
    """The option of a :class:`ChaosSettings` field that counts faults (0 or more)."""
    return _chaos(field, min=0, help=help)


def _seconds(field: str, help: str) -> dict[str, Option]:
    """The option of a :class:`ChaosSettings` field that says how long a fault lasts (at least 10 ms)."""
    return _chaos(field, min=0.01, help=help)


CHAOS_OPTIONS: dict[str, Option] = {
    **_chaos("failovers", typer.Argument(min=0, help="Leader failovers to inject (kill, freeze, ...).")),
    **_count("worker_kills", "Workers to SIGKILL and restart along the way."),
    **_count(
        "worker_restarts",
        "Planned restarts of workers along the way: SIGHUP (the agent exits leaving its jobs "
        "running), then started again; the new agent must keep every job.",
    ),
    **_count("partitions", "Times to cut a worker off from every control plane, then heal it."),
    **_seconds("partition_s", "How long each partition lasts, seconds."),
    **_count(
        "mass_partitions", "Times to cut every worker off from every control plane at once, then heal them."
    ),
    **_seconds("mass_partition_s", "How long each cut of every worker lasts, seconds."),
    **_count(
        "db_restarts",
        "Times to stop the database (fast shutdown or SIGKILL) for 2-12 s, then start it again.",
    ),
    **_chaos(
        "ha_db",
        typer.Option(
            "--ha-db", help="Run the chaos cluster on a PostgreSQL failover pair (as `stockade up --ha-db`)."
        ),
    ),
    **_count(
        "db_failovers",
        "With --ha-db: times to SIGKILL the database's primary, let Patroni promote the standby, "
        "and start the old primary again as the standby.",
    ),
    **_chaos("workers", min=1, help="Workers in the chaos cluster."),
    **_chaos("submit_rate_per_s", option="rate", min=0.01, help="Jobs submitted per second."),
    **_chaos(
        "failing_share",
        min=0.0,
        max=1.0,
        help="Share of the jobs made to fail (a command exiting 3, max_attempts 2): each must be "
        "retried once and end failed, every other job succeeded.",
    ),
    **_chaos(
        "gangs",
        typer.Option(
            "--gangs",
            help="Make every fifth submission a gang of 2 to 8 sleep tasks (every other one spread; with "
            "devices, half of them asking 1 or 2 gpu per task) and sample the database for partial gangs "
            "during the run (docs/gangs.md).",
        ),
    ),
    **_chaos("seed", help="Seed of the job stream and the worker kills."),
    "json_path": Option(
        None, typer.Option("--json", help="Also write the results as JSON."), kind=Path | None
    ),
    "state_dir": Option(
        None, help="State folder of the chaos cluster (default .stockade/chaos).", kind=Path | None
    ),
    "keep": Option(False, help="Leave the chaos cluster running afterwards."),
    "insecure": Option(
        False, typer.Option("--insecure", help="Run the chaos cluster without TLS (development only).")
    ),
    **_chaos(
        "accounts",
        min=1,
        max=20,
        help="User accounts submitting the jobs, round-robin (chaos-1, chaos-2, ...; weights 1, 2, 3 in "
        "turn); 1: the operator alone.",
    ),
    **_chaos(
        "preemption",
        typer.Option(
            "--preemption",
            help="Run the control planes with preemption on (grace 1 s, cooldown 5 s) under jobs that fill "
            "the cluster; every 15th job asks 4,000 cpu_millis at priority 10.",
        ),
    ),
    **_chaos(
        "schedule_every_s",
        min=0,
        max=59,
        help="A schedule firing a short job every S seconds runs through the run; the checker "
        "proves each slot was recorded exactly once (0: none).",
    ),
    **_chaos(
        "devices",
        typer.Option(
            "--devices/--no-devices",
            help="Give every worker 8 fake gpu units and make three jobs in four ask 1 to 4 of them, "
            "running 2 to 6 s; the checker also checks no unit was held by two jobs at once, and the "
            "table shows the gpu use while jobs waited (docs/devices.md).",
        ),
    ),
    **_chaos(
        "docker",
        typer.Option(
            "--docker",
            help="Run the chaos cluster in containers (as `stockade up --docker`): freezes are docker "
            "pause, partitions take a worker off the network, database restarts are container restarts.",
        ),
    ),
}
"""The options of ``stockade chaos``, in their ``--help`` order: those of group ``chaos`` set the
:class:`ChaosSettings` field they name (their defaults are its), the others say where the
cluster runs and what is kept of it."""


def _refuse_what_cannot_run(settings: ChaosSettings) -> None:
    """Refuse (one line, exit 2) settings no chaos cluster here can run: a fault or mode the
    cluster's kind lacks, or --ha-db without the tools it needs."""
    if settings.docker and settings.preemption:
        fail("--preemption is not available with --docker yet: run it on a local cluster", EXIT_INVALID)
    if settings.docker and settings.ha_db:
        fail("--ha-db is not available with --docker: drop one of them", EXIT_INVALID)
    if settings.docker and settings.worker_restarts:
        fail("--worker-restarts is not available with --docker: a container's jobs end with it", EXIT_INVALID)
    if settings.db_failovers and not settings.ha_db:
        fail(
            "--db-failovers needs --ha-db (the embedded database has no standby to fail over to)",
            EXIT_INVALID,
        )
    if settings.db_restarts and os.environ.get("DATABASE_URL") and not settings.docker:
        fail("--db-restarts restarts the embedded database, and DATABASE_URL is set; unset it", EXIT_INVALID)
    if settings.db_restarts and settings.ha_db:
        fail("--db-restarts restarts the embedded database; with --ha-db use --db-failovers", EXIT_INVALID)
    if settings.ha_db:
        from ops.launcher.hadb_members import INSTALL_HINT, missing_tools

        missing = missing_tools()
        if missing:
            fail(f"--ha-db needs {', '.join(missing)}: {INSTALL_HINT}", EXIT_INVALID)


@app.command("chaos")
@with_options(CHAOS_OPTIONS)
def chaos(*, options: Options) -> None:
    """Start a fresh cluster, inject leader failovers (alternating SIGKILL and SIGSTOP/SIGCONT,
    some frozen inside a fenced transaction), and the worker kills, partitions, cut-offs of every
    worker and database restarts asked for, under a steady job stream; wait for every job, and
    check that none was placed or run twice and that no outage killed running work. Exits 1
    when a safety count is not 0 or a job did not finish."""
    settings = ChaosSettings(**settings_fields(CHAOS_OPTIONS, options, "chaos"))
    _refuse_what_cannot_run(settings)
    import trio

    from ops.chaos import Harness
    from ops.chaosresult import chaos_table
    from ops.cluster import ClusterDriver, DockerCluster, LocalCluster, StateDir

    folder, insecure = StateDir(options["state_dir"] or default_state_dir() / "chaos"), options["insecure"]
    cluster: ClusterDriver
    if settings.docker:
        cluster = DockerCluster(folder, insecure=insecure)
    else:
        cluster = LocalCluster(folder, insecure=insecure, ha_db=settings.ha_db)
    harness = Harness(settings=settings, cluster=cluster, progress=lambda line: err_console().print(line))
    try:
        with interruptible(), errors():
            result = trio.run(harness.run)
    finally:
        if not options["keep"]:
            with contextlib.suppress(ClusterError):
                cluster.down()
    console().print(chaos_table(result))
    if options["json_path"] is not None:
        options["json_path"].write_text(json.dumps(result.to_json(), indent=2) + "\n")
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
