"""``stockade cp``: one control-plane replica in the foreground until SIGTERM or Ctrl-C; each
option sets a field of :class:`runtime.settings.ControlPlaneSettings`' groups, whose defaults
it shows."""

from __future__ import annotations

import functools
from typing import Annotated, Any

import typer

from ops.cli import processes
from ops.cli.base import app
from ops.cli.common import EXIT_INVALID, errors, fail
from ops.cli.options import Option, Options, settings_fields, settings_rows, with_options
from runtime.errors import InvalidArgument
from runtime.priority import check_nice
from runtime.settings.control_plane import DatabaseWatchSettings, IngestSettings
from runtime.settings.leader import (
    PLACEMENT_POLICIES,
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
_ingest = settings_rows("ingest", functools.partial(getattr, _INGEST))
_lease = settings_rows("lease", functools.partial(getattr, _LEASE))
_placer = settings_rows("placer", functools.partial(getattr, _PLACER))
_reconciler = settings_rows("reconciler", functools.partial(getattr, _RECONCILER))
_watch = settings_rows("database_watch", functools.partial(getattr, _WATCH))


CONTROL_PLANE_OPTIONS: dict[str, Option] = {
    **_lease("lease_ttl_s", help="Lease time to live, seconds."),
    **_lease(
        "max_main_loop_stall_s",
        help="Step down (and take no lease) while the main loop, where decisions are made, "
        "has not run for this long, seconds.",
    ),
    **_placer("round_interval_s", help="Placer round interval, seconds."),
    **_reconciler("reconcile_interval_s", help="Reconcile pass interval, seconds."),
    **_reconciler("dead_after_s", help="A worker silent this long is declared dead, seconds."),
    **_placer("policy", help=f"Placement policy: {', '.join(PLACEMENT_POLICIES)}."),
    **_placer(
        "max_reservations",
        help="Workers a placer round may keep free for jobs that fit no free room yet (0: none).",
    ),
    **_placer("reserve_after_s", help="Only a job queued this long may reserve a worker, seconds."),
    **_placer(
        "preemption",
        help="Let a pending job of higher priority that fits no free room stop running jobs of lower "
        "priority (docs/preemption.md); off by default.",
    ),
    **_placer(
        "preempt_grace_s",
        help="A preempted job gets SIGTERM, then SIGKILL this long after, seconds (at most 600).",
    ),
    **_placer("preempt_cooldown_s", min=0.0, help="Preempt a job at most once per this long, seconds."),
    **_placer(
        "max_preemptions_per_round", min=1, max=500, help="Most pending jobs one placer round preempts for."
    ),
    **_placer(
        "fair_share",
        help="Divide the cluster between competing accounts by weighted Dominant Resource Fairness "
        "(--no-fair-share: by priority, then submission order).",
    ),
    **_placer(
        "fair_share_half_life_s",
        help="Fair share counts an account's past use, halved every this many seconds "
        "(0: only what its jobs hold now).",
    ),
    **_ingest(
        "pool_size", option="ingest_pool_size", help="Database connections of the ControlPlane service."
    ),
    **_ingest(
        "liveness_reserved_connections",
        help="Of those, connections only heartbeats and registrations may use.",
    ),
    **_ingest(
        "shed_lag_s",
        help="Answer new work 'busy' while the service's event loop lags more than this, seconds.",
    ),
    **_ingest(
        "max_requests_in_progress",
        help="Requests other than heartbeats and registrations served at once, from admission "
        "until their reply is encoded; the rest wait their turn.",
    ),
    **_ingest(
        "max_waiting_requests",
        help="Answer new work 'busy' when this many requests already wait for their turn.",
    ),
    **_ingest(
        "heartbeat_group_wait_s",
        help="Gather heartbeats this long and record them in one statement, seconds (0: one "
        "statement per heartbeat; at most 0.1).",
    ),
    **_ingest(
        "heartbeat_group_max", help="Most heartbeats one statement records (a full group closes at once)."
    ),
    **_ingest(
        "heartbeat_groups_in_flight",
        min=1,
        help="Most group statements run at once; a group that waits for one keeps gathering.",
    ),
    **_ingest(
        "max_admission_wait_s", help="Answer new work 'busy' that has waited this long for its turn, seconds."
    ),
    **_ingest(
        "max_wire_work_share",
        help="Most of the service's event-loop time that encoding and decoding large messages "
        "may take, a fraction (0.25: a quarter).",
    ),
    **_ingest(
        "wire_step_messages",
        help="Elements of a large reply encoded (or request decoded) between two yields to the "
        "service's event loop.",
    ),
    **_ingest(
        "max_pending_jobs",
        help="Answer submissions 'busy' while this many jobs are pending (0: no limit); "
        "a batch that arrives under the limit is taken whole.",
    ),
    **_ingest(
        "idempotency_key_retention_s",
        help="Keep a mutating call's idempotency key and answer this long after its first use, "
        "seconds: a retry within it gets the first answer, a copy after it is a new call.",
    ),
    **_ingest(
        "usage_retention_s",
        help="Keep the usage samples workers report (their jobs' CPU and memory, drawn on the "
        "console's job and worker pages) this long, seconds.",
    ),
    **_ingest(
        "max_log_streams",
        help="Job output streams (stockade logs) this replica relays at once; one more is "
        "answered 'busy' (another replica takes it).",
    ),
    **_placer(
        "initial_window",
        help="Unconfirmed assignments a worker may hold before a heartbeat confirmed any; "
        "one more per confirmed assignment.",
    ),
    **_placer(
        "max_unconfirmed_per_worker",
        help="Most unconfirmed assignments a worker may hold (the window's ceiling).",
    ),
    **_placer(
        "trial_run_s",
        min=0.0,
        help="A newly registered worker, or one whose unhealthy mark was cleared, takes one job at "
        "a time until a run there succeeded or ran this long, seconds; 0: no trial.",
    ),
    **_reconciler(
        "requeue_backoff_base_s",
        help="A job lost with its worker waits a random time below this before it is placed "
        "again, doubling with every further loss, seconds.",
    ),
    **_reconciler("requeue_backoff_max_s", help="Largest bound of the requeue backoff, seconds."),
    **_reconciler("death_burst", help="Most workers declared dead at once."),
    **_reconciler("deaths_per_s", help="Dead-worker declarations per second beyond the burst."),
    **_reconciler(
        "mass_silence_fraction",
        help="Declare no worker dead while more than this fraction of the alive workers "
        "(and at least 3) are silent for --suspect-after-s at once.",
    ),
    **_reconciler(
        "mass_silence_max_s",
        min=0.001,
        help="A mass silence holds declarations for at most this long, seconds; keep it above the "
        "agents' --db-outage-grace-s.",
    ),
    **_reconciler(
        "heartbeat_interval_min_s",
        min=0.001,
        help="The shortest heartbeat interval the leader asks of workers (a small cluster's), seconds.",
    ),
    **_reconciler(
        "heartbeat_interval_max_s",
        min=0.001,
        help="The longest heartbeat interval the leader asks of workers however large the cluster, "
        "seconds: with --dead-after-intervals it bounds how long a dead worker goes unnoticed.",
    ),
    **_reconciler(
        "heartbeat_cpu_budget",
        help="The share of a core each control plane may spend on heartbeats (above 0, below 1): "
        "the interval grows with the cluster to keep their measured cost within it.",
    ),
    **_reconciler(
        "dead_after_intervals",
        help="A worker is declared dead after this many heartbeat intervals without one, never "
        "sooner than --dead-after-s (at least 3).",
    ),
    "suspect_after_s": Option(
        None,
        kind=float | None,
        group="reconciler",
        min=0.001,
        help="A worker silent this long counts toward a mass silence, seconds (default: half of "
        "--dead-after-s).",
    ),
    **_reconciler(
        "contact_gap_s",
        min=0.001,
        help="After the leader's reads of the workers' silence were interrupted this long (its "
        "database was unreachable), silence counts anew, seconds.",
    ),
    **_watch(
        "oldest_transaction_warn_s",
        min=0.001,
        help="Warn when a transaction (any session's) has been open in the database longer than "
        "this, seconds: vacuum cannot remove dead rows meanwhile.",
    ),
    **_watch(
        "dead_rows_warn_ratio",
        min=0.001,
        help=f"Warn when workers, jobs, assignments or lease holds more dead rows than this many "
        f"times its live ones (and more than {_WATCH.dead_rows_warn_min}).",
    ),
    **_reconciler(
        "health_interval_s",
        min=0.001,
        help="How often the leader judges the workers' health from their recent runs, seconds.",
    ),
    **_reconciler(
        "health_window_runs",
        min=1,
        max=1000,
        help="A worker's health is judged on its last this many ended runs.",
    ),
    **_reconciler(
        "health_window_s",
        min=0.001,
        help="Judge a worker's health only on runs that ended within this many seconds.",
    ),
    **_reconciler(
        "health_min_failed_jobs",
        min=1,
        max=1000,
        help="Mark a worker unhealthy only when runs of at least this many different jobs failed there.",
    ),
    **_reconciler(
        "health_min_failure_rate",
        help="Mark a worker unhealthy only when at least this fraction of its judged runs failed "
        "(above 0, at most 1).",
    ),
    **_reconciler(
        "health_rate_factor",
        help="Mark a worker unhealthy only when its runs fail at least this many times as often as "
        "the other workers' (at least 1).",
    ),
    **_reconciler(
        "health_min_compared_runs",
        min=1,
        max=1000,
        help="Compare a worker's failure rate with the other workers' only when they ended at least "
        "this many runs over the same span; with fewer, mark it only when jobs that failed there "
        "succeeded elsewhere.",
    ),
    **_reconciler(
        "health_probe_after_s",
        min=0.0,
        help="This long after a worker was marked unhealthy, one job at a time may be placed there "
        "as a probe (its success clears the mark), seconds; 0: no probes.",
    ),
    "http_port": Option(
        0,
        min=0,
        max=65535,
        help="Serve the read-only web console on PORT (0: off): HTTPS on the --host address with "
        "this replica's certificate, logging in with `stockade console`; with --insecure, plain "
        "HTTP on 127.0.0.1 only, no login.",
    ),
    **processes.PROCESS_OPTIONS,
}
"""The options of ``stockade cp`` but its address and database, in the order ``--help`` lists
them: those that set a field of a settings group of :class:`runtime.settings.ControlPlaneSettings`
(``group``) with the groups' defaults, then how the process serves and logs."""


@app.command("cp")
@with_options(CONTROL_PLANE_OPTIONS)
def control_plane(
    *,
    cp_id: Annotated[str, typer.Option("--id", help="This replica's id, e.g. cp-1.")],
    port: Annotated[int, typer.Option(help="gRPC port of the ControlPlane service (0: a free one).")] = 0,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    database_url: Annotated[
        str | None,
        typer.Option(
            envvar="DATABASE_URL", show_default=False, help="PostgreSQL URL of the shared database."
        ),
    ] = None,
    options: Options,
) -> None:
    """Run one control-plane replica in the foreground until SIGTERM or Ctrl-C.

    It serves mutual TLS with <certs-dir>/<id>.crt (a control-plane certificate) and requires
    a client certificate from the same CA: workers, operators, viewers and users, each allowed
    what its role may do (docs/accounts.md)."""
    # Imported here: the client commands need neither the actors nor the agent.
    from actors.control_plane import main as control_plane_main
    from runtime.settings.control_plane import ControlPlaneSettings
    from runtime.settings.leader import MAX_STATEMENTS_PER_FENCED_WRITE, LedgerSettings
    from runtime.tls import TlsFiles

    if not database_url:
        fail("--database-url or DATABASE_URL is required", EXIT_INVALID)
    folder = processes.cert_folder(options["certs_dir"], options["insecure"])
    lease_ttl_s = options["lease_ttl_s"]

    def group(name: str) -> dict[str, Any]:
        return settings_fields(CONTROL_PLANE_OPTIONS, options, name)

    step_down_margin_s = min(0.4, lease_ttl_s / 5)
    with errors():
        settings = ControlPlaneSettings(
            cp_id=cp_id,
            database_url=database_url,
            listen_host=host,
            listen_port=port,
            tls=None if folder is None else TlsFiles.in_dir(folder, cp_id),
            http_port=options["http_port"] or None,
            ingest=IngestSettings(**group("ingest")),
            lease=LeaseSettings(
                **group("lease"),
                renew_interval_s=lease_ttl_s / 4,
                step_down_margin_s=step_down_margin_s,
                takeover_poll_s=min(_LEASE.takeover_poll_s, lease_ttl_s / 8),
            ),
            # A shorter lease has a smaller step-down margin, which a fenced write's longest
            # hold must fit in (see ControlPlaneSettings): its statements get less time.
            ledger=LedgerSettings(
                statement_timeout_s=min(
                    LedgerSettings().statement_timeout_s, step_down_margin_s / MAX_STATEMENTS_PER_FENCED_WRITE
                )
            ),
            placer=PlacerSettings(**group("placer")),
            # The reconciler sends the grace the placer's option sets (one option, two users).
            reconciler=ReconcilerSettings(**group("reconciler"), preempt_grace_s=options["preempt_grace_s"]),
            database_watch=DatabaseWatchSettings(**group("database_watch")),
        )
        check_nice(options["nice"])
        if (why := fence_margin_refusal(settings.reconciler)) is not None:
            raise InvalidArgument("dead_after_s", settings.reconciler.dead_after_s, why)
    processes.check_tls_files(folder, "control-plane", [cp_id], f"control plane {cp_id}")
    with errors():  # a database that refuses this client for good ends the replica in one line
        control_plane_main(
            settings,
            json_logs=options["json_logs"],
            metrics_port=options["metrics_port"] or None,
            nice=options["nice"],
        )
