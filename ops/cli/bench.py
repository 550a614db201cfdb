"""``stockade bench``: failover times, packing, overload; each prints measured numbers. Each
command's options are declared once, in a table of :class:`ops.cli.options.Option` whose
defaults are its settings class's (:mod:`ops.bench.settings`); the options several commands
take are declared once here."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import typer

from ops.bench.settings import (
    FailoverBenchSettings,
    FairShareSettings,
    OverloadSettings,
    PackSettings,
    PreemptionBenchSettings,
    ScaleSettings,
)
from ops.cli.base import bench_app
from ops.cli.common import EXIT_INVALID, EXIT_UNAVAILABLE, console, err_console, errors, fail, interruptible
from ops.cli.options import Option, Options, quiet_option, settings_fields, settings_rows, with_options
from ops.config import ClusterError, default_state_dir

SettingsT = TypeVar("SettingsT")
ReportT = TypeVar("ReportT")


SETTINGS = "settings"
"""The settings group (:class:`ops.cli.options.Option`) of the options that set fields of a
command's settings class; each command has one."""


def _rows(settings: type) -> Callable[..., dict[str, Option]]:
    """The row constructor (:func:`ops.cli.options.settings_rows`) of the options that set
    fields of the settings class ``settings``, their defaults its defaults (as the process
    commands' and ``chaos``'s)."""
    return settings_rows(SETTINGS, functools.partial(getattr, settings()))


def _listed(settings: type, field: str, **declared: Any) -> Option:
    """An option that lists the values of ``settings``'s tuple field ``field``, comma-separated
    (its default the field's), parsed by the command."""
    values = getattr(settings(), field) or ()
    return Option(",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values), **declared)


def _state_dir(what: str, name: str) -> dict[str, Option]:
    """``--state-dir``: where the ``what`` of ``stockade bench <name>`` lives."""
    info = typer.Option(
        help=f"State folder of the {what} (default: bench-{name} in the state folder, "
        "./.stockade or $STOCKADE_STATE_DIR)."
    )
    return {"state_dir": Option(None, info, kind=Path | None)}


def _json(also: str) -> dict[str, Option]:
    """``--json``: where the results go as JSON, with ``also`` next to them."""
    info = typer.Option(
        "--json",
        help=f"Where the results go as JSON{also} (default: bench-<name>.json in the current folder).",
    )
    return {"json_path": Option(None, info, kind=Path | None)}


JSON_AND_PNG = _json(", with a PNG next to it")
JSON_ONLY = _json("")


def _insecure(group: str) -> dict[str, Option]:
    """``--insecure``, in settings group ``group`` (the field ``insecure``), or in none ("")."""
    help = "Run the cluster without TLS (to compare with the default, mutual TLS)."
    return {"insecure": Option(False, typer.Option("--insecure", help=help), group=group)}


def _under_trio(
    run: Callable[[SettingsT, Path, Callable[[str], None]], Awaitable[ReportT]],
) -> Callable[[SettingsT, Path, Callable[[str], None]], ReportT]:
    """``run``, a benchmark's coroutine function, as a function that runs it under trio."""

    def under_trio(settings: SettingsT, root: Path, progress: Callable[[str], None]) -> ReportT:
        import trio

        return trio.run(run, settings, root, progress)

    return under_trio


def _settings(
    make: Callable[..., SettingsT], declared: dict[str, Option], options: Options, **parsed: Any
) -> SettingsT:
    """``make`` (a command's settings class) given the fields that ``options`` set (the options
    of ``declared`` in :data:`SETTINGS`) and ``parsed``, the fields the command parsed itself
    (which win)."""
    return make(**{**settings_fields(declared, options, SETTINGS), **parsed})


_faults = settings_rows(SETTINGS, lambda field: 10)
"""The rows of :class:`ops.bench.settings.FailoverBenchSettings`'s counts of faults, which it
leaves to the command: 10 of each by default."""

FAILOVER_OPTIONS: dict[str, Option] = {
    **_faults("kills", min=0, help="Leader SIGKILLs to time."),
    **_faults("freezes", min=0, help="Leader freezes (SIGSTOP past the lease) to time."),
    **_faults("stops", min=0, help="Clean leader stops (SIGTERM) to time."),
    **_faults("worker_kills", min=0, help="Worker SIGKILLs to time until their jobs run elsewhere."),
    "json_path": Option(
        None, typer.Option("--json", help="Also write the figures as JSON."), kind=Path | None
    ),
    **_state_dir("bench cluster", "failover"),
    **_insecure(""),
}


@bench_app.command("failover")
@with_options(FAILOVER_OPTIONS)
def bench_failover(options: Options) -> None:
    """Time to a new leader after kills, freezes and clean stops, and time until a killed
    worker's jobs run elsewhere, on a fresh local cluster with the default settings."""
    import trio

    from ops.bench.failover import failover_table, run_failover_bench
    from ops.cluster import LocalCluster, StateDir

    root = options["state_dir"] or (default_state_dir() / "bench-failover")
    cluster = LocalCluster(StateDir(root), insecure=options["insecure"])
    settings = _settings(FailoverBenchSettings, FAILOVER_OPTIONS, options)
    try:
        with interruptible(), errors():
            figures = trio.run(run_failover_bench, settings, cluster, lambda line: err_console().print(line))
    finally:
        with contextlib.suppress(ClusterError):
            cluster.down()
    console().print(failover_table(figures))
    if options["json_path"] is not None:
        options["json_path"].write_text(json.dumps(figures.to_json(), indent=2) + "\n")


_pack = _rows(PackSettings)

PACK_OPTIONS: dict[str, Option] = {
    **_pack("jobs", min=1, max=1_000_000, help="Jobs in the stream."),
    **_pack("workers", min=1, max=1_000, help="Workers (hosted in fleets)."),
    **_pack("seed", help="Seed of the job stream."),
    "policy": _listed(
        PackSettings,
        "policies",
        help="Policies to compare, comma-separated (best_fit first is the baseline).",
    ),
    **_pack("fleet_size", min=0, max=1_000, help="Workers hosted per process."),
    **_pack("burst", help="Run the burst scenario."),
    **_pack("burst_jobs", min=1, max=1_000_000, help="Jobs in the burst."),
    **_pack("scale", help="Run the scale curve."),
    **_pack("only_scale", help="Run the scale curve alone (no stream, no burst)."),
    **_pack(
        "scale_accounts",
        min=1,
        max=1_000,
        help="Accounts the scale curve's pending jobs belong to, round-robin, weighted 1, 2, 3 in turn "
        "(fair share orders them).",
    ),
    **_pack(
        "scale_device_share",
        option="device_share",
        min=0.0,
        max=1.0,
        help="The share of the scale curve's pending jobs that ask 1 to 4 gpu of the simulated "
        "workers, which then each offer 8 (e.g. 0.25; docs/devices.md); 0: no devices.",
    ),
    **_pack(
        "scale_gang_share",
        option="gang_share",
        min=0.0,
        max=1.0,
        help="The share of the scale curve's pending jobs that are tasks of gangs of 2 to 8, a third "
        "of them spread (e.g. 0.1; docs/gangs.md), at most 1 - --device-share; 0: no gangs.",
    ),
    "scale_pending": _listed(
        PackSettings, "scale_pending", help="The scale curve's pending-job counts, comma-separated."
    ),
    "scale_workers": _listed(
        PackSettings, "scale_workers", help="The scale curve's worker counts, comma-separated."
    ),
    **_pack(
        "arrival_rate_per_s",
        option="arrival_rate",
        min=0,
        max=100_000,
        help="Jobs per second of the arriving scenario (Poisson arrivals of the same stream, "
        "after the all-at-once one), 0 or at least 1; 0 skips it.",
    ),
    **JSON_AND_PNG,
    **_state_dir("bench clusters", "pack"),
    **_insecure(SETTINGS),
    **_pack(
        "heartbeat_interval_s",
        min=0.1,
        max=10.0,
        help="Workers' heartbeat interval, seconds; their deadline is 1.5x, their self-fence 3.5x and "
        "the control planes' dead-after 5x.",
    ),
    **_pack(
        "docker",
        info=typer.Option(
            "--docker",
            help="Run the stream under the first policy twice, side by side: workers in fleets, and each "
            "worker in a container of its own (needs the image: `stockade image build`); nothing else.",
        ),
    ),
}


@bench_app.command("pack")
@with_options(PACK_OPTIONS)
def bench_pack(options: Options) -> None:
    """Pack a seeded stream of sleep jobs onto a fresh cluster under each policy, side by side,
    all submitted at once and then arriving over time; then a burst into an empty cluster, and
    the round time as the queue and the cluster grow."""

    from ops.bench import pack
    from runtime import log as runtime_log

    policy, arrival_rate = options["policy"], options["arrival_rate"]
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
    scale_pending = _whole_numbers("--scale-pending", options["scale_pending"], 1_000_000)
    scale_workers = _whole_numbers("--scale-workers", options["scale_workers"], 10_000)
    out = _json_out(options["json_path"], "pack")
    runtime_log.configure(level="WARNING")  # the scale curve runs a placer in this process
    settings = _settings(
        PackSettings,
        PACK_OPTIONS,
        options,
        policies=policies,
        scale=options["scale"] or options["only_scale"],
        scale_pending=scale_pending,
        scale_workers=scale_workers,
    )
    _show_and_save(pack, _run_bench("pack", pack.run_pack, settings, options["state_dir"]), out)


_fair_share = _rows(FairShareSettings)

FAIR_SHARE_OPTIONS: dict[str, Option] = {
    **_fair_share("jobs", min=1, max=100_000, help="Jobs each account submits."),
    **_fair_share("workers", min=1, max=200, help="Workers (one fleet)."),
    **_fair_share("duration_ms", min=1, max=600_000, help="Each job's sleep, ms."),
    **_fair_share("window_s", min=1, max=3600, help="Measurement window, seconds."),
    **_fair_share("alone", help="Also run one account alone, fair share on and off."),
    **_fair_share("alone_jobs", min=1, max=100_000, help="Jobs of the lone account."),
    **JSON_ONLY,
    **_state_dir("bench clusters", "fair-share"),
}


@bench_app.command("fair-share")
@with_options(FAIR_SHARE_OPTIONS)
def bench_fair_share(options: Options) -> None:
    """Two accounts, weights 1 and 3, submit their jobs at once into a cluster they saturate:
    print bob's allocation over alice's in every window (fair share aims at 3), and the CPU use
    one account alone reaches with fair share on and off."""
    from ops.bench import fair_share

    settings = _settings(FairShareSettings, FAIR_SHARE_OPTIONS, options)
    _run_and_show("fair-share", fair_share, fair_share.run_fair_share, settings, options)


_preemption = _rows(PreemptionBenchSettings)

PREEMPTION_OPTIONS: dict[str, Option] = {
    **_preemption("tries", min=1, max=1000, help="Jobs of priority 10, one at a time."),
    **_preemption("workers", min=1, max=200, help="Workers (one fleet)."),
    **_preemption("grace_s", min=0.1, max=600, help="The preemption grace, seconds."),
    **_preemption(
        "ignore_term", help="The running jobs ignore SIGTERM: each preemption waits out the grace."
    ),
    **JSON_ONLY,
    **_state_dir("bench clusters", "preemption"),
}


@bench_app.command("preemption")
@with_options(PREEMPTION_OPTIONS)
def bench_preemption(options: Options) -> None:
    """Fill a cluster (preemption on) with low-priority jobs, then submit jobs of priority 10
    that fit no free room, one at a time: print how long each waited from its submission to its
    start on its worker (the target: p50 within the grace plus 1 s)."""
    from ops.bench import preemption

    settings = _settings(PreemptionBenchSettings, PREEMPTION_OPTIONS, options)
    _run_and_show("preemption", preemption, preemption.run_preemption_bench, settings, options)


_overload = _rows(OverloadSettings)

OVERLOAD_OPTIONS: dict[str, Option] = {
    "rates": _listed(
        OverloadSettings, "rates", help="Offered jobs per second, one step each, comma-separated, rising."
    ),
    **_overload("step_s", help="Seconds each step lasts."),
    **_overload("kind", help="Jobs: command (runs `true`) or sleep."),
    **_overload("sleep_ms", help="Duration of a sleep job, milliseconds."),
    **_overload("workers", help="Workers, one agent process each."),
    **JSON_AND_PNG,
    **_state_dir("cluster", "overload"),
}


@bench_app.command("overload")
@with_options(OVERLOAD_OPTIONS)
def bench_overload(options: Options) -> None:
    """Raise the offered load step by step past what this machine can do, then drop it back:
    goodput per step (jobs finished per second), what was shed, and the disturbances, with a PNG
    of goodput against offered load. Exits 1 when a job was placed or run twice or a success
    was lost."""
    from ops.bench import overload

    rates = options["rates"]
    try:
        offered = tuple(float(r) for r in rates.split(","))
    except ValueError:
        fail(f"--rates must be numbers (jobs/s) separated by commas, got {rates!r}", EXIT_INVALID)
    out = _json_out(options["json_path"], "overload")
    with errors():  # the settings refuse what is out of range
        settings = _settings(OverloadSettings, OVERLOAD_OPTIONS, options, rates=offered)
    run = _under_trio(overload.run_overload)
    _show_and_save(overload, _run_bench("overload", run, settings, options["state_dir"]), out)


UNSCHEDULABLE_OPTIONS: dict[str, Option] = {
    "unschedulable": Option(100_000, min=0, max=1_000_000, help="Pending jobs larger than every worker."),
    "schedulable": Option(10_000, min=0, max=1_000_000, help="Small pending jobs."),
    "workers": Option(100, min=1, max=10_000, help="Simulated workers."),
    "rounds": Option(200, min=1, max=100_000, help="Rounds timed."),
    "max_settle_rounds": Option(
        1_000, min=0, max=100_000, help="Most rounds run to store the reasons before the timed ones."
    ),
}
"""The arguments of :func:`ops.bench.pack.unschedulable.run_unschedulable`, with its defaults."""


@bench_app.command("unschedulable")
@with_options({**UNSCHEDULABLE_OPTIONS, **_state_dir("bench database", "unschedulable")})
def bench_unschedulable(options: Options) -> None:
    """Time the real placer round (read, decision, fenced commit) against a queue of jobs no
    worker can hold beside small ones: round p50 / p99 / max in milliseconds."""
    from ops.bench.pack.unschedulable import bench_unschedulable as run
    from runtime import log as runtime_log

    runtime_log.configure(level="WARNING")  # the placer runs in this process
    root = options["state_dir"] or (default_state_dir() / "bench-unschedulable")
    with interruptible(), errors():
        result = run(root, **{name: options[name] for name in UNSCHEDULABLE_OPTIONS})
    console().print(result.render())


_scale = _rows(ScaleSettings)

SCALE_OPTIONS: dict[str, Option] = {
    "workers": _listed(
        ScaleSettings, "workers", help="Worker counts, one step each, comma-separated (each 1..20000)."
    ),
    **_scale("duration_s", min=5.0, max=3600.0, help="Seconds each step's measured window lasts."),
    **_scale(
        "real_agents",
        info=typer.Option(
            "--real-agents",
            help="Run steps of at most 200 workers as real agents in fleets; larger steps (and all "
            "without this flag) use the load generator (ops/bench/loadgen/).",
        ),
    ),
    **_scale("pending_jobs", min=0, max=1_000_000, help="Jobs kept pending through each step."),
    **_scale(
        "heartbeat_interval_s",
        info=quiet_option(
            min=0.3,
            max=10.0,
            help="A fixed heartbeat interval, seconds (deadline 1.5x, self-fence 3.5x, dead-after 5x; "
            "below 0.3 s the dead-after leaves the agents no self-fence longer than the interval); "
            "default: the cluster chooses it as it grows, as anywhere.",
        ),
        kind=float | None,
    ),
    **_scale("kills", min=0, max=100, help="Workers killed per step."),
    **JSON_AND_PNG,
    **_state_dir("bench clusters", "scale"),
    **_insecure(SETTINGS),
}


@bench_app.command("scale")
@with_options(SCALE_OPTIONS)
def bench_scale(options: Options) -> None:
    """Heartbeats recorded per second, their acknowledgement latency, control-plane and database
    CPU per 1,000 heartbeats, false deaths, elections, placer round times with a long queue and
    the time until a killed worker's jobs run elsewhere, for each worker count, on a fresh
    cluster each; with a PNG of how each grows per doubling. Exits 1 on a false death."""
    from ops.bench import scale, scale_report
    from runtime.errors import InvalidArgument

    try:
        counts = scale_report.parse_workers(options["workers"])
    except InvalidArgument as exc:
        fail(str(exc), EXIT_INVALID)
    out = _json_out(options["json_path"], "scale")
    settings = _settings(ScaleSettings, SCALE_OPTIONS, options, workers=counts)
    run = _under_trio(scale.run_scale)
    _show_and_save(scale_report, _run_bench("scale", run, settings, options["state_dir"]), out)


def _whole_numbers(option: str, text: str, top: int) -> tuple[int, ...]:
    """The whole numbers ``text`` lists, comma-separated (empty items skipped); exits 2 naming
    ``option`` when it lists none or one outside 1..``top``."""
    try:
        counts = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        counts = ()
    if not counts or any(not 1 <= v <= top for v in counts):
        fail(f"{option} must list whole numbers from 1 to {top}, comma-separated, got {text!r}", EXIT_INVALID)
    return counts


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


def _run_and_show(
    name: str,
    results: ModuleType,
    run: Callable[[SettingsT, Path, Callable[[str], None]], Any],
    settings: SettingsT,
    options: Options,
) -> None:
    """Run ``stockade bench <name>`` (:func:`_run_bench`; ``--state-dir``), print its result as
    ``results.render`` does and save ``result.to_json()`` where ``--json`` says (:func:`_json_out`);
    exits 1 when the result is not ok."""
    out = _json_out(options["json_path"], name)
    result = _run_bench(name, run, settings, options["state_dir"])
    console().print(results.render(result))
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
