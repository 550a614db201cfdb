"""``stockade bench``: failover times, packing, overload; each prints measured numbers."""

from __future__ import annotations

import contextlib
import functools
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ops.cli.app import bench_app
from ops.cli.common import (
    EXIT_INVALID,
    EXIT_UNAVAILABLE,
    console,
    err_console,
    errors,
    fail,
    interruptible,
)
from ops.config import default_state_dir


@bench_app.command("failover")
def bench_failover(
    kills: Annotated[int, typer.Option(help="Leader SIGKILLs to time.")] = 10,
    freezes: Annotated[int, typer.Option(help="Leader freezes (SIGSTOP past the lease) to time.")] = 10,
    stops: Annotated[int, typer.Option(help="Clean leader stops (SIGTERM) to time.")] = 10,
    worker_kills: Annotated[
        int, typer.Option(help="Worker SIGKILLs to time until their jobs run elsewhere.")
    ] = 10,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures as JSON.")] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(help="State folder of the bench cluster (default .stockade/bench-failover)."),
    ] = None,
) -> None:
    """Time to a new leader after kills, freezes and clean stops, and time until a killed
    worker's jobs run elsewhere, on a fresh local cluster with the default settings."""
    import rich.box
    import trio
    from rich.table import Table

    from ops.bench import FailoverBenchSettings, run_failover_bench
    from ops.cli.render import seconds_text
    from ops.cluster import ClusterError, LocalCluster, StateDir

    if min(kills, freezes, stops, worker_kills) < 0:
        fail("counts must be >= 0", EXIT_INVALID)
    cluster = LocalCluster(StateDir(state_dir or (default_state_dir() / "bench-failover")))
    settings = FailoverBenchSettings(kills=kills, freezes=freezes, stops=stops, worker_kills=worker_kills)
    try:
        with interruptible(), errors():
            figures = trio.run(run_failover_bench, settings, cluster, lambda line: err_console().print(line))
    finally:
        with contextlib.suppress(ClusterError):
            cluster.down()
    samples = figures["samples"]
    table = Table(box=rich.box.SIMPLE_HEAD, show_edge=False)
    for column in ("measure", "runs", "p50", "max"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    for label, key, sample in [
        ("new leader after SIGKILL", "failover_kill", "kill"),
        ("new leader after SIGSTOP", "failover_freeze", "freeze"),
        ("new leader after SIGTERM", "failover_stop", "stop"),
        ("killed worker's jobs running elsewhere", "worker_recovery", "worker_recovery"),
    ]:
        table.add_row(
            label,
            str(len(samples[sample])),
            seconds_text(figures[f"{key}_p50_s"]),
            seconds_text(figures[f"{key}_max_s"]),
        )
    console().print(table)
    if json_path is not None:
        json_path.write_text(json.dumps(figures, indent=2) + "\n")


@bench_app.command("pack")
def bench_pack(
    jobs: Annotated[int, typer.Option(help="Jobs in the stream.")] = 10_000,
    workers: Annotated[int, typer.Option(help="Workers (hosted in fleets).")] = 100,
    seed: Annotated[int, typer.Option(help="Seed of the job stream.")] = 1,
    policy: Annotated[
        str, typer.Option(help="Policies to compare, comma-separated (best_fit first is the baseline).")
    ] = "best_fit,first_fit,worst_fit",
    fleet_size: Annotated[int, typer.Option(help="Workers hosted per process.")] = 25,
    burst: Annotated[bool, typer.Option(help="Run the burst scenario.")] = True,
    burst_jobs: Annotated[int, typer.Option(help="Jobs in the burst.")] = 10_000,
    scale: Annotated[bool, typer.Option(help="Run the scale curve.")] = True,
    arrival_rate: Annotated[
        float,
        typer.Option(
            help="Jobs per second of the arriving scenario (Poisson arrivals of the same stream, "
            "after the all-at-once one); 0 skips it."
        ),
    ] = 105.0,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the results as JSON (and a PNG next to it).")
    ] = None,
    state_dir: Annotated[
        Path | None, typer.Option(help="State folder of the bench clusters (default .stockade/bench-pack).")
    ] = None,
) -> None:
    """Pack a seeded stream of sleep jobs onto a fresh cluster under each policy, side by side,
    all submitted at once and then arriving over time; then a burst into an empty cluster, and
    the round time as the queue and the cluster grow."""
    import trio

    from ops import benchpack
    from ops.pg import EmbeddedPostgres, free_port
    from runtime import log as runtime_log

    policies = tuple(p.strip() for p in policy.split(",") if p.strip())
    if not policies or any(p not in benchpack.POLICIES for p in policies):
        fail(f"policy must list some of {', '.join(benchpack.POLICIES)}, got {policy!r}", EXIT_INVALID)
    for option, value, low, high in (
        ("--jobs", jobs, 1, 1_000_000),
        ("--workers", workers, 1, 1_000),
        ("--burst-jobs", burst_jobs, 1, 1_000_000),
        ("--fleet-size", fleet_size, 0, 1_000),
    ):
        if not low <= value <= high:
            fail(f"{option} must be between {low} and {high}, got {value}", EXIT_INVALID)
    if not (arrival_rate == 0 or 1 <= arrival_rate <= 100_000):
        fail(
            f"--arrival-rate must be 0 (skip the arriving scenario) or between 1 and 100000 jobs/s, "
            f"got {arrival_rate}",
            EXIT_INVALID,
        )
    out = json_path or Path("bench-pack.json")
    if not out.parent.resolve().is_dir():
        fail(f"--json: folder {out.parent} does not exist", EXIT_INVALID)
    runtime_log.configure(level="WARNING")  # the scale curve runs a placer in this process
    root = state_dir or (default_state_dir() / "bench-pack")
    settings = benchpack.PackSettings(
        jobs=jobs,
        workers=workers,
        seed=seed,
        policies=policies,
        fleet_size=fleet_size,
        burst_jobs=burst_jobs,
        arrival_rate_per_s=arrival_rate,
    )
    progress = err_console().print
    results: list[dict[str, Any]] = []
    arriving: list[dict[str, Any]] = []
    burst_result: dict[str, Any] = {}
    scale_points: list[dict[str, Any]] = []
    with interruptible(), errors():
        for name in policies:
            results.append(trio.run(benchpack.run_policy, settings, name, root / name, progress))
            if arrival_rate > 0:
                arriving.append(
                    trio.run(
                        functools.partial(
                            benchpack.run_policy,
                            settings,
                            name,
                            root / f"{name}-arriving",
                            progress,
                            arrival_rate_per_s=arrival_rate,
                        )
                    )
                )
        if burst:
            burst_result = trio.run(benchpack.run_burst, settings, root / "burst", progress)
        if scale:
            server = EmbeddedPostgres(data_dir=root / "scale-pg", port=free_port())
            url = server.start()
            try:
                for n_workers in settings.scale_workers:
                    for pending in settings.scale_pending:
                        progress(f"scale: {pending} pending, {n_workers} workers")
                        scale_points.append(
                            trio.run(
                                benchpack.run_scale_point, url, pending, n_workers, settings.scale_rounds
                            )
                        )
            finally:
                server.stop()
    ratios = _pack_table("all at once", results)
    arrival_ratios = _pack_table(f"arriving at {arrival_rate:g} jobs/s", arriving) if arriving else {}
    if burst_result:
        console().print(
            f"burst: {burst_result['burst_started']} of {burst_result['burst_jobs']} jobs started in "
            f"{burst_result['burst_s']} s: burst_placements_per_s {burst_result['burst_placements_per_s']}"
        )
    for point in scale_points:
        console().print(
            f"scale: {point['pending']:>6} pending x {point['workers']:>4} workers: round p50 "
            f"{point['round_p50_ms']} ms, p99 {point['round_p99_ms']} ms, max {point['round_max_ms']} ms, "
            f"first (full read) {point['first_round_ms']} ms"
        )
    for line in benchpack.growth(scale_points):
        console().print(f"scale: {line}")
    data = {
        "settings": {
            "jobs": jobs,
            "workers": workers,
            "seed": seed,
            "fleet_size": fleet_size,
            "arrival_rate_per_s": arrival_rate,
        },
        "policies": results,
        "ratios": ratios,
        "arrivals": (
            {"rate_per_s": arrival_rate, "policies": arriving, "ratios": arrival_ratios} if arriving else None
        ),
        "burst": burst_result,
        "scale": scale_points,
        "scale_growth": benchpack.growth(scale_points),
    }
    benchpack.save(out, data)
    picture = out.with_suffix(".png")
    scenarios = [("all at once", results)]
    if arriving:
        scenarios.append((f"arriving at {arrival_rate:g} jobs/s", arriving))
    benchpack.plot(scenarios, picture)
    console().print(f"wrote {out} and {picture}")
    if any(
        r["double_placements"]
        or r["double_runs"]
        or r["overcommitted_workers"]
        or r["unfinished_job_ids"]
        or r["jobs_finished"] < jobs
        or any(r[k] for k in _DISTURBANCES)
        for r in results + arriving
    ):
        raise typer.Exit(EXIT_UNAVAILABLE)


_DISTURBANCES = ("lease_losses", "worker_deaths", "self_fences", "extra_assignments", "lost_successes")
"""Counts a run with no injected fault must keep at 0, however loaded the machine."""


@bench_app.command("overload")
def bench_overload(
    rates: Annotated[
        str, typer.Option(help="Offered jobs per second, one step each, comma-separated, rising.")
    ] = "10,25,50,100,200,400",
    step_s: Annotated[float, typer.Option(help="Seconds each step lasts.")] = 20.0,
    kind: Annotated[str, typer.Option(help="Jobs: command (runs `true`) or sleep.")] = "command",
    sleep_ms: Annotated[int, typer.Option(help="Duration of a sleep job, milliseconds.")] = 500,
    workers: Annotated[int, typer.Option(help="Workers, one agent process each.")] = 5,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the results as JSON (and a PNG next to it).")
    ] = None,
    state_dir: Annotated[
        Path | None, typer.Option(help="State folder of the cluster (default .stockade/bench-overload).")
    ] = None,
) -> None:
    """Raise the offered load step by step past what this machine can do, then drop it back:
    goodput per step (jobs finished per second), what was shed, and the disturbances, with a PNG
    of goodput against offered load. Exits 1 when a job was placed or run twice or a success
    was lost."""
    import rich.box
    import trio
    from rich.table import Table

    from ops import benchoverload

    try:
        offered = tuple(float(r) for r in rates.split(","))
    except ValueError:
        fail(f"--rates must be numbers (jobs/s) separated by commas, got {rates!r}", EXIT_INVALID)
    out = json_path or Path("bench-overload.json")
    if not out.parent.resolve().is_dir():
        fail(f"--json: folder {out.parent} does not exist", EXIT_INVALID)
    with interruptible(), errors():
        settings = benchoverload.OverloadSettings(
            rates=offered, step_s=step_s, kind=kind, sleep_ms=sleep_ms, workers=workers
        )
        root = state_dir or (default_state_dir() / "bench-overload")
        result = trio.run(benchoverload.run_overload, settings, root, err_console().print)
    table = Table(box=rich.box.SIMPLE_HEAD, show_edge=False, title="jobs/s; finish: submit to end, s")
    columns = {
        "step": "step",
        "offered_per_s": "offered",
        "accepted_per_s": "accepted",
        "shed_per_s": "shed",
        "failed_per_s": "failed",
        "goodput_per_s": "goodput",
        "finish_p50_s": "finish p50",
        "finish_p99_s": "p99",
        "elections": "elections",
        "worker_deaths": "deaths",
        "self_fences": "fences",
    }
    for key, header in columns.items():
        table.add_column(header, justify="left" if key == "step" else "right", no_wrap=True)
    for step in result["steps"]:
        table.add_row(*(str(step[k]) for k in columns))
    console().print(table)
    for line in benchoverload.summary(result):
        console().print(line)
    benchoverload.save(out, result)
    picture = out.with_suffix(".png")
    benchoverload.plot(result, picture)
    console().print(f"wrote {out} and {picture}")
    check = result["check"]
    if check["double_placements"] or check["double_runs"] or check["lost_successes"]:
        raise typer.Exit(EXIT_UNAVAILABLE)


_PACK_KEYS = (
    "cpu_use_waiting",
    "memory_use_waiting",
    "cpu_use_pending",
    "finished_s",
    "jobs_per_s",
    "makespan_over_bound",
    "round_p50_ms",
    "round_p99_ms",
    "round_max_ms",
    "mean_pending_while_waiting",
    "wait_p50_s",
    "large_wait_p50_s",
    "large_wait_max_s",
    "placements_per_s",
    "double_placements",
    "double_runs",
    "overcommitted_workers",
    *_DISTURBANCES,
    "db_commit_p50_ms",
    "db_commit_p99_ms",
    "db_commit_max_ms",
)
"""The rows of ``bench pack``'s tables, keys of :func:`ops.benchpack.run_policy`'s result."""


def _pack_table(title: str, results: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Print one scenario's policies side by side, then the first policy's ratios to each other
    one; returns the ratios, keyed ``"best_fit/worst_fit"``."""
    import rich.box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=rich.box.SIMPLE_HEAD, show_edge=False)
    table.add_column("measure")
    for result in results:
        table.add_column(result["policy"], justify="right")
    for key in _PACK_KEYS:
        table.add_row(key, *(str(r.get(key)) for r in results))
    for phase in ("read", "decide", "commit", "dispatch"):
        table.add_row(
            f"  {phase} p50 / p99 ms",
            *(
                "{p50_ms} / {p99_ms}".format(**r["round_phases"][phase]) if r.get("round_phases") else "None"
                for r in results
            ),
        )
    console().print(table)
    for result in results:
        if result.get("db_stalls"):
            stalls = ", ".join(f"{latency:g} s at {t:g} s" for t, latency in result["db_stalls"])
            console().print(f"{result['policy']}: database commits slower than 1 s: {stalls}")
    base = results[0]
    ratios: dict[str, dict[str, float | None]] = {}
    for other in results[1:]:
        ratio = {
            k: (round(base[k] / other[k], 3) if base.get(k) and other.get(k) else None)
            for k in ("cpu_use_waiting", "memory_use_waiting", "finished_s")
        }
        ratios[f"{base['policy']}/{other['policy']}"] = ratio
        console().print(
            f"{base['policy']} / {other['policy']}: " + ", ".join(f"{k} x{v}" for k, v in ratio.items())
        )
    return ratios
