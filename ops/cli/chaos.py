"""``chaos`` (a fresh cluster under injected failovers, then the checker) and ``check`` (the
checker on a cluster's history)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ops.cli.app import app
from ops.cli.common import (
    EXIT_INVALID,
    EXIT_UNAVAILABLE,
    console,
    err_console,
    errors,
    fail,
    interruptible,
    local_state,
)
from ops.config import ClusterError, default_state_dir
from runtime.errors import InvalidArgument

if TYPE_CHECKING:
    from rich.table import Table

    from ops.checker import FaultEvent
    from ops.cluster import ClusterConfig


def _check_table(rows: list[tuple[str, str, bool | None]]) -> Table:
    import rich.box
    from rich.table import Table

    table = Table(box=rich.box.SIMPLE_HEAD, show_edge=False)
    table.add_column("result")
    table.add_column("value", justify="right")
    table.add_column("")
    for name, value, good in rows:
        verdict = "" if good is None else ("ok" if good else "FAIL")
        table.add_row(name, value, verdict)
    return table


def _report_rows(report: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    return [
        ("double_placements (database)", str(report["double_placements"]), report["double_placements"] == 0),
        ("double_runs (workers' logs)", str(report["double_runs"]), report["double_runs"] == 0),
        ("jobs_submitted", str(report["jobs_submitted"]), None),
        ("jobs_finished", str(report["jobs_finished"]), not report["unfinished_job_ids"]),
        ("false_deaths", str(report["false_deaths"]), report["false_deaths"] == 0),
        ("lost_successes", str(report["lost_successes"]), report["lost_successes"] == 0),
        ("stale_writes_rejected", str(report["stale_writes_rejected"]), None),
        (
            "elections / worker_deaths / self_fences",
            f"{report['elections']} / {report['worker_deaths']} / {report['self_fences']}",
            None,
        ),
        ("extra_assignments", str(report["extra_assignments"]), None),
    ]


@app.command("chaos")
def chaos(
    failovers: Annotated[int, typer.Argument(help="Leader failovers to inject (kill, freeze, ...).")] = 200,
    worker_kills: Annotated[int, typer.Option(help="Workers to SIGKILL and restart along the way.")] = 0,
    partitions: Annotated[
        int, typer.Option(help="Times to cut a worker off from every control plane, then heal it.")
    ] = 0,
    partition_s: Annotated[float, typer.Option(help="How long each partition lasts, seconds.")] = 4.0,
    workers: Annotated[int, typer.Option(help="Workers in the chaos cluster.")] = 10,
    rate: Annotated[float, typer.Option(help="Sleep jobs submitted per second.")] = 12.0,
    seed: Annotated[int, typer.Option(help="Seed of the job stream and the worker kills.")] = 1,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the results as JSON.")] = None,
    state_dir: Annotated[
        Path | None, typer.Option(help="State folder of the chaos cluster (default .stockade/chaos).")
    ] = None,
    keep: Annotated[bool, typer.Option(help="Leave the chaos cluster running afterwards.")] = False,
) -> None:
    """Start a fresh cluster, inject leader failovers (alternating SIGKILL and SIGSTOP/SIGCONT,
    some frozen inside a fenced transaction) under a steady job stream, wait for every job, and
    check that none was placed or run twice. Exits 1 when a safety count is not 0 or a job did
    not finish."""
    import trio

    from ops.chaos import ChaosSettings, Harness
    from ops.cli.render import seconds_text
    from ops.cluster import LocalCluster, StateDir

    if failovers < 0 or worker_kills < 0 or partitions < 0 or workers < 1 or rate <= 0 or partition_s <= 0:
        fail(
            "failovers, --worker-kills and --partitions must be >= 0, --workers >= 1, "
            "--rate and --partition-s > 0",
            EXIT_INVALID,
        )
    root = state_dir or (default_state_dir() / "chaos")
    cluster = LocalCluster(StateDir(root))
    settings = ChaosSettings(
        failovers=failovers,
        worker_kills=worker_kills,
        partitions=partitions,
        partition_s=partition_s,
        workers=workers,
        submit_rate_per_s=rate,
        seed=seed,
    )
    harness = Harness(settings=settings, cluster=cluster, progress=lambda line: err_console().print(line))
    try:
        with interruptible(), errors():
            result = trio.run(harness.run)
    finally:
        if not keep:
            with contextlib.suppress(ClusterError):
                cluster.down()
    data = result.as_dict()
    rows: list[tuple[str, str, bool | None]] = [
        ("failovers (killed, frozen)", f"{data['failovers']['killed']}, {data['failovers']['frozen']}", None),
        *_report_rows({**data, "unfinished_job_ids": data["unfinished_job_ids"]}),
        (
            "failover_kill_p50_s / max",
            f"{seconds_text(data['failover_kill_p50_s'])} / {seconds_text(data['failover_kill_max_s'])}",
            None,
        ),
        (
            "failover_freeze_p50_s / max",
            f"{seconds_text(data['failover_freeze_p50_s'])} / {seconds_text(data['failover_freeze_max_s'])}",
            None,
        ),
        ("worker_kills", str(data["worker_kills"]), None),
        (
            "partitions (rejoined, ran jobs again)",
            f"{data['partitions']} ({data['partitions_rejoined']}, {data['partitions_worked_again']})",
            data["partitions_rejoined"] == data["partitions"] if data["partitions"] else None,
        ),
        ("duration", f"{data['duration_s']} s", None),
    ]
    console().print(_check_table(rows))
    for line in data["details"][:20]:
        console().print(f"  {line}", markup=False)
    if json_path is not None:
        json_path.write_text(json.dumps(data, indent=2) + "\n")
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
) -> None:
    """Check a cluster's history: no job placed twice (database), none run twice at once (the
    workers' logs), no false dead-worker declarations, every job finished. Exits 1 otherwise."""
    import trio

    from ops import checker
    from ops.cluster import LocalCluster, StateDir
    from runtime.aio import asyncio_bridge

    state = StateDir(state_dir) if state_dir is not None else local_state()
    with errors():
        config = LocalCluster(state).config() if database_url is None or state.config_path.exists() else None
        manual = [checker.parse_fault(text) for text in fault or ()]
        if config is not None:
            manual = _faults_in_cluster(manual, config)
        url = database_url or (config.database_url if config is not None else None)
        if url is None:
            fail("no database: pass --database-url or run in a cluster's folder", EXIT_INVALID)

        async def load() -> checker.History:
            async with asyncio_bridge():
                return await checker.load_history(url)

        history = trio.run(load)
    faults = [*checker.load_events(state.events_path), *manual]
    worker_dirs = [state.work_dir(p.id) for p in config.workers] if config is not None else []
    report = checker.check_logs(history, worker_dirs, faults)
    data = report.as_dict()
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        rows = [*_report_rows(data), ("worker_leaves (clean stops)", str(data["worker_leaves"]), None)]
        console().print(_check_table(rows))
        for line in data["details"][:20]:
            console().print(f"  {line}", markup=False)
    if not report.ok:
        raise typer.Exit(EXIT_UNAVAILABLE)


def _faults_in_cluster(faults: list[FaultEvent], config: ClusterConfig) -> list[FaultEvent]:
    """``faults`` checked against the cluster's ids, a fault of a fleet process also counted for
    every worker it hosts (they die with it).

    Raises:
        InvalidArgument: a fault names an id that is no process or worker of the cluster.
    """
    import attrs

    known = {p.id for p in config.processes} | {w.id for w in config.workers}
    expanded = []
    for event in faults:
        if event.target not in known:
            raise InvalidArgument(
                "fault ID",
                event.target,
                f"must name a process or worker of this cluster ({', '.join(sorted(known))})",
            )
        expanded.append(event)
        expanded += [attrs.evolve(event, target=w.id) for w in config.workers_in(event.target) if w.fleet]
    return expanded
