"""Process commands, run in the foreground until SIGTERM or Ctrl-C: ``cp`` (one control-plane
replica), ``agent`` (one worker), ``fleet`` (many workers in one process) and ``database`` (the
embedded PostgreSQL server: what a database container runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import attrs
import typer

from ops.cli.base import app
from ops.cli.common import EXIT_INVALID, errors, fail
from ops.config import default_state_dir, named_addresses
from runtime import identifiers
from runtime.errors import InvalidArgument
from runtime.identifiers import parse_labels
from runtime.oom import (
    DEFAULT_AGENT_OOM_SCORE_ADJ,
    MAX_OOM_SCORE_ADJ,
    MIN_JOB_OOM_SCORE_ADJ,
    check_oom_score_adj,
)
from runtime.priority import DEFAULT_NICE, check_nice
from runtime.settings import (
    JOB_RESOURCES_CHOICES,
    MAX_JOB_NICE,
    MAX_JOB_PIDS,
    MAX_OUTPUT_MB,
    MIN_JOB_NICE,
    MIN_JOB_PIDS,
    PLACEMENT_POLICIES,
    AgentSettings,
    DatabaseWatchSettings,
    IngestSettings,
    LeaseSettings,
    OutputSettings,
    PlacerSettings,
    ReconcilerSettings,
    fence_margin_refusal,
)
from runtime.tls import TlsFiles

_INGEST = IngestSettings()
_LEASE = LeaseSettings()
_PLACER = PlacerSettings()
_RECONCILER = ReconcilerSettings()
_WATCH = DatabaseWatchSettings()


def _agent_default(name: str) -> float:
    """An AgentSettings field's default (the option defaults come from the settings classes)."""
    default = getattr(attrs.fields(AgentSettings), name).default
    assert isinstance(default, float)
    return default


def _agent_str_default(name: str) -> str:
    """A string AgentSettings field's default."""
    default = getattr(attrs.fields(AgentSettings), name).default
    assert isinstance(default, str)
    return default


def _agent_int_default(name: str) -> int:
    """An integer AgentSettings field's default."""
    default = getattr(attrs.fields(AgentSettings), name).default
    assert isinstance(default, int)
    return default


CertsDirOption = Annotated[
    Path | None,
    typer.Option(
        "--certs-dir",
        show_default=False,
        help="Folder with the cluster CA's ca.crt and this process's <id>.crt and <id>.key "
        "(stockade certs issue). [default: the state folder's certs/]",
    ),
]
InsecureOption = Annotated[
    bool,
    typer.Option(
        "--insecure",
        help="Serve and call without TLS or identity checks, for development only (anyone who "
        "reaches the port may call it).",
    ),
]


def _cert_folder(certs_dir: Path | None, insecure: bool) -> Path | None:
    """The certificate folder a process uses; None with --insecure."""
    return None if insecure else (certs_dir or default_state_dir() / "certs").absolute()


def _check_tls_files(folder: Path | None, role: str, ids: list[str], what: str) -> None:
    """Warn about --insecure (``folder`` None), or check ``folder``'s files for every id in
    ``ids``: present, the key private, and the certificate issued to ``role`` with that id; so
    a wrong one stops the start before anything runs.

    Raises:
        typer.Exit: a file is missing, its key is readable by others, or the certificate names
            someone else (one line, exit 1).
    """
    from ops.certs import NotAStockadeCertificate, describe
    from ops.cli.common import warn_insecure
    from runtime.tls import TlsFiles

    if folder is None:
        warn_insecure(what)
        return
    with errors():
        for id in ids:
            files = TlsFiles.in_dir(folder, id)
            files.check()
            try:
                holder = describe(files.cert_path).identity
            except NotAStockadeCertificate as exc:
                fail(f"{files.cert_path}: {exc}")
            if holder is None or (holder.role, holder.id) != (role, id):
                named = f"{holder.role} {holder.id}" if holder else "no Stockade identity"
                fail(
                    f"{files.cert_path} is the certificate of {named}, not of {role} {id}: a "
                    f"certificate is bound to one id (issue one with `stockade certs issue --role "
                    f"{role} --id {id}`)"
                )


def _fleet_certificate(folder: Path | None, fleet_id: str, worker_ids: list[str]) -> TlsFiles | None:
    """The fleet certificate's files, ``<folder>/<fleet_id>.crt`` and ``.key``, checked: present
    (None when the certificate is absent, or with --insecure), the key private, and a fleet
    certificate that names every worker of ``worker_ids``.

    Raises:
        typer.Exit: the key is missing or readable by others, or the certificate is no fleet
            certificate or leaves a hosted worker out (one line, exit 1).
    """
    from ops.certs import NotAStockadeCertificate, describe

    if folder is None:
        return None
    files = TlsFiles.in_dir(folder, fleet_id)
    if not files.cert_path.exists():
        return None
    with errors():
        files.check()
        try:
            holder = describe(files.cert_path).identity
        except NotAStockadeCertificate as exc:
            fail(f"{files.cert_path}: {exc}")
        if holder is None or not holder.is_fleet:
            named = holder or "no Stockade identity"
            fail(
                f"{files.cert_path} is not a fleet certificate (it names {named}): "
                f"issue one with `stockade certs issue --role worker --id {fleet_id} --workers "
                f"{','.join(worker_ids)}`, or remove it for one connection per worker"
            )
        missing = [w for w in worker_ids if w not in holder.workers]
        if missing:
            fail(
                f"{files.cert_path} does not name worker {missing[0]!r} ({len(missing)} of the "
                f"fleet's {len(worker_ids)} workers are missing): re-issue it with --workers "
                f"{','.join(worker_ids)}"
            )
    return files


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
    heartbeat_group_wait_s: Annotated[
        float,
        typer.Option(
            help="Gather heartbeats this long and record them in one statement, seconds (0: one "
            "statement per heartbeat; at most 0.1)."
        ),
    ] = _INGEST.heartbeat_group_wait_s,
    heartbeat_group_max: Annotated[
        int, typer.Option(help="Most heartbeats one statement records (a full group closes at once).")
    ] = _INGEST.heartbeat_group_max,
    heartbeat_groups_in_flight: Annotated[
        int,
        typer.Option(
            min=1,
            help="Most group statements run at once; a group that waits for one keeps gathering.",
        ),
    ] = _INGEST.heartbeat_groups_in_flight,
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
    max_log_streams: Annotated[
        int,
        typer.Option(
            help="Job output streams (stockade logs) this replica relays at once; one more is "
            "answered 'busy' (another replica takes it)."
        ),
    ] = _INGEST.max_log_streams,
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
    trial_run_s: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="A newly registered worker, or one whose unhealthy mark was cleared, takes one job at "
            "a time until a run there succeeded or ran this long, seconds; 0: no trial.",
        ),
    ] = _PLACER.trial_run_s,
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
            "(and at least 3) are silent for --suspect-after-s at once."
        ),
    ] = _RECONCILER.mass_silence_fraction,
    mass_silence_max_s: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="A mass silence holds declarations for at most this long, seconds; keep it above the "
            "agents' --db-outage-grace-s.",
        ),
    ] = _RECONCILER.mass_silence_max_s,
    heartbeat_interval_min_s: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="The shortest heartbeat interval the leader asks of workers (a small cluster's), seconds.",
        ),
    ] = _RECONCILER.heartbeat_interval_min_s,
    heartbeat_interval_max_s: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="The longest heartbeat interval the leader asks of workers however large the cluster, "
            "seconds: with --dead-after-intervals it bounds how long a dead worker goes unnoticed.",
        ),
    ] = _RECONCILER.heartbeat_interval_max_s,
    heartbeat_cpu_budget: Annotated[
        float,
        typer.Option(
            help="The share of a core each control plane may spend on heartbeats (above 0, below 1): "
            "the interval grows with the cluster to keep their measured cost within it.",
        ),
    ] = _RECONCILER.heartbeat_cpu_budget,
    dead_after_intervals: Annotated[
        float,
        typer.Option(
            help="A worker is declared dead after this many heartbeat intervals without one, never "
            "sooner than --dead-after-s (at least 3).",
        ),
    ] = _RECONCILER.dead_after_intervals,
    suspect_after_s: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="A worker silent this long counts toward a mass silence, seconds (default: half of "
            "--dead-after-s).",
        ),
    ] = None,
    contact_gap_s: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="After the leader's reads of the workers' silence were interrupted this long (its "
            "database was unreachable), silence counts anew, seconds.",
        ),
    ] = _RECONCILER.contact_gap_s,
    oldest_transaction_warn_s: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="Warn when a transaction (any session's) has been open in the database longer than "
            "this, seconds: vacuum cannot remove dead rows meanwhile.",
        ),
    ] = _WATCH.oldest_transaction_warn_s,
    dead_rows_warn_ratio: Annotated[
        float,
        typer.Option(
            min=0.001,
            help=f"Warn when workers, jobs, assignments or lease holds more dead rows than this many "
            f"times its live ones (and more than {_WATCH.dead_rows_warn_min}).",
        ),
    ] = _WATCH.dead_rows_warn_ratio,
    health_interval_s: Annotated[
        float,
        typer.Option(
            min=0.001, help="How often the leader judges the workers' health from their recent runs, seconds."
        ),
    ] = _RECONCILER.health_interval_s,
    health_window_runs: Annotated[
        int,
        typer.Option(min=1, max=1000, help="A worker's health is judged on its last this many ended runs."),
    ] = _RECONCILER.health_window_runs,
    health_window_s: Annotated[
        float,
        typer.Option(
            min=0.001, help="Judge a worker's health only on runs that ended within this many seconds."
        ),
    ] = _RECONCILER.health_window_s,
    health_min_failed_jobs: Annotated[
        int,
        typer.Option(
            min=1,
            max=1000,
            help="Mark a worker unhealthy only when runs of at least this many different jobs failed there.",
        ),
    ] = _RECONCILER.health_min_failed_jobs,
    health_min_failure_rate: Annotated[
        float,
        typer.Option(
            help="Mark a worker unhealthy only when at least this fraction of its judged runs failed "
            "(above 0, at most 1)."
        ),
    ] = _RECONCILER.health_min_failure_rate,
    health_rate_factor: Annotated[
        float,
        typer.Option(
            help="Mark a worker unhealthy only when its runs fail at least this many times as often as "
            "the other workers' (at least 1)."
        ),
    ] = _RECONCILER.health_rate_factor,
    health_min_compared_runs: Annotated[
        int,
        typer.Option(
            min=1,
            max=1000,
            help="Compare a worker's failure rate with the other workers' only when they ended at least "
            "this many runs over the same span; with fewer, mark it only when jobs that failed there "
            "succeeded elsewhere.",
        ),
    ] = _RECONCILER.health_min_compared_runs,
    health_probe_after_s: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="This long after a worker was marked unhealthy, one job at a time may be placed there "
            "as a probe (its success clears the mark), seconds; 0: no probes.",
        ),
    ] = _RECONCILER.health_probe_after_s,
    metrics_port: Annotated[
        int, typer.Option(help="Serve Prometheus metrics on the --host address at PORT/metrics (0: off).")
    ] = 0,
    http_port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65535,
            help="Serve the read-only web console on PORT (0: off): HTTPS on the --host address with "
            "this replica's certificate, logging in with `stockade console`; with --insecure, plain "
            "HTTP on 127.0.0.1 only, no login.",
        ),
    ] = 0,
    json_logs: Annotated[bool, typer.Option(help="Log JSON lines instead of console lines.")] = False,
    nice: NiceOption = DEFAULT_NICE,
    certs_dir: CertsDirOption = None,
    insecure: InsecureOption = False,
) -> None:
    """Run one control-plane replica in the foreground until SIGTERM or Ctrl-C.

    It serves mutual TLS with <certs-dir>/<id>.crt (a control-plane certificate) and requires
    a client certificate from the same CA: workers, operators and viewers, each allowed what
    its role may do."""
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
    from runtime.tls import TlsFiles

    if not database_url:
        fail("--database-url or DATABASE_URL is required", EXIT_INVALID)
    folder = _cert_folder(certs_dir, insecure)
    step_down_margin_s = min(0.4, lease_ttl_s / 5)
    with errors():
        settings = ControlPlaneSettings(
            cp_id=cp_id,
            database_url=database_url,
            listen_host=host,
            listen_port=port,
            tls=None if folder is None else TlsFiles.in_dir(folder, cp_id),
            http_port=http_port or None,
            ingest=IngestSettings(
                pool_size=ingest_pool_size,
                liveness_reserved_connections=liveness_reserved_connections,
                shed_lag_s=shed_lag_s,
                max_requests_in_progress=max_requests_in_progress,
                max_waiting_requests=max_waiting_requests,
                max_admission_wait_s=max_admission_wait_s,
                heartbeat_group_wait_s=heartbeat_group_wait_s,
                heartbeat_group_max=heartbeat_group_max,
                heartbeat_groups_in_flight=heartbeat_groups_in_flight,
                max_wire_work_share=max_wire_work_share,
                wire_step_messages=wire_step_messages,
                max_pending_jobs=max_pending_jobs,
                idempotency_key_retention_s=idempotency_key_retention_s,
                max_log_streams=max_log_streams,
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
                trial_run_s=trial_run_s,
            ),
            reconciler=ReconcilerSettings(
                reconcile_interval_s=reconcile_interval_s,
                dead_after_s=dead_after_s,
                requeue_backoff_base_s=requeue_backoff_base_s,
                requeue_backoff_max_s=requeue_backoff_max_s,
                death_burst=death_burst,
                deaths_per_s=deaths_per_s,
                mass_silence_fraction=mass_silence_fraction,
                suspect_after_s=suspect_after_s,
                heartbeat_interval_min_s=heartbeat_interval_min_s,
                heartbeat_interval_max_s=heartbeat_interval_max_s,
                heartbeat_cpu_budget=heartbeat_cpu_budget,
                dead_after_intervals=dead_after_intervals,
                mass_silence_max_s=mass_silence_max_s,
                contact_gap_s=contact_gap_s,
                health_interval_s=health_interval_s,
                health_window_runs=health_window_runs,
                health_window_s=health_window_s,
                health_min_failed_jobs=health_min_failed_jobs,
                health_min_failure_rate=health_min_failure_rate,
                health_rate_factor=health_rate_factor,
                health_min_compared_runs=health_min_compared_runs,
                health_probe_after_s=health_probe_after_s,
            ),
            database_watch=DatabaseWatchSettings(
                oldest_transaction_warn_s=oldest_transaction_warn_s, dead_rows_warn_ratio=dead_rows_warn_ratio
            ),
        )
        check_nice(nice)
        if (why := fence_margin_refusal(settings.reconciler)) is not None:
            raise InvalidArgument("dead_after_s", settings.reconciler.dead_after_s, why)
    _check_tls_files(folder, "control-plane", [cp_id], f"control plane {cp_id}")
    with errors():  # a database that refuses this client for good ends the replica in one line
        control_plane_main(settings, json_logs=json_logs, metrics_port=metrics_port or None, nice=nice)


HeartbeatIntervalOption = Annotated[
    float,
    typer.Option(
        help="Time between heartbeats until the cluster tells another interval, seconds (the "
        "self-fence span stretches in proportion with a longer one)."
    ),
]
HeartbeatIntervalMinOption = Annotated[
    float, typer.Option(help="Refuse a heartbeat interval the cluster tells below this, seconds.")
]
HeartbeatIntervalMaxOption = Annotated[
    float, typer.Option(help="Refuse a heartbeat interval the cluster tells above this, seconds.")
]
HeartbeatTimeoutOption = Annotated[
    float,
    typer.Option(
        help="Send a heartbeat (or registration) to the next control plane too after this long "
        "without an answer, seconds (the first may still answer until shortly before the fence deadline)."
    ),
]
SelfFenceOption = Annotated[
    float, typer.Option(help="Pause every job after this long without an acknowledged heartbeat, seconds.")
]
DbOutageGraceOption = Annotated[
    float,
    typer.Option(
        min=0.0,
        help="Kill paused jobs after this long without an acknowledged heartbeat, seconds: the longest "
        "database outage (or cut-off) running work survives; 0: kill at the fence, no pause.",
    ),
]
RestartHoldOption = Annotated[
    float,
    typer.Option(
        min=0.0,
        max=600.0,
        help="On SIGHUP (a planned restart: the agent exits leaving its jobs running, for the agent "
        "started next on the same work dir to take over) ask the control planes to hold the worker "
        "this long, seconds: no silence counts and nothing is placed on it meanwhile; 0: no hold.",
    ),
]
RegisterTimeoutOption = Annotated[
    float,
    typer.Option(
        help="How long a new registration (which holds no job), or a paused worker's heartbeat after "
        "calls that failed, waits at most for its answer, seconds."
    ),
]
RegisterRetryMaxOption = Annotated[
    float,
    typer.Option(
        help="Registration retries wait a jittered pause whose ceiling doubles per failed attempt up "
        "to this, seconds."
    ),
]
LeaveTimeoutOption = Annotated[
    float,
    typer.Option(
        help="At a clean stop, once every job has ended, keep trying this long to have a control plane "
        "record that the worker left, seconds (past it the worker is declared dead after dead_after "
        "instead)."
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
MaxConcurrentLeavesOption = Annotated[
    int,
    typer.Option(
        help="At a clean stop, most of this process's workers asking a control plane to record their "
        "leave at once (a fleet's workers take turns)."
    ),
]
JobNiceOption = Annotated[
    int,
    typer.Option(
        help=f"Run command jobs this much lower in CPU priority than the agent (nice, "
        f"{MIN_JOB_NICE}..{MAX_JOB_NICE}; 0: the agent's priority)."
    ),
]
JobOomScoreAdjOption = Annotated[
    int,
    typer.Option(
        help=f"oom_score_adj of command and container jobs ({MIN_JOB_OOM_SCORE_ADJ}..{MAX_OOM_SCORE_ADJ}): "
        "when the machine runs out of memory the kernel kills the highest first; 1000: a job before "
        "anything else."
    ),
]
OomScoreAdjOption = Annotated[
    int,
    typer.Option(
        help="oom_score_adj (-1000..1000) this process and its job supervisors ask for at start, so "
        "the kernel's OOM killer takes jobs first; without CAP_SYS_RESOURCE it goes as low as it "
        "may and says so."
    ),
]
JobPidsMaxOption = Annotated[
    int,
    typer.Option(
        help=f"Most processes (and threads) one command job may have at once ({MIN_JOB_PIDS}.."
        f"{MAX_JOB_PIDS}; its cgroup's pids.max: not enforced in rlimit mode)."
    ),
]
JobResourcesOption = Annotated[
    str,
    typer.Option(
        help=f"How command jobs' cpu_millis and memory_mb are enforced ({', '.join(JOB_RESOURCES_CHOICES)}): "
        "auto takes cgroup2, else cgroup1, else rlimit (RLIMIT_AS only); a mode named must work "
        "here or the agent does not start. Registered as the label resources=<mode>."
    ),
]
JobUserOption = Annotated[
    str,
    typer.Option(
        help="When the agent runs as root, run command jobs as this system user (created on first "
        "use; never root). Ignored when the agent is not root: jobs run as its user."
    ),
]
MetricsPortOption = Annotated[
    int, typer.Option(help="Serve Prometheus metrics on the --host address at PORT/metrics (0: off).")
]
MaxOutputMbOption = Annotated[
    int,
    typer.Option(
        min=1,
        max=MAX_OUTPUT_MB,
        help="Keep at most this many MiB of each job's stdout, and of its stderr: past it the oldest "
        "part is dropped (stockade logs says how much).",
    ),
]
OutputRetentionOption = Annotated[
    float,
    typer.Option(
        help="Delete a job's folder (its output, its working files) this long after it ended, seconds "
        "(never while it runs)."
    ),
]


def _output_settings(max_output_mb: int, output_retention_s: float) -> OutputSettings:
    """The agent's output settings from its options.

    Raises:
        InvalidArgument: a value out of range, naming its option's field.
    """
    return OutputSettings(max_output_mb=max_output_mb, output_retention_s=output_retention_s)


_OUTPUT_DEFAULTS = OutputSettings()


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
    heartbeat_interval_min_s: HeartbeatIntervalMinOption = _agent_default("heartbeat_interval_min_s"),
    heartbeat_interval_max_s: HeartbeatIntervalMaxOption = _agent_default("heartbeat_interval_max_s"),
    heartbeat_timeout_s: HeartbeatTimeoutOption = _agent_default("heartbeat_timeout_s"),
    self_fence_after_s: SelfFenceOption = _agent_default("self_fence_after_s"),
    db_outage_grace_s: DbOutageGraceOption = _agent_default("db_outage_grace_s"),
    restart_hold_s: RestartHoldOption = _agent_default("restart_hold_s"),
    leave_timeout_s: LeaveTimeoutOption = _agent_default("leave_timeout_s"),
    register_timeout_s: RegisterTimeoutOption = _agent_default("register_timeout_s"),
    register_retry_max_s: RegisterRetryMaxOption = _agent_default("register_retry_max_s"),
    max_concurrent_starts: MaxConcurrentStartsOption = _agent_int_default("max_concurrent_starts"),
    max_concurrent_leaves: MaxConcurrentLeavesOption = _agent_int_default("max_concurrent_leaves"),
    job_nice: JobNiceOption = _agent_int_default("job_nice"),
    job_oom_score_adj: JobOomScoreAdjOption = _agent_int_default("job_oom_score_adj"),
    job_pids_max: JobPidsMaxOption = _agent_int_default("job_pids_max"),
    job_resources: JobResourcesOption = _agent_str_default("job_resources"),
    job_user: JobUserOption = _agent_str_default("job_user"),
    max_output_mb: MaxOutputMbOption = _OUTPUT_DEFAULTS.max_output_mb,
    output_retention_s: OutputRetentionOption = _OUTPUT_DEFAULTS.output_retention_s,
    metrics_port: MetricsPortOption = 0,
    json_logs: JsonLogsOption = False,
    nice: NiceOption = DEFAULT_NICE,
    oom_score_adj: OomScoreAdjOption = DEFAULT_AGENT_OOM_SCORE_ADJ,
    certs_dir: CertsDirOption = None,
    insecure: InsecureOption = False,
    no_containers: Annotated[
        bool,
        typer.Option(
            "--no-containers",
            help="Run no container jobs here: register container=none without asking the Docker "
            "engine (by default container=docker when the engine answers a ping at start).",
        ),
    ] = False,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            help="A label key=value for constraints to match (repeatable), e.g. --label gpu=a100. "
            "The agent sets container=docker|none and resources=cgroup2|cgroup1|rlimit itself.",
        ),
    ] = None,
) -> None:
    """Run one worker agent in the foreground until SIGTERM or Ctrl-C (a clean stop: every job
    stopped), or SIGHUP (a planned restart: it exits leaving its jobs running for the agent
    started next with the same --id and --work-dir).

    It serves the Worker service over mutual TLS with <certs-dir>/<id>.crt (a worker
    certificate for this id), answers only control-plane certificates from the same CA, and
    calls the control planes with its own certificate."""
    from agent.main import main as agent_main
    from runtime.os_users import resolve_unprivileged_user
    from runtime.settings import AgentSettings
    from runtime.tls import TlsFiles

    folder = _cert_folder(certs_dir, insecure)

    with errors():
        settings = AgentSettings(
            worker_id=worker_id,
            control_planes=named_addresses(control_planes),
            cpu_millis=cpu_millis,
            memory_mb=memory_mb,
            work_dir=str(work_dir.absolute()),
            listen_host=host,
            listen_port=port,
            advertise_address=advertise_address,
            heartbeat_interval_s=heartbeat_interval_s,
            heartbeat_interval_min_s=heartbeat_interval_min_s,
            heartbeat_interval_max_s=heartbeat_interval_max_s,
            heartbeat_timeout_s=heartbeat_timeout_s,
            self_fence_after_s=self_fence_after_s,
            db_outage_grace_s=db_outage_grace_s,
            restart_hold_s=restart_hold_s,
            leave_timeout_s=leave_timeout_s,
            register_timeout_s=register_timeout_s,
            register_retry_max_s=register_retry_max_s,
            max_concurrent_starts=max_concurrent_starts,
            max_concurrent_leaves=max_concurrent_leaves,
            job_nice=job_nice,
            job_oom_score_adj=job_oom_score_adj,
            job_pids_max=job_pids_max,
            job_resources=job_resources,
            job_user=job_user,
            output=_output_settings(max_output_mb, output_retention_s),
            tls=None if folder is None else TlsFiles.in_dir(folder, worker_id),
            labels={**parse_labels(label or []), **({"container": "none"} if no_containers else {})},
        )
    with errors():
        check_nice(nice)
        check_oom_score_adj(oom_score_adj)
        resolve_unprivileged_user(settings.job_user)  # refuse to start without the job user
    _check_tls_files(folder, "worker", [worker_id], f"worker {worker_id}")
    with errors():  # a registration refused for the certificate's id ends the agent in one line
        agent_main(
            settings,
            json_logs=json_logs,
            metrics_port=metrics_port or None,
            nice=nice,
            oom_score_adj=oom_score_adj,
        )


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
    heartbeat_interval_min_s: HeartbeatIntervalMinOption = _agent_default("heartbeat_interval_min_s"),
    heartbeat_interval_max_s: HeartbeatIntervalMaxOption = _agent_default("heartbeat_interval_max_s"),
    heartbeat_timeout_s: HeartbeatTimeoutOption = _agent_default("heartbeat_timeout_s"),
    self_fence_after_s: SelfFenceOption = _agent_default("self_fence_after_s"),
    db_outage_grace_s: DbOutageGraceOption = _agent_default("db_outage_grace_s"),
    restart_hold_s: RestartHoldOption = _agent_default("restart_hold_s"),
    leave_timeout_s: LeaveTimeoutOption = _agent_default("leave_timeout_s"),
    register_timeout_s: RegisterTimeoutOption = _agent_default("register_timeout_s"),
    register_retry_max_s: RegisterRetryMaxOption = _agent_default("register_retry_max_s"),
    max_concurrent_starts: MaxConcurrentStartsOption = _agent_int_default("max_concurrent_starts"),
    max_concurrent_leaves: MaxConcurrentLeavesOption = _agent_int_default("max_concurrent_leaves"),
    job_nice: JobNiceOption = _agent_int_default("job_nice"),
    job_oom_score_adj: JobOomScoreAdjOption = _agent_int_default("job_oom_score_adj"),
    job_pids_max: JobPidsMaxOption = _agent_int_default("job_pids_max"),
    job_resources: JobResourcesOption = _agent_str_default("job_resources"),
    job_user: JobUserOption = _agent_str_default("job_user"),
    max_output_mb: MaxOutputMbOption = _OUTPUT_DEFAULTS.max_output_mb,
    output_retention_s: OutputRetentionOption = _OUTPUT_DEFAULTS.output_retention_s,
    metrics_port: MetricsPortOption = 0,
    json_logs: JsonLogsOption = False,
    nice: NiceOption = DEFAULT_NICE,
    oom_score_adj: OomScoreAdjOption = DEFAULT_AGENT_OOM_SCORE_ADJ,
    certs_dir: CertsDirOption = None,
    insecure: InsecureOption = False,
) -> None:
    """Run many workers' agents in one process until SIGTERM or Ctrl-C.

    Each worker serves with its own certificate, <certs-dir>/<id>.crt, as a lone agent does.
    The workers call the control planes over one connection per control plane, presenting the
    fleet certificate <certs-dir>/<fleet id>.crt (stockade certs issue --role worker --id
    <fleet id> --workers w-1,w-2,...), which must name every hosted worker; without that file
    each worker calls with its own certificate, over connections of its own.

    Each worker keeps its own id, port, registration, heartbeats, work dir and agent.jsonl.
    When one worker's agent fails (its port is taken, ...) every worker's jobs are stopped
    and the command exits 1 naming the worker; a bad spec exits 2.
    """
    from agent.fleet import WorkerFailed, fleet_settings, load_fleet_spec
    from agent.fleet import main as fleet_main
    from runtime.os_users import resolve_unprivileged_user

    with errors():
        identifiers.check_id(fleet_id, field="fleet_id")
        workers = load_fleet_spec(spec)
    folder = _cert_folder(certs_dir, insecure)
    with errors():
        settings = fleet_settings(
            workers,
            control_planes=named_addresses(control_planes),
            listen_host=host,
            cert_dir=folder,
            heartbeat_interval_s=heartbeat_interval_s,
            heartbeat_interval_min_s=heartbeat_interval_min_s,
            heartbeat_interval_max_s=heartbeat_interval_max_s,
            heartbeat_timeout_s=heartbeat_timeout_s,
            self_fence_after_s=self_fence_after_s,
            db_outage_grace_s=db_outage_grace_s,
            restart_hold_s=restart_hold_s,
            leave_timeout_s=leave_timeout_s,
            register_timeout_s=register_timeout_s,
            register_retry_max_s=register_retry_max_s,
            max_concurrent_starts=max_concurrent_starts,
            max_concurrent_leaves=max_concurrent_leaves,
            job_nice=job_nice,
            job_oom_score_adj=job_oom_score_adj,
            job_pids_max=job_pids_max,
            job_resources=job_resources,
            job_user=job_user,
            output=_output_settings(max_output_mb, output_retention_s),
        )
        check_nice(nice)
        check_oom_score_adj(oom_score_adj)
        resolve_unprivileged_user(job_user)  # refuse to start without the job user
    _check_tls_files(folder, "worker", [w.worker_id for w in workers], f"fleet {fleet_id}")
    fleet_tls = _fleet_certificate(folder, fleet_id, [w.worker_id for w in workers])
    try:
        fleet_main(
            settings,
            fleet_id=fleet_id,
            control_planes=named_addresses(control_planes),
            fleet_tls=fleet_tls,
            json_logs=json_logs,
            metrics_port=metrics_port or None,
            nice=nice,
            oom_score_adj=oom_score_adj,
        )
    except WorkerFailed as exc:
        fail(f"{fleet_id}: {exc}")


@app.command("database")
def database(
    data_dir: Annotated[
        Path, typer.Option(help="Folder of the server's files (PGDATA in data/, its log, pgpass).")
    ],
    port: Annotated[int, typer.Option(help="TCP port, 1..65535.")] = 5432,
    listen_host: Annotated[
        str,
        typer.Option(
            help="Address clients reach the server at besides 127.0.0.1 (a container's on its "
            "private network); password connections from that address's network are accepted."
        ),
    ] = "127.0.0.1",
    fast_unsafe: Annotated[
        bool, typer.Option(help="fsync off: for tests and benchmarks only (a machine crash loses data).")
    ] = False,
) -> None:
    """Run the embedded PostgreSQL server in the foreground until SIGTERM or Ctrl-C (then a
    fast shutdown); exits 1 if the server ends on its own. What a database container runs."""
    import signal
    import time

    from ops.launcher.pg import EmbeddedPostgres, EmbeddedPostgresError

    if not 1 <= port <= 65535:
        fail(f"--port must be in 1..65535, got {port}", EXIT_INVALID)
    server = EmbeddedPostgres(data_dir=data_dir, port=port, listen_host=listen_host, fast_unsafe=fast_unsafe)
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        url = server.start(timeout_s=60.0)
    except EmbeddedPostgresError as exc:
        fail(f"PostgreSQL did not start: {exc}", 1)
    print(f"PostgreSQL serves {url}", flush=True)
    while not stopping:
        if not server.is_running():
            fail(f"PostgreSQL ended on its own; see {server.log_path}", 1)
        time.sleep(0.5)
    try:
        server.stop()
    except EmbeddedPostgresError as exc:
        fail(f"PostgreSQL did not stop: {exc}", 1)
    print("PostgreSQL stopped", flush=True)
