"""``stockade bench``: failover times, packing, overload; each prints measured numbers."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, TypeVar

import typer

from ops.cli.base import bench_app
from ops.cli.common import EXIT_INVALID, EXIT_UNAVAILABLE, console, err_console, errors, fail, interruptible
from ops.cli.options import quiet_option
from ops.config import ClusterError, default_state_dir
from runtime.settings.leader import PLACEMENT_POLICIES

JsonPathOption = Annotated[
    Path | None,
    typer.Option(
        "--json",
        help="Where the results go as JSON, with a PNG next to it"
        " (default: bench-<name>.json in the current folder).",
    ),
]
JsonOnlyPathOption = Annotated[
    Path | None,
    typer.Option(
        "--json",
        help="Where the results go as JSON (default: bench-<name>.json in the current folder).",
    ),
]

SettingsT = TypeVar("SettingsT")
ReportT = TypeVar("ReportT")


def _state_dir_option(what: str, name: str) -> Any:
    """``--state-dir``: where the ``what`` of ``stockade bench <name>`` lives."""
    return typer.Option(
        help=f"State folder of the {what} (default: bench-{name} in the state folder, "
        "./.stockade or $STOCKADE_STATE_DIR)."
    )


InsecureBenchOption = Annotated[
    bool,
    typer.Option("--insecure", help="Run the cluster without TLS (to compare with the default, mutual TLS)."),
]


@bench_app.command("failover")
def bench_failover(
    kills: Annotated[int, typer.Option(min=0, help="Leader SIGKILLs to time.")] = 10,
    freezes: Annotated[
        int, typer.Option(min=0, help="Leader freezes (SIGSTOP past the lease) to time.")
    ] = 10,
    stops: Annotated[int, typer.Option(min=0, help="Clean leader stops (SIGTERM) to time.")] = 10,
    worker_kills: Annotated[
        int, typer.Option(min=0, help="Worker SIGKILLs to time until their jobs run elsewhere.")
    ] = 10,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures as JSON.")] = None,
    state_dir: Annotated[Path | None, _state_dir_option("bench cluster", "failover")] = None,
    insecure: InsecureBenchOption = False,
) -> None:
    """Time to a new leader after kills, freezes and clean stops, and time until a killed
    worker's jobs run elsewhere, on a fresh local cluster with the default settings."""
    import trio

    from ops.bench.failover import FailoverBenchSettings, failover_table, run_failover_bench
    from ops.cluster import LocalCluster, StateDir

    cluster = LocalCluster(StateDir(state_dir or (default_state_dir() / "bench-failover")), insecure=insecure)
    settings = FailoverBenchSettings(kills=kills, freezes=freezes, stops=stops, worker_kills=worker_kills)
    try:
        with interruptible(), errors():
            figures = trio.run(run_failover_bench, settings, cluster, lambda line: err_console().print(line))
    finally:
        with contextlib.suppress(ClusterError):
            cluster.down()
    console().print(failover_table(figures))
    if json_path is not None:
        json_path.write_text(json.dumps(figures.to_json(), indent=2) + "\n")


@bench_app.command("pack")
def bench_pack(
    jobs: Annotated[int, typer.Option(min=1, max=1_000_000, help="Jobs in the stream.")] = 10_000,
    workers: Annotated[int, typer.Option(min=1, max=1_000, help="Workers (hosted in fleets).")] = 100,
    seed: Annotated[int, typer.Option(help="Seed of the job stream.")] = 1,
    policy: Annotated[
        str, typer.Option(help="Policies to compare, comma-separated (best_fit first is the baseline).")
    ] = ",".join(PLACEMENT_POLICIES),
    fleet_size: Annotated[int, typer.Option(min=0, max=1_000, help="Workers hosted per process.")] = 25,
    burst: Annotated[bool, typer.Option(help="Run the burst scenario.")] = True,
    burst_jobs: Annotated[int, typer.Option(min=1, max=1_000_000, help="Jobs in the burst.")] = 10_000,
    scale: Annotated[bool, typer.Option(help="Run the scale curve.")] = True,
    only_scale: Annotated[
        bool, typer.Option(help="Run the scale curve alone (no stream, no burst).")
    ] = False,
    scale_accounts: Annotated[
        int,
        typer.Option(
            min=1,
            max=1_000,
            help="Accounts the scale curve's pending jobs belong to, round-robin, weighted 1, 2, 3 in turn "
            "(fair share orders them).",
        ),
    ] = 1,
    device_share: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="The share of the scale curve's pending jobs that ask 1 to 4 gpu of the simulated "
            "workers, which then each offer 8 (e.g. 0.25; docs/devices.md); 0: no devices.",
        ),
    ] = 0.0,
    gang_share: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="The share of the scale curve's pending jobs that are tasks of gangs of 2 to 8, a third "
            "of them spread (e.g. 0.1; docs/gangs.md), at most 1 - --device-share; 0: no gangs.",
        ),
    ] = 0.0,
    scale_pending: Annotated[
        str, typer.Option(help="The scale curve's pending-job counts, comma-separated.")
    ] = "1000,10000,100000",
    scale_workers: Annotated[
        str, typer.Option(help="The scale curve's worker counts, comma-separated.")
    ] = "100,1000",
    arrival_rate: Annotated[
        float,
        typer.Option(
            min=0,
            max=100_000,
            help="Jobs per second of the arriving scenario (Poisson arrivals of the same stream, "
            "after the all-at-once one), 0 or at least 1; 0 skips it.",
        ),
    ] = 105.0,
    json_path: JsonPathOption = None,
    state_dir: Annotated[Path | None, _state_dir_option("bench clusters", "pack")] = None,
    insecure: InsecureBenchOption = False,
    heartbeat_interval_s: Annotated[
        float,
        typer.Option(
            min=0.1,
            max=10.0,
            help="Workers' heartbeat interval, seconds; their deadline is 1.5x, their self-fence 3.5x and "
            "the control planes' dead-after 5x.",
        ),
    ] = 1.0,
    docker: Annotated[
        bool,
        typer.Option(
            "--docker",
            help="Run the stream under the first policy twice, side by side: workers in fleets, and each "
            "worker in a container of its own (needs the image: `stockade image build`); nothing else.",
        ),
    ] = False,
) -> None:
    """Pack a seeded stream of sleep jobs onto a fresh cluster under each policy, side by side,
    all submitted at once and then arriving over time; then a burst into an empty cluster, and
    the round time as the queue and the cluster grow."""

    from ops.bench import pack
    from runtime import log as runtime_log

    policies = tuple(p.strip() for p in policy.split(",") if p.strip())
    if not policies or any(p not in pack.POLICIES for p in policies):
        fail(f"--policy must list some of {', '.join(pack.POLICIES)}, got {policy!r}", EXIT_INVALID)
    if 0 < arrival_rate < 1:
        # An open range typer cannot state: 0 (skip) or at least 1.
        fail(
            f"--arrival-rate must be 0 (skip the arriving scenario) or between 1 and 100000 jobs/s, "
            f"got {arrival_rate}",
            EXIT_INVALID,
        )
    counts: dict[str, tuple[int, ...]] = {}
    for name, text, top in (
        ("--scale-pending", scale_pending, 1_000_000),
        ("--scale-workers", scale_workers, 10_000),
    ):
        try:
            counts[name] = tuple(int(v) for v in text.split(",") if v.strip())
        except ValueError:
            counts[name] = ()
        if not counts[name] or any(not 1 <= v <= top for v in counts[name]):
            fail(
                f"{name} must list whole numbers from 1 to {top}, comma-separated, got {text!r}", EXIT_INVALID
            )
    out = _json_out(json_path, "pack")
    runtime_log.configure(level="WARNING")  # the scale curve runs a placer in this process
    settings = pack.PackSettings(
        jobs=jobs,
        workers=workers,
        seed=seed,
        policies=policies,
        fleet_size=fleet_size,
        burst=burst,
        burst_jobs=burst_jobs,
        scale=scale or only_scale,
        only_scale=only_scale,
        scale_accounts=scale_accounts,
        scale_device_share=device_share,
        scale_gang_share=gang_share,
        scale_pending=counts["--scale-pending"],
        scale_workers=counts["--scale-workers"],
        arrival_rate_per_s=arrival_rate,
        insecure=insecure,
        docker=docker,
        heartbeat_interval_s=heartbeat_interval_s,
    )
    _show_and_save(pack, _run_bench("pack", pack.run_pack, settings, state_dir), out)


@bench_app.command("fair-share")
def bench_fair_share(
    jobs: Annotated[int, typer.Option(min=1, max=100_000, help="Jobs each account submits.")] = 5000,
    workers: Annotated[int, typer.Option(min=1, max=200, help="Workers (one fleet).")] = 10,
    duration_ms: Annotated[int, typer.Option(min=1, max=600_000, help="Each job's sleep, ms.")] = 2000,
    window_s: Annotated[float, typer.Option(min=1, max=3600, help="Measurement window, seconds.")] = 60.0,
    alone: Annotated[bool, typer.Option(help="Also run one account alone, fair share on and off.")] = True,
    alone_jobs: Annotated[int, typer.Option(min=1, max=100_000, help="Jobs of the lone account.")] = 2000,
    json_path: JsonOnlyPathOption = None,
    state_dir: Annotated[Path | None, _state_dir_option("bench clusters", "fair-share")] = None,
) -> None:
    """Two accounts, weights 1 and 3, submit their jobs at once into a cluster they saturate:
    print bob's allocation over alice's in every window (fair share aims at 3), and the CPU use
    one account alone reaches with fair share on and off."""
    from ops.bench import fair_share

    settings = fair_share.FairShareSettings(
        jobs=jobs,
        workers=workers,
        duration_ms=duration_ms,
        window_s=window_s,
        alone=alone,
        alone_jobs=alone_jobs,
    )
    out = _json_out(json_path, "fair-share")
    report = _run_bench("fair-share", fair_share.run_fair_share, settings, state_dir)
    _show_text_and_json(fair_share.render(report), report, out)


@bench_app.command("preemption")
def bench_preemption(
    tries: Annotated[int, typer.Option(min=1, max=1000, help="Jobs of priority 10, one at a time.")] = 10,
    workers: Annotated[int, typer.Option(min=1, max=200, help="Workers (one fleet).")] = 5,
    grace_s: Annotated[float, typer.Option(min=0.1, max=600, help="The preemption grace, seconds.")] = 2.0,
    ignore_term: Annotated[
        bool, typer.Option(help="The running jobs ignore SIGTERM: each preemption waits out the grace.")
    ] = True,
    json_path: JsonOnlyPathOption = None,
    state_dir: Annotated[Path | None, _state_dir_option("bench clusters", "preemption")] = None,
) -> None:
    """Fill a cluster (preemption on) with low-priority jobs, then submit jobs of priority 10
    that fit no free room, one at a time: print how long each waited from its submission to its
    start on its worker (the target: p50 within the grace plus 1 s)."""
    from ops.bench import preemption

    settings = preemption.PreemptionBenchSettings(
        tries=tries, workers=workers, grace_s=grace_s, ignore_term=ignore_term
    )
    out = _json_out(json_path, "preemption")
    report = _run_bench("preemption", preemption.run_preemption_bench, settings, state_dir)
    _show_text_and_json(preemption.render(report), report, out)


@bench_app.command("overload")
def bench_overload(
    rates: Annotated[
        str, typer.Option(help="Offered jobs per second, one step each, comma-separated, rising.")
    ] = "10,25,50,100,200,400",
    step_s: Annotated[float, typer.Option(help="Seconds each step lasts.")] = 20.0,
    kind: Annotated[str, typer.Option(help="Jobs: command (runs `true`) or sleep.")] = "command",
    sleep_ms: Annotated[int, typer.Option(help="Duration of a sleep job, milliseconds.")] = 500,
    workers: Annotated[int, typer.Option(help="Workers, one agent process each.")] = 5,
    json_path: JsonPathOption = None,
    state_dir: Annotated[Path | None, _state_dir_option("cluster", "overload")] = None,
) -> None:
    """Raise the offered load step by step past what this machine can do, then drop it back:
    goodput per step (jobs finished per second), what was shed, and the disturbances, with a PNG
    of goodput against offered load. Exits 1 when a job was placed or run twice or a success
    was lost."""
    import trio

    from ops.bench import overload

    try:
        offered = tuple(float(r) for r in rates.split(","))
    except ValueError:
        fail(f"--rates must be numbers (jobs/s) separated by commas, got {rates!r}", EXIT_INVALID)
    out = _json_out(json_path, "overload")
    with interruptible(), errors():
        settings = overload.OverloadSettings(
            rates=offered, step_s=step_s, kind=kind, sleep_ms=sleep_ms, workers=workers
        )
        root = state_dir or (default_state_dir() / "bench-overload")
        result = trio.run(overload.run_overload, settings, root, err_console().print)
    _show_and_save(overload, result, out)


@bench_app.command("unschedulable")
def bench_unschedulable(
    unschedulable: Annotated[
        int, typer.Option(min=0, max=1_000_000, help="Pending jobs larger than every worker.")
    ] = 100_000,
    schedulable: Annotated[int, typer.Option(min=0, max=1_000_000, help="Small pending jobs.")] = 10_000,
    workers: Annotated[int, typer.Option(min=1, max=10_000, help="Simulated workers.")] = 100,
    rounds: Annotated[int, typer.Option(min=1, max=100_000, help="Rounds timed.")] = 200,
    max_settle_rounds: Annotated[
        int,
        typer.Option(min=0, max=100_000, help="Most rounds run to store the reasons before the timed ones."),
    ] = 1_000,
    state_dir: Annotated[Path | None, _state_dir_option("bench database", "unschedulable")] = None,
) -> None:
    """Time the real placer round (read, decision, fenced commit) against a queue of jobs no
    worker can hold beside small ones: round p50 / p99 / max in milliseconds."""
    from ops.bench.pack.unschedulable import bench_unschedulable as run
    from runtime import log as runtime_log

    runtime_log.configure(level="WARNING")  # the placer runs in this process
    with interruptible(), errors():
        result = run(
            state_dir or (default_state_dir() / "bench-unschedulable"),
            unschedulable=unschedulable,
            schedulable=schedulable,
            workers=workers,
            rounds=rounds,
            max_settle_rounds=max_settle_rounds,
        )
    console().print(result.render())


@bench_app.command("scale")
def bench_scale(
    workers: Annotated[
        str, typer.Option(help="Worker counts, one step each, comma-separated (each 1..20000).")
    ] = "100,500,1000,2000",
    duration_s: Annotated[
        float, typer.Option(min=5.0, max=3600.0, help="Seconds each step's measured window lasts.")
    ] = 60.0,
    real_agents: Annotated[
        bool,
        typer.Option(
            "--real-agents",
            help="Run steps of at most 200 workers as real agents in fleets; larger steps (and all "
            "without this flag) use the load generator (ops/bench/loadgen/).",
        ),
    ] = False,
    pending_jobs: Annotated[
        int, typer.Option(min=0, max=1_000_000, help="Jobs kept pending through each step.")
    ] = 10_000,
    heartbeat_interval_s: Annotated[
        float | None,
        quiet_option(
            min=0.3,
            max=10.0,
            help="A fixed heartbeat interval, seconds (deadline 1.5x, self-fence 3.5x, dead-after 5x; "
            "below 0.3 s the dead-after leaves the agents no self-fence longer than the interval); "
            "default: the cluster chooses it as it grows, as anywhere.",
        ),
    ] = None,
    kills: Annotated[int, typer.Option(min=0, max=100, help="Workers killed per step.")] = 3,
    json_path: JsonPathOption = None,
    state_dir: Annotated[Path | None, _state_dir_option("bench clusters", "scale")] = None,
    insecure: InsecureBenchOption = False,
) -> None:
    """Heartbeats recorded per second, their acknowledgement latency, control-plane and database
    CPU per 1,000 heartbeats, false deaths, elections, placer round times with a long queue and
    the time until a killed worker's jobs run elsewhere, for each worker count, on a fresh
    cluster each; with a PNG of how each grows per doubling. Exits 1 on a false death."""
    import trio

    from ops.bench import scale, scale_report
    from runtime.errors import InvalidArgument

    try:
        counts = scale_report.parse_workers(workers)
    except InvalidArgument as exc:
        fail(str(exc), EXIT_INVALID)
    out = _json_out(json_path, "scale")
    settings = scale.ScaleSettings(
        workers=counts,
        duration_s=duration_s,
        real_agents=real_agents,
        pending_jobs=pending_jobs,
        heartbeat_interval_s=heartbeat_interval_s,
        kills=kills,
        insecure=insecure,
    )
    root = state_dir or (default_state_dir() / "bench-scale")
    with interruptible(), errors():
        report = trio.run(scale.run_scale, settings, root, err_console().print)
    _show_and_save(scale_report, report, out)


def _run_bench(
    name: str,
    run: Callable[[SettingsT, Path, Callable[[str], None]], ReportT],
    settings: SettingsT,
    state_dir: Path | None,
) -> ReportT:
    """Run ``stockade bench <name>``'s ``run`` with ``settings`` in ``state_dir`` (default:
    bench-<name> in the state folder), its progress on stderr; Ctrl-C and Stockade's errors end
    the command as :func:`interruptible` and :func:`errors` say."""
    with interruptible(), errors():
        report = run(settings, state_dir or (default_state_dir() / f"bench-{name}"), err_console().print)
    return report


def _json_out(json_path: Path | None, name: str) -> Path:
    """Where ``--json`` puts the results (default ``bench-<name>.json``); exits 2 when its folder
    does not exist."""
    out = json_path or Path(f"bench-{name}.json")
    if not out.parent.resolve().is_dir():
        fail(f"--json: folder {out.parent} does not exist", EXIT_INVALID)
    return out


def _show_text_and_json(text: str, result: Any, out: Path) -> None:
    """Print ``text`` (a report rendered), save ``result.to_json()`` to ``out``; exits 1 when
    ``result`` is not ok."""
    console().print(text)
    out.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    console().print(f"wrote {out}")
    if not result.ok:
        raise typer.Exit(EXIT_UNAVAILABLE)


def _show_and_save(results: ModuleType, result: Any, out: Path) -> None:
    """Print ``result`` as ``results.render`` does, save it as JSON to ``out`` and its picture
    next to it (``results.save``, ``results.plot``); exits 1 when ``result`` is not ok."""
    console().print(results.render(result))
    results.save(out, result)
    picture = out.with_suffix(".png")
    results.plot(result, picture)
    console().print(f"wrote {out} and {picture}")
    if not result.ok:
        raise typer.Exit(EXIT_UNAVAILABLE)
