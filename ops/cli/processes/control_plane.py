"""``stockade cp``: one control-plane replica in the foreground until SIGTERM or Ctrl-C; each
option sets a field of :class:`runtime.settings.ControlPlaneSettings`' groups, whose defaults
it shows."""

from __future__ import annotations

from typing import Annotated

import typer

from ops.cli.base import app
from ops.cli.common import EXIT_INVALID, errors, fail
from ops.cli.processes import (
    CertsDirOption,
    InsecureOption,
    JsonLogsOption,
    MetricsPortOption,
    NiceOption,
    cert_folder,
    check_tls_files,
)
from runtime.errors import InvalidArgument
from runtime.priority import DEFAULT_NICE, check_nice
from runtime.settings import (
    PLACEMENT_POLICIES,
    DatabaseWatchSettings,
    IngestSettings,
    LeaseSettings,
    PlacerSettings,
    ReconcilerSettings,
    fence_margin_refusal,
)

_INGEST = IngestSettings()
_LEASE = LeaseSettings()
_PLACER = PlacerSettings()
_RECONCILER = ReconcilerSettings()
_WATCH = DatabaseWatchSettings()


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
    metrics_port: MetricsPortOption = 0,
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
    json_logs: JsonLogsOption = False,
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
    from runtime.settings import MAX_STATEMENTS_PER_FENCED_WRITE, ControlPlaneSettings, LedgerSettings
    from runtime.tls import TlsFiles

    if not database_url:
        fail("--database-url or DATABASE_URL is required", EXIT_INVALID)
    folder = cert_folder(certs_dir, insecure)
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
    check_tls_files(folder, "control-plane", [cp_id], f"control plane {cp_id}")
    with errors():  # a database that refuses this client for good ends the replica in one line
        control_plane_main(settings, json_logs=json_logs, metrics_port=metrics_port or None, nice=nice)
