"""The ``stockade`` command: run a control plane or an agent, drive the local cluster, use it.

Process commands run in the foreground: ``cp`` (one control-plane replica) and ``agent``
(one worker). Cluster commands manage the background processes of ``.stockade/``: ``up``,
``down``, ``kill-leader``, ``kill-worker``. Client commands talk to the control planes
through the failover client: ``jobs``, ``submit``, ``job``, ``list``, ``cancel``, ``status``.

Client commands find the control planes in ``--control-planes host:port,...``, else in
``$STOCKADE_CONTROL_PLANES``, else in ``.stockade/cluster.json``. Errors print one line
(``error: ...``) and exit with 2 for invalid input (bad value, unknown job) or 1 when the
cluster cannot be reached or the command cannot be carried out.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import os
import random
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import attrs
import rich.box
import trio
import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from actors import validation
from ops import rpc
from ops.cluster import (
    CONTROL_PLANES_ENV,
    ClusterConfig,
    ClusterError,
    LocalCluster,
    StateDir,
    UpResult,
    default_state_dir,
    parse_addresses,
    resolve_addresses,
)
from ops.pg import EmbeddedPostgresError
from protocol import pb
from runtime import identifiers
from runtime.client import ControlPlaneClient, new_idempotency_key
from runtime.errors import (
    ClusterBusy,
    IdempotencyConflict,
    InvalidArgument,
    NotFound,
    RemoteError,
    StockadeError,
    TemporaryError,
    Unavailable,
)
from runtime.priority import DEFAULT_NICE, check_nice
from runtime.settings import (
    MAX_JOB_NICE,
    MIN_JOB_NICE,
    PLACEMENT_POLICIES,
    AgentSettings,
    IngestSettings,
    LeaseSettings,
    PlacerSettings,
    ReconcilerSettings,
)
from runtime.text import Tail, cut_line, head_bytes, tail_lines

if TYPE_CHECKING:
    from ops.checker import FaultEvent

__all__ = ["app", "main"]

EXIT_UNAVAILABLE = 1
"""Exit status when the cluster cannot be reached or the command cannot be carried out."""
EXIT_INVALID = 2
"""Exit status for invalid input (a value out of range, an unknown job)."""
EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C or SIGTERM (128 + SIGINT, the shell's convention)."""
EXIT_TOO_LATE = 3
"""Exit status of ``stockade cancel`` when the job had ended on its own before the cancel
took effect (its end stands)."""

OUTPUT_TAIL_LINES = 50
"""Lines of a job's stdout and stderr that ``stockade job`` shows: the last ones of the file's
last :data:`runtime.text.TAIL_MAX_BYTES`, each cut to :data:`runtime.text.LINE_MAX_BYTES`."""

JOB_CPU_MILLIS = (250, 500, 1000, 2000, 4000)
JOB_MEMORY_MB = (128, 256, 512, 1024, 4096)
JOB_SLEEP_S = (2.0, 10.0)
"""The sizes and durations ``stockade jobs`` draws from."""

JOB_STATES = validation.JOB_STATES

_INGEST = IngestSettings()
_LEASE = LeaseSettings()
_PLACER = PlacerSettings()
_RECONCILER = ReconcilerSettings()


def _agent_default(name: str) -> float:
    """An AgentSettings field's default (the option defaults come from the settings classes)."""
    default = getattr(attrs.fields(AgentSettings), name).default
    assert isinstance(default, float)
    return default


def _agent_int_default(name: str) -> int:
    """An integer AgentSettings field's default."""
    default = getattr(attrs.fields(AgentSettings), name).default
    assert isinstance(default, int)
    return default


app = typer.Typer(
    name="stockade",
    help="Stockade: a cluster scheduler whose leaders can crash and freeze without placing "
    "or running a job twice.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"stockade {importlib.metadata.version('stockade')}\n")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the installed version and exit."
        ),
    ] = False,
) -> None:
    """Stockade: a cluster scheduler whose leaders can crash and freeze without placing or
    running a job twice."""


_PIPED_WIDTH = 120
"""Columns of output written to a pipe or file (rich would assume 80) unless $COLUMNS says."""


def _console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, highlight=False, width=_PIPED_WIDTH if piped else None)


console = _console()
err_console = _console(stderr=True)

ControlPlanesOption = Annotated[
    str | None,
    typer.Option(
        "--control-planes",
        help=f"Control-plane addresses, host:port,... (default: ${CONTROL_PLANES_ENV}, "
        "else .stockade/cluster.json).",
        show_default=False,
    ),
]


# ---------------------------------------------------------------------------- helpers


def _fail(message: str, code: int = EXIT_UNAVAILABLE) -> NoReturn:
    err_console.print(f"error: {message}", markup=False, soft_wrap=True)
    raise typer.Exit(code)


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Turn Stockade's errors into one line on stderr and an exit status; no traceback."""
    try:
        yield
    except (InvalidArgument, NotFound, IdempotencyConflict) as exc:
        _fail(str(exc), EXIT_INVALID)
    except ClusterBusy as exc:
        _fail(
            f"the cluster is too busy to take this now: every control plane answered 'busy' "
            f"for {rpc.DEFAULT_BUSY_RETRY_S:g} s (what they refused was not stored); try again later. "
            f"Details: {exc}",
            EXIT_UNAVAILABLE,
        )
    except (Unavailable, RemoteError, ClusterError, EmbeddedPostgresError) as exc:
        _fail(str(exc), EXIT_UNAVAILABLE)


def _interrupted(exc: BaseException) -> bool:
    """True when ``exc`` is a KeyboardInterrupt, also inside trio's exception groups."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    return isinstance(exc, BaseExceptionGroup) and any(_interrupted(e) for e in exc.exceptions)


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """For commands that start processes of their own (chaos, the benchmarks): SIGTERM stops
    them as Ctrl-C does, so their clean-up (stopping the cluster they started) runs; either
    ends with one line and exit status 130 instead of a traceback."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(os.getpid(), signal.SIGINT))
    try:
        yield
    except BaseException as exc:
        if not _interrupted(exc):
            raise
        err_console.print("interrupted: what this command started has been stopped")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _state() -> StateDir:
    return StateDir(default_state_dir())


def _addresses(option: str | None) -> list[str]:
    return resolve_addresses(option, _state())


def _shown_path(path: Path) -> str:
    """``path`` relative to the current directory when it lies below it, else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _time(unix_s: float) -> str:
    if not unix_s:
        return "-"
    return datetime.fromtimestamp(unix_s).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _bar(used: int, total: int, unit: str, width: int = 14) -> Text:
    fraction = min(1.0, used / total) if total > 0 else 0.0
    filled = round(fraction * width)
    colour = "green" if fraction < 0.7 else ("yellow" if fraction < 0.9 else "red")
    text = Text()
    text.append("█" * filled, style=colour)
    text.append("░" * (width - filled), style="grey50")
    text.append(f" {used}/{total}{unit}")
    return text


def _job_ids(ids: list[int], limit: int = 10) -> str:
    shown = " ".join(str(i) for i in ids[:limit])
    if len(ids) > limit:
        shown += f" +{len(ids) - limit} more"
    return shown or "-"


def _counts(status: pb.StatusReply) -> dict[str, int]:
    counts = dict.fromkeys(JOB_STATES, 0)
    for item in status.jobs:
        counts[item.state] = int(item.count)
    return counts


def status_json(status: pb.StatusReply) -> dict[str, Any]:
    """The stable JSON shape of ``stockade status --json``.

    Keys: ``leader`` (id or null), ``epoch``, ``control_planes`` ({id, address, role}),
    ``workers`` ({id, state, cpu_millis, memory_mb, cpu_allocated_millis,
    memory_allocated_mb, jobs}), ``jobs`` (counts keyed by state) and ``unschedulable``
    ({job_id, reason}).
    """
    return {
        "leader": status.leader or None,
        "epoch": int(status.epoch),
        "control_planes": [
            {"id": cp.id, "address": cp.address, "role": cp.role} for cp in status.control_planes
        ],
        "workers": [
            {
                "id": w.id,
                "state": w.state,
                "cpu_millis": int(w.cpu_millis),
                "memory_mb": int(w.memory_mb),
                "cpu_allocated_millis": int(w.cpu_allocated_millis),
                "memory_allocated_mb": int(w.memory_allocated_mb),
                "jobs": [int(j) for j in w.job_ids],
            }
            for w in status.workers
        ],
        "jobs": _counts(status),
        "unschedulable": [{"job_id": int(j.job_id), "reason": j.reason} for j in status.unschedulable],
    }


def render_status(status: pb.StatusReply) -> Group:
    """The status view: leader, control planes, workers with bars, job counts, unschedulable."""
    parts: list[Any] = []
    if status.leader:
        parts.append(
            Text.assemble(
                ("leader ", "bold"),
                (status.leader, "bold green"),
                f"  epoch {status.epoch}  (answered by {status.answered_by})",
            )
        )
    else:
        parts.append(
            Text.assemble(
                ("no leader", "bold red"), f"  last epoch {status.epoch}  (answered by {status.answered_by})"
            )
        )

    cps = Table(box=rich.box.SIMPLE_HEAD, title="control planes", title_justify="left")
    for column in ("id", "address", "role"):
        cps.add_column(column)
    role_style = {"leader": "bold green", "standby": "", "down": "red"}
    for cp in status.control_planes:
        cps.add_row(cp.id, cp.address, Text(cp.role, style=role_style.get(cp.role, "")))
    parts.append(cps)

    workers = Table(box=rich.box.SIMPLE_HEAD, title="workers", title_justify="left")
    for column in ("id", "state", "cpu (millis)", "memory (MiB)", "jobs"):
        workers.add_column(column)
    for w in status.workers:
        workers.add_row(
            w.id,
            Text(w.state, style={"alive": "green", "left": "yellow"}.get(w.state, "red")),
            _bar(int(w.cpu_allocated_millis), int(w.cpu_millis), ""),
            _bar(int(w.memory_allocated_mb), int(w.memory_mb), ""),
            _job_ids([int(j) for j in w.job_ids]),
        )
    parts.append(workers)

    counts = _counts(status)
    parts.append(Text("jobs  " + "  ".join(f"{state} {counts[state]}" for state in JOB_STATES)))
    if status.unschedulable:
        stuck = Table(box=rich.box.SIMPLE_HEAD, title="unschedulable", title_justify="left")
        stuck.add_column("job")
        stuck.add_column("reason")
        for job in status.unschedulable:
            stuck.add_row(str(job.job_id), Text(job.reason))
        parts.append(stuck)
    return Group(*parts)


def _runtime_text(spec: pb.JobSpec | None) -> str:
    if spec is None:
        return "-"
    if spec.command is not None:
        return "command: " + shlex.join(spec.command.argv)
    if spec.sleep is not None:
        return f"sleep {spec.sleep.duration_ms / 1000:g} s"
    return "-"


def _tail_extent(tail: Tail) -> str:
    """What part of a file ``tail`` shows, e.g. ``last 50 lines of the last 64 KiB of 200.0 MiB``."""
    shown = f"last {len(tail.lines)} line{'' if len(tail.lines) == 1 else 's'}"
    if tail.whole:
        return shown
    return f"{shown} of the last {tail.read_bytes // 1024} KiB of {tail.size_bytes / 2**20:.1f} MiB"


IdempotencyKeyOption = Annotated[
    str | None,
    typer.Option(
        help="The call's idempotency key (1-128 bytes; default: a fresh random UUID). The "
        "same command run again with the same key is answered with the first run's answer and "
        "changes nothing, for 24 h; the same key with another request is refused.",
        show_default=False,
    ),
]


def _idempotency_key(option: str | None) -> str:
    """The key a mutating command sends: the one given, checked, or a fresh one.

    Raises:
        InvalidArgument: the given key is empty, too long or holds a control character.
    """
    return new_idempotency_key() if option is None else validation.check_idempotency_key(option)


@contextlib.contextmanager
def _answer_unknown(key: str, what: str) -> Iterator[None]:
    """When a mutating call ends without an answer, say how to learn what became of it: a
    replica may have carried it out and failed to answer, and the same key returns that answer
    instead of carrying it out twice."""
    try:
        yield
    except Unavailable as exc:
        raise type(exc)(
            f"{exc}. If a control plane {what} before it failed to answer, the same command with "
            f"--idempotency-key {key} returns that answer instead of doing it twice"
        ) from exc


def batch_keys(key: str, batches: int) -> list[str]:
    """The idempotency key of each batch of one submission: ``key`` itself for one batch,
    ``key/1``, ``key/2``, ... for more (so running the command again sends the same ones).

    Raises:
        InvalidArgument: a derived key would be longer than the limit.
    """
    if batches == 1:
        return [key]
    return [validation.check_idempotency_key(f"{key}/{n}") for n in range(1, batches + 1)]


def _submit(addresses: list[str], specs: list[pb.JobSpec], *, key: str) -> list[int]:
    async def body(client: ControlPlaneClient) -> list[int]:
        if len(specs) == 1:
            reply = await client.call("submit_job", pb.SubmitJobRequest(spec=specs[0], idempotency_key=key))
            return [int(reply.job_id)]
        ids: list[int] = []
        starts = range(0, len(specs), validation.MAX_BATCH_JOBS)
        for start, batch_key in zip(starts, batch_keys(key, len(starts)), strict=True):
            batch = specs[start : start + validation.MAX_BATCH_JOBS]
            replies = await client.call(
                "submit_jobs", pb.SubmitJobsRequest(specs=batch, idempotency_key=batch_key)
            )
            ids.extend(int(i) for i in replies.job_ids)
        return ids

    with _answer_unknown(key, "stored the jobs" if len(specs) > 1 else "stored the job"):
        return rpc.with_client(addresses, body)


def _check_spec(spec: pb.JobSpec) -> None:
    """The control plane's own checks, run here first: out-of-range numbers do not fit the wire.

    Raises:
        InvalidArgument: the same message the control plane would give.
    """
    validation.check_job(
        name=spec.name,
        cpu_millis=spec.cpu_millis,
        memory_mb=spec.memory_mb,
        priority=spec.priority,
        sleep_ms=spec.sleep.duration_ms if spec.sleep is not None else None,
        argv=list(spec.command.argv) if spec.command is not None else None,
    )


# ---------------------------------------------------------------------------- processes


NiceOption = Annotated[
    int,
    typer.Option(
        help="CPU priority (nice, -20..19) this process asks for at start, so other work on the "
        "machine cannot starve its heartbeats; without CAP_SYS_NICE it keeps its own and says so."
    ),
]


@app.command("cp")
def control_plane(
    cp_id: Annotated[str, typer.Option("--id", help="This replica's id, e.g. cp-1.")],
    port: Annotated[int, typer.Option(help="gRPC port of the ControlPlane service (0: a free one).")] = 0,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    database_url: Annotated[
        str | None,
        typer.Option(
            envvar="DATABASE_URL", show_default=False, help="PostgreSQL URL of the shared database."
        ),
    ] = None,
    lease_ttl_s: Annotated[float, typer.Option(help="Lease time to live, seconds.")] = _LEASE.lease_ttl_s,
    max_main_loop_stall_s: Annotated[
        float,
        typer.Option(
            help="Step down (and take no lease) while the main loop, where decisions are made, "
            "has not run for this long, seconds."
        ),
    ] = _LEASE.max_main_loop_stall_s,
    round_interval_s: Annotated[
        float, typer.Option(help="Placer round interval, seconds.")
    ] = _PLACER.round_interval_s,
    reconcile_interval_s: Annotated[
        float, typer.Option(help="Reconcile pass interval, seconds.")
    ] = _RECONCILER.reconcile_interval_s,
    dead_after_s: Annotated[
        float, typer.Option(help="A worker silent this long is declared dead, seconds.")
    ] = _RECONCILER.dead_after_s,
    policy: Annotated[
        str, typer.Option(help=f"Placement policy: {', '.join(PLACEMENT_POLICIES)}.")
    ] = _PLACER.policy,
    max_reservations: Annotated[
        int,
        typer.Option(
            help="Workers a placer round may keep free for jobs that fit no free room yet (0: none)."
        ),
    ] = _PLACER.max_reservations,
    reserve_after_s: Annotated[
        float, typer.Option(help="Only a job queued this long may reserve a worker, seconds.")
    ] = _PLACER.reserve_after_s,
    ingest_pool_size: Annotated[
        int, typer.Option(help="Database connections of the ControlPlane service.")
    ] = _INGEST.pool_size,
    liveness_reserved_connections: Annotated[
        int,
        typer.Option(help="Of those, connections only heartbeats and registrations may use."),
    ] = _INGEST.liveness_reserved_connections,
    shed_lag_s: Annotated[
        float,
        typer.Option(
            help="Answer new work 'busy' while the service's event loop lags more than this, seconds."
        ),
    ] = _INGEST.shed_lag_s,
    max_requests_in_progress: Annotated[
        int,
        typer.Option(
            help="Requests other than heartbeats and registrations served at once, from admission "
            "until their reply is encoded; the rest wait their turn."
        ),
    ] = _INGEST.max_requests_in_progress,
    max_waiting_requests: Annotated[
        int,
        typer.Option(help="Answer new work 'busy' when this many requests already wait for their turn."),
    ] = _INGEST.max_waiting_requests,
    max_admission_wait_s: Annotated[
        float,
        typer.Option(help="Answer new work 'busy' that has waited this long for its turn, seconds."),
    ] = _INGEST.max_admission_wait_s,
    max_wire_work_share: Annotated[
        float,
        typer.Option(
            help="Most of the service's event-loop time that encoding and decoding large messages "
            "may take, a fraction (0.25: a quarter)."
        ),
    ] = _INGEST.max_wire_work_share,
    wire_step_messages: Annotated[
        int,
        typer.Option(
            help="Elements of a large reply encoded (or request decoded) between two yields to the "
            "service's event loop."
        ),
    ] = _INGEST.wire_step_messages,
    max_pending_jobs: Annotated[
        int,
        typer.Option(
            help="Answer submissions 'busy' while this many jobs are pending (0: no limit); "
            "a batch that arrives under the limit is taken whole."
        ),
    ] = _INGEST.max_pending_jobs,
    idempotency_key_retention_s: Annotated[
        float,
        typer.Option(
            help="Keep a mutating call's idempotency key and answer this long after its first use, "
            "seconds: a retry within it gets the first answer, a copy after it is a new call."
        ),
    ] = _INGEST.idempotency_key_retention_s,
    initial_window: Annotated[
        int,
        typer.Option(
            help="Unconfirmed assignments a worker may hold before a heartbeat confirmed any; "
            "one more per confirmed assignment."
        ),
    ] = _PLACER.initial_window,
    max_unconfirmed_per_worker: Annotated[
        int, typer.Option(help="Most unconfirmed assignments a worker may hold (the window's ceiling).")
    ] = _PLACER.max_unconfirmed_per_worker,
    requeue_backoff_base_s: Annotated[
        float,
        typer.Option(
            help="A job lost with its worker waits a random time below this before it is placed "
            "again, doubling with every further loss, seconds."
        ),
    ] = _RECONCILER.requeue_backoff_base_s,
    requeue_backoff_max_s: Annotated[
        float, typer.Option(help="Largest bound of the requeue backoff, seconds.")
    ] = _RECONCILER.requeue_backoff_max_s,
    death_burst: Annotated[
        int, typer.Option(help="Most workers declared dead at once.")
    ] = _RECONCILER.death_burst,
    deaths_per_s: Annotated[
        float, typer.Option(help="Dead-worker declarations per second beyond the burst.")
    ] = _RECONCILER.deaths_per_s,
    mass_silence_fraction: Annotated[
        float,
        typer.Option(
            help="Declare no worker dead while more than this fraction of the alive workers "
            "(and at least 3) are silent at once."
        ),
    ] = _RECONCILER.mass_silence_fraction,
    metrics_port: Annotated[
        int, typer.Option(help="Serve Prometheus metrics on 127.0.0.1:PORT/metrics (0: off).")
    ] = 0,
    json_logs: Annotated[bool, typer.Option(help="Log JSON lines instead of console lines.")] = False,
    nice: NiceOption = DEFAULT_NICE,
) -> None:
    """Run one control-plane replica in the foreground until SIGTERM or Ctrl-C."""
    # Imported here: the client commands need neither the actors nor the agent.
    from actors.control_plane import main as control_plane_main
    from runtime.settings import (
        MAX_STATEMENTS_PER_FENCED_WRITE,
        ControlPlaneSettings,
        IngestSettings,
        LeaseSettings,
        LedgerSettings,
        PlacerSettings,
        ReconcilerSettings,
    )

    if not database_url:
        _fail("--database-url or DATABASE_URL is required", EXIT_INVALID)
    step_down_margin_s = min(0.4, lease_ttl_s / 5)
    with _errors():
        settings = ControlPlaneSettings(
            cp_id=cp_id,
            database_url=database_url,
            listen_host=host,
            listen_port=port,
            ingest=IngestSettings(
                pool_size=ingest_pool_size,
                liveness_reserved_connections=liveness_reserved_connections,
                shed_lag_s=shed_lag_s,
                max_requests_in_progress=max_requests_in_progress,
                max_waiting_requests=max_waiting_requests,
                max_admission_wait_s=max_admission_wait_s,
                max_wire_work_share=max_wire_work_share,
                wire_step_messages=wire_step_messages,
                max_pending_jobs=max_pending_jobs,
                idempotency_key_retention_s=idempotency_key_retention_s,
            ),
            lease=LeaseSettings(
                lease_ttl_s=lease_ttl_s,
                renew_interval_s=lease_ttl_s / 4,
                step_down_margin_s=step_down_margin_s,
                takeover_poll_s=min(_LEASE.takeover_poll_s, lease_ttl_s / 8),
                max_main_loop_stall_s=max_main_loop_stall_s,
            ),
            # A shorter lease has a smaller step-down margin, which a fenced write's longest
            # hold must fit in (see ControlPlaneSettings): its statements get less time.
            ledger=LedgerSettings(
                statement_timeout_s=min(
                    LedgerSettings().statement_timeout_s, step_down_margin_s / MAX_STATEMENTS_PER_FENCED_WRITE
                )
            ),
            placer=PlacerSettings(
                round_interval_s=round_interval_s,
                policy=policy,
                max_reservations=max_reservations,
                reserve_after_s=reserve_after_s,
                initial_window=initial_window,
                max_unconfirmed_per_worker=max_unconfirmed_per_worker,
            ),
            reconciler=ReconcilerSettings(
                reconcile_interval_s=reconcile_interval_s,
                dead_after_s=dead_after_s,
                requeue_backoff_base_s=requeue_backoff_base_s,
                requeue_backoff_max_s=requeue_backoff_max_s,
                death_burst=death_burst,
                deaths_per_s=deaths_per_s,
                mass_silence_fraction=mass_silence_fraction,
            ),
        )
        check_nice(nice)
    control_plane_main(settings, json_logs=json_logs, metrics_port=metrics_port or None, nice=nice)


HeartbeatIntervalOption = Annotated[float, typer.Option(help="Time between heartbeats, seconds.")]
HeartbeatTimeoutOption = Annotated[
    float,
    typer.Option(
        help="Send a heartbeat (or registration) to the next control plane too after this long "
        "without an answer, seconds (the first may still answer until shortly before the fence deadline)."
    ),
]
SelfFenceOption = Annotated[
    float, typer.Option(help="Stop every job after this long without an acknowledged heartbeat, seconds.")
]
LeaveTimeoutOption = Annotated[
    float,
    typer.Option(
        help="At a clean stop, once every job has ended, wait this long for a control plane to record "
        "that the worker left, seconds (past it the worker is declared dead after dead_after instead)."
    ),
]
JsonLogsOption = Annotated[bool, typer.Option(help="Log JSON lines instead of console lines.")]
MaxConcurrentStartsOption = Annotated[
    int,
    typer.Option(
        help="Most command jobs of this process starting at once (from their reaper's fork until the "
        "job has exec'd); the others wait, holding their capacity."
    ),
]
JobNiceOption = Annotated[
    int,
    typer.Option(
        help=f"Run command jobs this much lower in CPU priority than the agent (nice, "
        f"{MIN_JOB_NICE}..{MAX_JOB_NICE}; 0: the agent's priority)."
    ),
]
MetricsPortOption = Annotated[
    int, typer.Option(help="Serve Prometheus metrics on 127.0.0.1:PORT/metrics (0: off).")
]


@app.command("agent")
def agent(
    worker_id: Annotated[str, typer.Option("--id", help="This worker's id, e.g. w-1.")],
    cpu_millis: Annotated[int, typer.Option(help="CPU offered, millicores (1000 = one core).")],
    memory_mb: Annotated[int, typer.Option(help="Memory offered, MiB.")],
    control_planes: Annotated[str, typer.Option(help="Control-plane addresses, host:port,...")],
    work_dir: Annotated[Path, typer.Option(help="Folder for agent.jsonl and the jobs' output.")],
    port: Annotated[int, typer.Option(help="gRPC port of the Worker service (0: a free one).")] = 0,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    advertise_address: Annotated[
        str, typer.Option(help="host:port the leader should call (default: the listen address).")
    ] = "",
    heartbeat_interval_s: HeartbeatIntervalOption = _agent_default("heartbeat_interval_s"),
    heartbeat_timeout_s: HeartbeatTimeoutOption = _agent_default("heartbeat_timeout_s"),
    self_fence_after_s: SelfFenceOption = _agent_default("self_fence_after_s"),
    leave_timeout_s: LeaveTimeoutOption = _agent_default("leave_timeout_s"),
    max_concurrent_starts: MaxConcurrentStartsOption = _agent_int_default("max_concurrent_starts"),
    job_nice: JobNiceOption = _agent_int_default("job_nice"),
    metrics_port: MetricsPortOption = 0,
    json_logs: JsonLogsOption = False,
    nice: NiceOption = DEFAULT_NICE,
) -> None:
    """Run one worker agent in the foreground until SIGTERM or Ctrl-C."""
    from agent.main import main as agent_main
    from runtime.settings import AgentSettings

    with _errors():
        settings = AgentSettings(
            worker_id=worker_id,
            control_planes=parse_addresses(control_planes),
            cpu_millis=cpu_millis,
            memory_mb=memory_mb,
            work_dir=str(work_dir.absolute()),
            listen_host=host,
            listen_port=port,
            advertise_address=advertise_address,
            heartbeat_interval_s=heartbeat_interval_s,
            heartbeat_timeout_s=heartbeat_timeout_s,
            self_fence_after_s=self_fence_after_s,
            leave_timeout_s=leave_timeout_s,
            max_concurrent_starts=max_concurrent_starts,
            job_nice=job_nice,
        )
    with _errors():
        check_nice(nice)
    agent_main(settings, json_logs=json_logs, metrics_port=metrics_port or None, nice=nice)


@app.command("fleet")
def fleet(
    spec: Annotated[
        Path,
        typer.Option(
            help='JSON list of the workers to host: [{"id": "w-1", "port": 7201, "cpu_millis": 8000, '
            '"memory_mb": 16384, "work_dir": "...", "advertise_address": ""}, ...].'
        ),
    ],
    control_planes: Annotated[
        str, typer.Option(help="Control-plane addresses, host:port,... (a worker's own list wins).")
    ] = "",
    fleet_id: Annotated[
        str, typer.Option("--id", help="This process's id, bound to its log lines.")
    ] = "fleet",
    host: Annotated[str, typer.Option(help="Address every worker listens on.")] = "127.0.0.1",
    heartbeat_interval_s: HeartbeatIntervalOption = _agent_default("heartbeat_interval_s"),
    heartbeat_timeout_s: HeartbeatTimeoutOption = _agent_default("heartbeat_timeout_s"),
    self_fence_after_s: SelfFenceOption = _agent_default("self_fence_after_s"),
    leave_timeout_s: LeaveTimeoutOption = _agent_default("leave_timeout_s"),
    max_concurrent_starts: MaxConcurrentStartsOption = _agent_int_default("max_concurrent_starts"),
    job_nice: JobNiceOption = _agent_int_default("job_nice"),
    metrics_port: MetricsPortOption = 0,
    json_logs: JsonLogsOption = False,
    nice: NiceOption = DEFAULT_NICE,
) -> None:
    """Run many workers' agents in one process until SIGTERM or Ctrl-C.

    Each worker keeps its own id, port, registration, heartbeats, work dir and agent.jsonl.
    When one worker's agent fails (its port is taken, ...) every worker's jobs are stopped
    and the command exits 1 naming the worker; a bad spec exits 2.
    """
    from agent.fleet import WorkerFailed, fleet_settings, load_fleet_spec
    from agent.fleet import main as fleet_main

    with _errors():
        identifiers.check_id(fleet_id, field="fleet_id")
        settings = fleet_settings(
            load_fleet_spec(spec),
            control_planes=parse_addresses(control_planes),
            listen_host=host,
            heartbeat_interval_s=heartbeat_interval_s,
            heartbeat_timeout_s=heartbeat_timeout_s,
            self_fence_after_s=self_fence_after_s,
            leave_timeout_s=leave_timeout_s,
            max_concurrent_starts=max_concurrent_starts,
            job_nice=job_nice,
        )
        check_nice(nice)
    try:
        fleet_main(
            settings, fleet_id=fleet_id, json_logs=json_logs, metrics_port=metrics_port or None, nice=nice
        )
    except WorkerFailed as exc:
        _fail(f"{fleet_id}: {exc}")


# ---------------------------------------------------------------------------- the local cluster


def _print_up(result: UpResult, cluster: LocalCluster) -> None:
    roles = {cp.id: cp.role for cp in result.status.control_planes}
    workers = {w.id: w for w in result.status.workers}
    table = Table(box=rich.box.SIMPLE_HEAD, title="processes", title_justify="left", padding=(0, 1))
    for column in ("id", "pid", "address", "state", "capacity", ""):
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
        table.add_row(spec.id, str(result.pids.get(spec.id, "-")), spec.address or "-", state, capacity, note)
    for hosted_worker in result.config.hosted_workers:
        worker = workers.get(hosted_worker.id)
        table.add_row(
            hosted_worker.id,
            str(result.pids.get(hosted_worker.process_id, "-")),
            hosted_worker.address,
            worker.state if worker else "?",
            f"{worker.cpu_millis}m / {worker.memory_mb} MiB" if worker else "",
            f"in {hosted_worker.process_id}",
        )
    console.print(table)
    database = "embedded PostgreSQL" if result.config.embedded_pg_port else "DATABASE_URL"
    if result.database_started:
        database += " (started)"
    console.print(f"database  {database}: {result.config.database_url}")
    console.print(f"leader    {result.status.leader} at epoch {result.status.epoch}")
    console.print(f"logs      {_shown_path(cluster.state.root / 'logs')}/<id>.log")


@app.command("up")
def up(
    control_planes: Annotated[int, typer.Option(help="Number of control planes (cp-1..cp-N).")] = 3,
    workers: Annotated[int, typer.Option(help="Number of workers (w-1..w-M).")] = 5,
    fleet_size: Annotated[
        int,
        typer.Option(
            help="Host new workers this many per process (stockade fleet); 0: one agent process each."
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
        str,
        typer.Option(help="Extra options for new control planes, one string, e.g. '--dead-after-s 5'."),
    ] = "",
    timeout_s: Annotated[float, typer.Option(help="How long to wait for the cluster, seconds.")] = 60.0,
) -> None:
    """Start the local cluster in the background and wait for a leader and every worker.

    The state folder is ./.stockade (or $STOCKADE_STATE_DIR). PostgreSQL is DATABASE_URL
    when set, else an embedded server under .stockade/pg. Safe to run again: live processes
    are left alone, dead ones are started again. Processes are recorded with their options
    when first planned: --fleet-size, --agent-args and --cp-args apply to the processes this
    run adds (`stockade down` and removing .stockade/cluster.json start afresh).
    """
    if fleet_size < 0:
        _fail(f"fleet_size must be >= 0 (0: one process per worker), got {fleet_size}", EXIT_INVALID)
    cluster = LocalCluster(
        _state(), fleet_size=fleet_size, agent_args=shlex.split(agent_args), cp_args=shlex.split(cp_args)
    )
    with _errors(), console.status("starting the cluster..."):
        result = cluster.up(control_planes=control_planes, workers=workers, timeout_s=timeout_s)
    _print_up(result, cluster)


@app.command("down")
def down() -> None:
    """Stop every process of the local cluster (SIGTERM, SIGKILL after 10 s) and the embedded database."""
    cluster = LocalCluster(_state())
    with _errors():
        report = cluster.down()
    if report.terminated:
        console.print("stopped " + " ".join(report.terminated))
    if report.killed:
        console.print("killed (no exit 10 s after SIGTERM) " + " ".join(report.killed))
    if report.stragglers:
        console.print("killed stray processes " + " ".join(str(p) for p in report.stragglers))
    if report.database_stopped:
        console.print("stopped embedded PostgreSQL")
    if not (report.terminated or report.killed or report.stragglers or report.database_stopped):
        console.print("nothing was running")


@app.command("kill-leader")
def kill_leader(
    control_planes: ControlPlanesOption = None,
    wait: Annotated[bool, typer.Option(help="Wait for a new leader and print how long it took.")] = False,
    timeout_s: Annotated[float, typer.Option(help="How long --wait waits, seconds.")] = 30.0,
) -> None:
    """SIGKILL the current leader's process (a local cluster's; found through cluster.json)."""
    cluster = LocalCluster(_state())
    with _errors():
        addresses = _addresses(control_planes)
        status = rpc.status(addresses)
        if not status.leader:
            _fail(f"there is no leader right now (last epoch {status.epoch})")
        pid = cluster.kill(status.leader)
        killed_at = time.monotonic()
        console.print(f"killed leader {status.leader} (pid {pid}) at epoch {status.epoch}")
        if not wait:
            return
        old_epoch = int(status.epoch)

        async def body(client: ControlPlaneClient) -> pb.StatusReply | None:
            with trio.move_on_after(timeout_s):
                while True:
                    with contextlib.suppress(StockadeError):  # a replica dying mid-call: ask again
                        reply: pb.StatusReply = await client.call("status", pb.StatusRequest())
                        if reply.leader and reply.epoch > old_epoch:
                            return reply
                    await trio.sleep(0.05)
            return None

        new = rpc.with_client(addresses, body, timeout_s=0.5)
        elapsed_s = time.monotonic() - killed_at
        if new is None:
            _fail(f"no new leader {timeout_s:g} s after the kill")
        console.print(f"new leader {new.leader} at epoch {new.epoch}, {elapsed_s:.2f} s after the kill")


@app.command("kill-worker")
def kill_worker(
    control_planes: ControlPlanesOption = None,
    wait: Annotated[
        bool, typer.Option(help="Wait until its jobs run on other workers and print how long it took.")
    ] = False,
    timeout_s: Annotated[float, typer.Option(help="How long --wait waits, seconds.")] = 60.0,
) -> None:
    """SIGKILL the busiest live worker (most CPU allocated) of the local cluster."""
    cluster = LocalCluster(_state())
    with _errors():
        addresses = _addresses(control_planes)
        status = rpc.status(addresses)
        config = cluster.config()
        live = cluster.pids(config)
        candidates = [w for w in status.workers if w.state == "alive" and w.id in live]
        if not candidates:
            if config.fleets:
                fleets = ", ".join(f.id for f in config.fleets)
                _fail(
                    f"no live worker runs in a process of its own: the workers run in fleets ({fleets}); "
                    "killing a fleet kills all its workers"
                )
            _fail("no live worker of this cluster to kill")
        victim = max(candidates, key=lambda w: (w.cpu_allocated_millis, w.id))
        job_ids = [int(j) for j in victim.job_ids]
        pid = cluster.kill(victim.id)
        killed_at = time.monotonic()
        console.print(
            f"killed worker {victim.id} (pid {pid}) with {victim.cpu_allocated_millis} cpu_millis "
            f"allocated; its jobs: {' '.join(map(str, job_ids)) or 'none'}"
        )
        if not wait or not job_ids:
            return

        async def body(client: ControlPlaneClient) -> list[pb.JobInfo] | None:
            with trio.move_on_after(timeout_s):
                while True:
                    jobs = []
                    with contextlib.suppress(StockadeError):  # a replica dying mid-call: ask again
                        for job_id in job_ids:
                            jobs.append(await client.call("get_job", pb.GetJobRequest(job_id=job_id)))
                    if len(jobs) == len(job_ids) and all(_moved(j, victim.id) for j in jobs):
                        return jobs
                    await trio.sleep(0.1)
            return None

        moved = rpc.with_client(addresses, body, timeout_s=1.0)
        elapsed_s = time.monotonic() - killed_at
        if moved is None:
            _fail(f"the jobs of {victim.id} were not running elsewhere {timeout_s:g} s after the kill")
        where = ", ".join(f"{j.job_id} on {j.worker_id or '-'} ({j.state})" for j in moved)
        console.print(f"its jobs run elsewhere {elapsed_s:.2f} s after the kill: {where}")


def _moved(job: pb.JobInfo, dead_worker: str) -> bool:
    """Whether ``job`` no longer needs ``dead_worker``: running or ended on another worker,
    ended there before the kill, or cancelled."""
    if job.state in ("cancelled", "succeeded", "failed"):
        return True
    return job.worker_id != dead_worker and job.state == "running"


# ---------------------------------------------------------------------------- client commands


@app.command("jobs")
def jobs(
    count: Annotated[int, typer.Argument(help="How many sleep jobs to submit.")] = 12,
    seed: Annotated[int, typer.Option(help="Seed of the random sizes and durations.")] = 1,
    idempotency_key: IdempotencyKeyOption = None,
    control_planes: ControlPlanesOption = None,
) -> None:
    """Submit COUNT sleep jobs of mixed sizes (250-4000 cpu_millis, 128-4096 MiB) and durations (2-10 s)."""
    if count < 1:
        _fail(f"count must be >= 1, got {count}", EXIT_INVALID)
    rng = random.Random(seed)
    specs = []
    for index in range(1, count + 1):
        sleep_s = round(rng.uniform(*JOB_SLEEP_S), 1)
        specs.append(
            pb.JobSpec(
                name=f"sleep-{index}",
                cpu_millis=rng.choice(JOB_CPU_MILLIS),
                memory_mb=rng.choice(JOB_MEMORY_MB),
                sleep=pb.SleepRuntime(duration_ms=int(sleep_s * 1000)),
            )
        )
    with _errors():
        ids = _submit(_addresses(control_planes), specs, key=_idempotency_key(idempotency_key))
    table = Table(box=rich.box.SIMPLE_HEAD)
    for column in ("job", "name", "cpu_millis", "memory_mb", "sleep"):
        table.add_column(column, justify="right" if column != "name" else "left")
    for job_id, spec in zip(ids, specs, strict=True):
        assert spec.sleep is not None
        table.add_row(
            str(job_id),
            spec.name,
            str(spec.cpu_millis),
            str(spec.memory_mb),
            f"{spec.sleep.duration_ms / 1000:g} s",
        )
    console.print(table)
    console.print(f"submitted {len(ids)} jobs: {' '.join(map(str, ids))}")


@app.command(
    "submit",
    context_settings={"allow_interspersed_args": False},
)
def submit(
    cpu_millis: Annotated[int, typer.Option(help="CPU the job needs, millicores (1000 = one core).")],
    memory_mb: Annotated[int, typer.Option(help="Memory the job needs, MiB.")],
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The command to run on a worker (after --).", show_default=False),
    ] = None,
    sleep_s: Annotated[
        float | None, typer.Option(help="Submit a sleep job holding its resources this long, seconds.")
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(help="Job name [default: the command's basename, or sleep].", show_default=False),
    ] = None,
    priority: Annotated[int, typer.Option(help="Higher runs first; ties by submission order.")] = 0,
    idempotency_key: IdempotencyKeyOption = None,
    control_planes: ControlPlanesOption = None,
) -> None:
    """Submit one job, a command (stockade submit ... -- CMD ARGS...) or a sleep (--sleep-s); print its id."""
    if (sleep_s is None) == (not command):
        _fail("give exactly one of --sleep-s SECONDS or -- CMD ARGS...", EXIT_INVALID)
    spec = pb.JobSpec(cpu_millis=cpu_millis, memory_mb=memory_mb, priority=priority)
    if command:
        spec.command = pb.CommandRuntime(argv=list(command))
        default = head_bytes(os.path.basename(command[0]) or "command", validation.MAX_NAME_BYTES)
        spec.name = name if name is not None else default
    else:
        assert sleep_s is not None
        if not 0 <= sleep_s <= validation.MAX_SLEEP_MS / 1000:
            _fail(
                f"sleep_s must be between 0 and {validation.MAX_SLEEP_MS // 1000}, got {sleep_s!r}",
                EXIT_INVALID,
            )
        spec.sleep = pb.SleepRuntime(duration_ms=round(sleep_s * 1000))
        spec.name = name if name is not None else "sleep"
    with _errors():
        _check_spec(spec)
        (job_id,) = _submit(_addresses(control_planes), [spec], key=_idempotency_key(idempotency_key))
    console.print(job_id)


@app.command("job")
def job(
    job_id: Annotated[int, typer.Argument(help="The job's id.")],
    control_planes: ControlPlanesOption = None,
) -> None:
    """Show one job: state, worker, assignment, times, and its stdout/stderr when on this machine."""
    with _errors():
        validation.check_job_id(job_id)
        info: pb.JobInfo = rpc.call(_addresses(control_planes), "get_job", pb.GetJobRequest(job_id=job_id))
    spec = info.spec
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    duration = "-"
    if info.started_unix_s and info.finished_unix_s:
        duration = f"{info.finished_unix_s - info.started_unix_s:.2f} s"
    rows = [
        ("job", str(info.job_id)),
        ("name", spec.name if spec else "-"),
        ("state", info.state + (f" ({info.reason})" if info.reason else "")),
        ("runtime", cut_line(_runtime_text(spec))),
        ("cpu_millis", str(spec.cpu_millis) if spec else "-"),
        ("memory_mb", str(spec.memory_mb) if spec else "-"),
        ("priority", str(spec.priority) if spec else "-"),
        ("worker", info.worker_id or "-"),
        ("assignment", str(info.assignment_id or "-")),
        ("epoch", str(info.epoch or "-")),
        ("attempts", str(info.attempts)),
        ("exit code", str(info.exit_code) if info.has_exit_code else "-"),
        ("submitted", _time(info.submitted_unix_s)),
        ("started", _time(info.started_unix_s)),
        ("finished", _time(info.finished_unix_s)),
        ("duration", duration),
        ("stdout", _shown_path(Path(info.stdout_path)) if info.stdout_path else "-"),
        ("stderr", _shown_path(Path(info.stderr_path)) if info.stderr_path else "-"),
    ]
    for key, value in rows:
        table.add_row(key, Text(value))
    console.print(table)
    for label, path_text in (("stdout", info.stdout_path), ("stderr", info.stderr_path)):
        if not path_text:
            continue
        path = Path(path_text)
        if not path.is_file():
            console.print(f"({label} file {_shown_path(path)} is not on this machine)", style="dim")
            continue
        try:
            tail = tail_lines(path, max_lines=OUTPUT_TAIL_LINES)
        except OSError as exc:
            console.print(f"({label} file {_shown_path(path)} cannot be read: {exc.strerror})", style="dim")
            continue
        if not tail.lines:
            console.print(f"{label}: empty", style="dim")
            continue
        console.rule(f"{label} ({_tail_extent(tail)})", align="left", style="dim")
        for line in tail.lines:
            console.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command("list")
def list_jobs(
    state: Annotated[
        str | None,
        typer.Option(help=f"Only jobs in this state ({', '.join(JOB_STATES)}).", show_default=False),
    ] = None,
    limit: Annotated[
        int, typer.Option(help="At most this many jobs, newest first (0: 100, as the API counts it).")
    ] = 50,
    control_planes: ControlPlanesOption = None,
) -> None:
    """List jobs in a table."""
    with _errors():
        if limit < 0:
            raise InvalidArgument(
                "limit", limit, f"must be between 0 and {validation.MAX_LIST_LIMIT} (0: 100)"
            )
        validation.check_list(state or "", limit)
        reply = rpc.call(
            _addresses(control_planes), "list_jobs", pb.ListJobsRequest(state=state or "", limit=limit)
        )
    table = Table(box=rich.box.SIMPLE_HEAD, padding=(0, 1))
    table.add_column("job", justify="right", no_wrap=True)
    table.add_column("name", no_wrap=True, max_width=20)
    table.add_column("state", no_wrap=True)
    table.add_column("cpu", justify="right", no_wrap=True)
    table.add_column("MiB", justify="right", no_wrap=True)
    table.add_column("worker", no_wrap=True)
    table.add_column("tries", justify="right", no_wrap=True)
    table.add_column("exit", justify="right", no_wrap=True)
    table.add_column("runtime / reason", ratio=1)
    for info in reply.jobs:
        spec = info.spec
        detail = cut_line(_runtime_text(spec)) + (f"  ({info.reason})" if info.reason else "")
        table.add_row(
            str(info.job_id),
            Text(spec.name) if spec else "-",
            info.state,
            str(spec.cpu_millis) if spec else "-",
            str(spec.memory_mb) if spec else "-",
            info.worker_id or "-",
            str(info.attempts),
            str(info.exit_code) if info.has_exit_code else "-",
            Text(detail),
        )
    console.print(table)
    console.print(f"{len(reply.jobs)} job{'' if len(reply.jobs) == 1 else 's'}")


app.command("jobs-list", hidden=True)(list_jobs)


CANCEL_POLL_S = 0.2
"""How often ``stockade cancel`` asks for the job's state while it waits, in seconds."""


def cancel_verdict(job_id: int, job: pb.JobInfo) -> str:
    """What a cancel came to, from the job's state: cancelled, or ended on its own first (with
    the exit code when there is one), or still on its way (``cancelling``)."""
    exit_code = f", exit code {job.exit_code}" if job.has_exit_code else ""
    if job.state == "cancelled":
        return f"job {job_id}: cancelled"
    if job.state in ("succeeded", "failed"):
        return f"job {job_id}: {job.state} before the cancel took effect{exit_code}"
    return f"job {job_id}: cancelling (still {job.state})"


@app.command("cancel")
def cancel(
    job_id: Annotated[int, typer.Argument(help="The job's id.")],
    wait_s: Annotated[
        float,
        typer.Option(
            "--wait-s",
            min=0,
            help="Seconds to wait for a placed job to end, to say whether the cancel stopped it "
            "or it ended on its own first; 0 answers at once (cancelling).",
        ),
    ] = 10.0,
    idempotency_key: IdempotencyKeyOption = None,
    control_planes: ControlPlanesOption = None,
) -> None:
    """Cancel a job: at once while pending, through its worker once placed.

    Says what happened: ``cancelled``; or, when the job ended on its own before its worker
    got the cancel, its real end (``succeeded`` or ``failed``, with the exit code), which
    stands, and exits 3 (too late); or ``cancelling`` when ``--wait-s`` passed first.
    """

    async def body(client: ControlPlaneClient) -> pb.JobInfo | None:
        reply: pb.CancelJobReply = await client.call(
            "cancel_job", pb.CancelJobRequest(job_id=job_id, idempotency_key=key)
        )
        if reply.state != "cancelling":
            job: pb.JobInfo = await client.call("get_job", pb.GetJobRequest(job_id=job_id))
            return job
        with trio.move_on_after(wait_s):
            while True:
                with contextlib.suppress(TemporaryError):  # a replica failing over: ask again
                    job = await client.call("get_job", pb.GetJobRequest(job_id=job_id))
                    if job.state in ("cancelled", "succeeded", "failed"):
                        return job
                await trio.sleep(CANCEL_POLL_S)
        return None

    with _errors():
        validation.check_job_id(job_id)
        key = _idempotency_key(idempotency_key)
        with _answer_unknown(key, "recorded the cancel"):
            job = rpc.with_client(_addresses(control_planes), body)
    if job is None:
        console.print(f"job {job_id}: cancelling")
        return
    console.print(cancel_verdict(job_id, job))
    if job.state in ("succeeded", "failed"):
        raise typer.Exit(EXIT_TOO_LATE)


@app.command("status")
def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON with stable keys.")] = False,
    control_planes: ControlPlanesOption = None,
) -> None:
    """Show the leader and its epoch, the control planes, the workers with their load, the jobs."""
    with _errors():
        reply = rpc.status(_addresses(control_planes))
    if as_json:
        sys.stdout.write(json.dumps(status_json(reply), indent=2) + "\n")
        return
    console.print(render_status(reply))


# ---------------------------------------------------------------------------- chaos and check


def _check_table(rows: list[tuple[str, str, bool | None]]) -> Table:
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


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


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
    from ops.chaos import ChaosSettings, Harness

    if failovers < 0 or worker_kills < 0 or partitions < 0 or workers < 1 or rate <= 0 or partition_s <= 0:
        _fail(
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
    harness = Harness(settings=settings, cluster=cluster, progress=lambda line: err_console.print(line))
    try:
        with _interruptible(), _errors():
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
            f"{_seconds(data['failover_kill_p50_s'])} / {_seconds(data['failover_kill_max_s'])}",
            None,
        ),
        (
            "failover_freeze_p50_s / max",
            f"{_seconds(data['failover_freeze_p50_s'])} / {_seconds(data['failover_freeze_max_s'])}",
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
    console.print(_check_table(rows))
    for line in data["details"][:20]:
        console.print(f"  {line}", markup=False)
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
    from ops import checker
    from runtime.aio import asyncio_bridge

    state = StateDir(state_dir) if state_dir is not None else _state()
    with _errors():
        config = LocalCluster(state).config() if database_url is None or state.config_path.exists() else None
        manual = [checker.parse_fault(text) for text in fault or ()]
        if config is not None:
            manual = _faults_in_cluster(manual, config)
        url = database_url or (config.database_url if config is not None else None)
        if url is None:
            _fail("no database: pass --database-url or run in a cluster's folder", EXIT_INVALID)

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
        console.print(_check_table(rows))
        for line in data["details"][:20]:
            console.print(f"  {line}", markup=False)
    if not report.ok:
        raise typer.Exit(EXIT_UNAVAILABLE)


def _faults_in_cluster(faults: list[FaultEvent], config: ClusterConfig) -> list[FaultEvent]:
    """``faults`` checked against the cluster's ids, a fault of a fleet process also counted for
    every worker it hosts (they die with it).

    Raises:
        InvalidArgument: a fault names an id that is no process or worker of the cluster.
    """
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


bench_app = typer.Typer(help="Benchmarks that print measured numbers.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


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
    from ops.bench import FailoverBenchSettings, run_failover_bench

    if min(kills, freezes, stops, worker_kills) < 0:
        _fail("counts must be >= 0", EXIT_INVALID)
    cluster = LocalCluster(StateDir(state_dir or (default_state_dir() / "bench-failover")))
    settings = FailoverBenchSettings(kills=kills, freezes=freezes, stops=stops, worker_kills=worker_kills)
    try:
        with _interruptible(), _errors():
            figures = trio.run(run_failover_bench, settings, cluster, lambda line: err_console.print(line))
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
            _seconds(figures[f"{key}_p50_s"]),
            _seconds(figures[f"{key}_max_s"]),
        )
    console.print(table)
    if json_path is not None:
        json_path.write_text(json.dumps(figures, indent=2) + "\n")


@bench_app.command("pack")
def bench_pack(
    jobs: Annotated[int, typer.Option(help="Jobs in the stream.")] = 10_000,
    workers: Annotated[int, typer.Option(help="Workers (hosted in fleets).")] = 100,
    seed: Annotated[int, typer.Option(help="Seed of the job stream.")] = 1,
    policy: Annotated[
        str, typer.Option(help="Policies to compare, comma-separated (best_fit first is the baseline).")
    ] = ",".join(PLACEMENT_POLICIES),
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
    from ops import benchpack
    from ops.pg import EmbeddedPostgres, free_port
    from runtime import log as runtime_log

    policies = tuple(p.strip() for p in policy.split(",") if p.strip())
    if not policies or any(p not in benchpack.POLICIES for p in policies):
        _fail(f"policy must list some of {', '.join(benchpack.POLICIES)}, got {policy!r}", EXIT_INVALID)
    for option, value, low, high in (
        ("--jobs", jobs, 1, 1_000_000),
        ("--workers", workers, 1, 1_000),
        ("--burst-jobs", burst_jobs, 1, 1_000_000),
        ("--fleet-size", fleet_size, 0, 1_000),
    ):
        if not low <= value <= high:
            _fail(f"{option} must be between {low} and {high}, got {value}", EXIT_INVALID)
    if not (arrival_rate == 0 or 1 <= arrival_rate <= 100_000):
        _fail(
            f"--arrival-rate must be 0 (skip the arriving scenario) or between 1 and 100000 jobs/s, "
            f"got {arrival_rate}",
            EXIT_INVALID,
        )
    out = json_path or Path("bench-pack.json")
    if not out.parent.resolve().is_dir():
        _fail(f"--json: folder {out.parent} does not exist", EXIT_INVALID)
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
    progress = err_console.print
    results: list[dict[str, Any]] = []
    arriving: list[dict[str, Any]] = []
    burst_result: dict[str, Any] = {}
    scale_points: list[dict[str, Any]] = []
    with _interruptible(), _errors():
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
        console.print(
            f"burst: {burst_result['burst_started']} of {burst_result['burst_jobs']} jobs started in "
            f"{burst_result['burst_s']} s: burst_placements_per_s {burst_result['burst_placements_per_s']}"
        )
    for point in scale_points:
        console.print(
            f"scale: {point['pending']:>6} pending x {point['workers']:>4} workers: round p50 "
            f"{point['round_p50_ms']} ms, p99 {point['round_p99_ms']} ms, max {point['round_max_ms']} ms, "
            f"first (full read) {point['first_round_ms']} ms"
        )
    for line in benchpack.growth(scale_points):
        console.print(f"scale: {line}")
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
    console.print(f"wrote {out} and {picture}")
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
    from ops import benchoverload

    try:
        offered = tuple(float(r) for r in rates.split(","))
    except ValueError:
        _fail(f"--rates must be numbers (jobs/s) separated by commas, got {rates!r}", EXIT_INVALID)
    out = json_path or Path("bench-overload.json")
    if not out.parent.resolve().is_dir():
        _fail(f"--json: folder {out.parent} does not exist", EXIT_INVALID)
    with _interruptible(), _errors():
        settings = benchoverload.OverloadSettings(
            rates=offered, step_s=step_s, kind=kind, sleep_ms=sleep_ms, workers=workers
        )
        root = state_dir or (default_state_dir() / "bench-overload")
        result = trio.run(benchoverload.run_overload, settings, root, err_console.print)
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
    console.print(table)
    for line in benchoverload.summary(result):
        console.print(line)
    benchoverload.save(out, result)
    picture = out.with_suffix(".png")
    benchoverload.plot(result, picture)
    console.print(f"wrote {out} and {picture}")
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
    console.print(table)
    for result in results:
        if result.get("db_stalls"):
            stalls = ", ".join(f"{latency:g} s at {t:g} s" for t, latency in result["db_stalls"])
            console.print(f"{result['policy']}: database commits slower than 1 s: {stalls}")
    base = results[0]
    ratios: dict[str, dict[str, float | None]] = {}
    for other in results[1:]:
        ratio = {
            k: (round(base[k] / other[k], 3) if base.get(k) and other.get(k) else None)
            for k in ("cpu_use_waiting", "memory_use_waiting", "finished_s")
        }
        ratios[f"{base['policy']}/{other['policy']}"] = ratio
        console.print(
            f"{base['policy']} / {other['policy']}: " + ", ".join(f"{k} x{v}" for k, v in ratio.items())
        )
    return ratios


def main() -> None:
    """The console entry point (``stockade``)."""
    app()


if __name__ == "__main__":
    main()
