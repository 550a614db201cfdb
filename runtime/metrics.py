"""Prometheus metrics of a Stockade process (prometheus-client), served on ``--metrics-port``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import attrs
from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# Fine buckets: quantiles are interpolated linearly within one (Prometheus' histogram_quantile).
# fmt: off
ROUND_BUCKETS_S = (
    0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.01, 0.0125, 0.015, 0.02,
    0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0,
)
# fmt: on

PLACER_ROUND_SECONDS = Histogram(
    "stockade_placer_round_seconds",
    "Duration of a placer round while jobs were pending (read, decide, commit, hand to dispatch).",
    buckets=ROUND_BUCKETS_S,
)
PLACER_PHASE_SECONDS = Histogram(
    "stockade_placer_phase_seconds",
    "Time of one phase of a placer round while jobs were pending: read (workers and new pending "
    "jobs), decide, commit (the fenced transaction), dispatch (handing batches over).",
    ["phase"],
    buckets=ROUND_BUCKETS_S,
)
PLACER_ROUND_MAX_SECONDS = Gauge(
    "stockade_placer_round_max_seconds", "Longest placer round since this replica started."
)
PLACER_PENDING_JOBS = Gauge("stockade_placer_pending_jobs", "Pending jobs the placer holds.")
PLACER_RESERVATIONS = Gauge(
    "stockade_placer_reservations", "Workers the last deciding round kept free for jobs that fit no room yet."
)
PLACER_BACKOFF_JOBS = Gauge(
    "stockade_placer_backoff_jobs", "Pending jobs the placer holds that wait out their requeue backoff."
)
PLACEMENTS = Counter("stockade_placements", "Assignments committed by this replica's placer.")
PREEMPTIONS = Counter(
    "stockade_preemptions",
    "Running assignments this replica's placer marked to be preempted (fenced; docs/preemption.md).",
)

WORKER_DEATHS = Counter(
    "stockade_worker_deaths_declared", "Workers this replica's reconciler declared dead (fenced)."
)
DEATHS_HELD = Counter(
    "stockade_worker_deaths_held",
    "Silent workers a reconcile pass did not name dead (once per pass), by reason: rate_limit "
    "(the declarations' token bucket was empty) or mass_silence (too many workers silent at once).",
    ["reason"],
)
MASS_SILENCE = Gauge(
    "stockade_mass_silence",
    "1 while the last reconcile pass found too many workers silent at once to declare any dead.",
)
UNHEALTHY_WORKERS = Gauge(
    "stockade_unhealthy_workers",
    "Alive workers marked unhealthy (their recent runs fail where the same jobs do not fail elsewhere; "
    "no new placement but a probe), as the leader's last health judgement left them; 0 on a standby.",
)
HEARTBEAT_INTERVAL_SECONDS = Gauge(
    "stockade_heartbeat_interval_seconds",
    'The heartbeat interval the leader last chose for the workers (docs/design.md, "Heartbeat interval").',
)
HEARTBEAT_WAIT_P99_SECONDS = Gauge(
    "stockade_heartbeat_wait_p99_seconds",
    "The 99th percentile, over the workers whose heartbeats this replica recorded in the last 10 s,"
    " of each one's longest round trip, as the workers report it (NaN: fewer than 10 workers); the"
    ' interval is at least the largest replica\'s (docs/design.md, "Heartbeat interval").',
)
WORKER_HEALTH_CHANGES = Counter(
    "stockade_worker_health_changes",
    "Worker health marks this replica's reconciler wrote (fenced), by change: marked, renewed (a "
    "run failed there after its mark, a probe's included), cleared (a run succeeded there, or the "
    "failures that earned the mark turned out to be the jobs').",
    ["change"],
)
ROUNDS = Counter("stockade_placer_rounds", "Placer rounds while leader, by outcome.", ["outcome"])


LAG_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
EVENT_LOOP_LAG_SECONDS = Histogram(
    "stockade_event_loop_lag_seconds",
    "How late a trio loop woke a task due at a given time (runtime.lag), by loop.",
    ["loop"],
    buckets=LAG_BUCKETS_S,
)
GC_PAUSE_SECONDS = Histogram(
    "stockade_gc_pause_seconds",
    "How long each garbage collection held every thread of the process (runtime.gcpause), by "
    "generation (2: a full collection).",
    ["generation"],
    buckets=LAG_BUCKETS_S,
)
GC_FROZEN_OBJECTS = Gauge(
    "stockade_gc_frozen_objects",
    "Objects in the collector's permanent generation, read after each full collection (runtime.gcpause).",
)

INGEST_SHED_REQUESTS = Counter(
    "stockade_ingest_shed_requests",
    "Requests the ingest refused as busy (RESOURCE_EXHAUSTED) without touching the database, "
    "by rpc (actors.admission).",
    ["rpc"],
)
INGEST_EXPIRED_REQUESTS = Counter(
    "stockade_ingest_expired_requests",
    "Requests the ingest did not start because their client's deadline had passed, by rpc.",
    ["rpc"],
)
INGEST_REPLAYED_REQUESTS = Counter(
    "stockade_ingest_replayed_requests",
    "Copies of a mutating call already carried out (same idempotency key, same request) that "
    "the ingest answered with the first answer and no effect, by rpc (actors.idempotency).",
    ["rpc"],
)
INGEST_STAGE_SECONDS = Histogram(
    "stockade_ingest_stage_seconds",
    "Where a request's time went inside the ingest, by rpc and stage: turn (waiting for its "
    "admission turn), database (taking a pooled connection and its database work).",
    ["rpc", "stage"],
    buckets=LAG_BUCKETS_S,
)


HEARTBEAT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0)
AGENT_HEARTBEAT_ROUND_TRIP_SECONDS = Histogram(
    "stockade_agent_heartbeat_round_trip_seconds",
    "Time from sending a heartbeat to taking its answer (the first replica's to answer), for "
    "every worker of this process; failed heartbeats are not counted.",
    buckets=HEARTBEAT_BUCKETS_S,
)
AGENT_SELF_FENCES = Counter(
    "stockade_agent_self_fences",
    "Self-fences: a worker stopped every job because no heartbeat was acknowledged in time.",
    ["worker_id"],
)
AGENT_PAUSES = Counter(
    "stockade_agent_pauses",
    "Pauses: a worker held every job because no heartbeat was acknowledged in time.",
    ["worker_id"],
)
AGENT_RESUMES = Counter(
    "stockade_agent_resumes",
    "Resumes: a paused worker let its jobs run on because a fresh heartbeat was acknowledged "
    "before the kill deadline.",
    ["worker_id"],
)
AGENT_HEARTBEAT_FAILURES = Counter(
    "stockade_agent_heartbeat_failures",
    "Heartbeats a worker sent that no control plane answered in time (each one is retried at the "
    "next interval; the fence deadline runs on meanwhile).",
    ["worker_id"],
)
AGENT_JOB_STARTS = Counter(
    "stockade_agent_job_starts",
    "Jobs a worker started (its start line written), by runtime: sleep, command or container.",
    ["worker_id", "runtime"],
)
AGENT_JOB_STOPS = Counter(
    "stockade_agent_job_stops",
    "Jobs that ended on a worker after they started (their stop line written), by reason: "
    "succeeded; failed, or the reason a failure names (oom_killed, timeout, workdir_not_found, "
    "workdir_denied, image_not_found, ...); cancelled (Cancel RPC); stopped_by_control_plane (a "
    "heartbeat reply ended it); self_fence (the worker's fence, its reaper's included); reregister; "
    "shutdown; restart.",
    ["worker_id", "reason"],
)
AGENT_ASSIGNMENTS_REFUSED = Counter(
    "stockade_agent_assignments_refused",
    "Assignment ids a worker refused (DESIGN.md invariant 5), by request (assign, cancel) and "
    "reason: wrong_worker, fenced, wrong_incarnation, stale_epoch, implausible_epoch, cancelled, "
    "bad_spec, no_room (no free capacity).",
    ["worker_id", "request", "reason"],
)
AGENT_DUPLICATE_ASSIGNMENTS = Counter(
    "stockade_agent_duplicate_assignments",
    "Assignment ids a worker was sent again in its current incarnation while it ran them or after "
    "they ended: acknowledged, not run twice (DESIGN.md invariant 5).",
    ["worker_id"],
)
AGENT_JOBS_WAITING_FOR_START_SLOT = Gauge(
    "stockade_agent_jobs_waiting_for_start_slot",
    "Accepted command jobs of this process waiting for a start slot (agent.starts).",
)
AGENT_OUTPUT_DROPPED_BYTES = Counter(
    "stockade_agent_output_dropped_bytes",
    "Bytes of jobs' output a worker dropped from the head of files over max_output_mb (agent.output).",
    ["worker_id"],
)
AGENT_LOG_READERS = Gauge(
    "stockade_agent_log_readers",
    "Worker.ReadLogs streams a worker is serving now (agent.logs).",
    ["worker_id"],
)
CP_LOG_STREAMS = Gauge(
    "stockade_cp_log_streams",
    "ReadJobLogs streams this control plane is relaying now (actors.logs).",
)

AUTH_REFUSALS = Counter(
    "stockade_auth_refusals",
    'Calls and connections this process refused for their identity, by rpc ("-" for a TLS '
    "handshake) and reason: tls_handshake (no client certificate, another CA, expired...), "
    "no_identity (a CA-signed certificate without a Stockade identity), role (the caller's "
    "role may not call this rpc), id (a worker acting for another worker's id).",
    ["rpc", "reason"],
)


LEASE_ELECTIONS = Counter(
    "stockade_lease_elections",
    "Lease takeovers this control plane won: each bumped the epoch and made it the leader.",
)
STEP_DOWN_CAUSES = ("deposed", "renewal_late", "main_loop_stalled", "epoch_superseded", "released")
"""The ``cause`` label values of :data:`LEASE_STEP_DOWNS`."""
LEASE_STEP_DOWNS = Counter(
    "stockade_lease_step_downs",
    "Times this control plane stopped leading, by cause: deposed (a renewal found the lease "
    "taken by another replica), renewal_late (no renewal succeeded within lease_ttl_s - "
    "step_down_margin_s), main_loop_stalled (the main loop did not run for max_main_loop_stall_s), "
    "epoch_superseded (a fenced write saw a newer epoch), released (a clean stop released the lease).",
    ["cause"],
)
LEASE_EPOCH = Gauge(
    "stockade_lease_epoch",
    "The epoch this control plane leads under; 0 while it is a standby.",
)
LEASE_RENEWAL_SECONDS = Histogram(
    "stockade_lease_renewal_seconds",
    "Time from sending a lease renewal to its answer (renewed, or found deposed), while this "
    "control plane leads; renewals that failed (no answer, an error) are not counted. The lease "
    "is lost when renewals take longer than lease_ttl_s - step_down_margin_s in all.",
    buckets=LAG_BUCKETS_S,
)
FENCED_WRITES_REFUSED = Counter(
    "stockade_fenced_writes_refused",
    "Fenced writes the database refused to this control plane (one row each in stale_writes), "
    "by write (commit_placements, declare_dead_workers, end_orphaned_assignments, end_assignments, "
    "settle_waiting_jobs, end_drained_assignments) and reason: stale_epoch (the fence read a newer "
    "epoch) or session_ended (the connection was lost while a newer epoch took over).",
    ["write", "reason"],
)
HEARTBEATS_RECORDED = Counter(
    "stockade_heartbeats_recorded",
    "Worker heartbeats this control plane recorded in the database for an alive incarnation "
    "(liveness, outcomes and running confirmations; liveness-only ones in groups of one statement, "
    "stockade_heartbeat_group_heartbeats).",
)
HEARTBEATS_REREGISTER = Counter(
    "stockade_heartbeats_reregister",
    "Worker heartbeats this control plane answered with reregister: the incarnation they name is "
    "no longer alive (declared dead, left or replaced), so nothing was recorded.",
)
HEARTBEAT_GROUP_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)
HEARTBEAT_GROUP_HEARTBEATS = Histogram(
    "stockade_heartbeat_group_heartbeats",
    "Heartbeats in one group recorded by one statement (record_heartbeats; actors.heartbeat_group), "
    "per group this control plane's ingest recorded or tried to.",
    buckets=HEARTBEAT_GROUP_BUCKETS,
)
HEARTBEAT_GROUP_STATEMENTS = Counter(
    "stockade_heartbeat_group_statements",
    "Statements this control plane's ingest ran to record a group of heartbeats, by result: "
    "recorded, failed (every member got the error).",
    ["result"],
)
RECONCILE_PASS_SECONDS = Histogram(
    "stockade_reconcile_pass_seconds",
    "Duration of a reconcile pass while leader (dead workers, unconfirmed and orphaned "
    "assignments, cancels, timeouts, drains; the cancellations it starts on workers run on, not "
    "waited for); "
    "passes refused or failed too.",
    buckets=LAG_BUCKETS_S,
)
RECONCILE_STEP_SECONDS = Histogram(
    "stockade_reconcile_step_seconds",
    "Time of one step of a reconcile pass while leader, by step: ages (reading heartbeat ages), "
    "declare (declaring dead workers and ending orphans, fenced), deliveries (reading unconfirmed "
    "assignments and handing re-sends to the dispatcher), cancels (reading what to cancel and "
    "starting the cancellations), settle (waiting jobs), health, policy (heartbeat interval).",
    ["step"],
    buckets=LAG_BUCKETS_S,
)
RECONCILE_PASSES = Counter(
    "stockade_reconcile_passes",
    "Reconcile passes while leader, by outcome: done, deposed (a fenced write was refused), "
    "failed (the database did not answer).",
    ["outcome"],
)
SCHEDULE_SLOTS = Counter(
    "stockade_schedule_slots",
    "Slots of schedules this control plane recorded while leader, by outcome: fired (a job "
    "inserted with it), skipped (missed past the starting deadline, forbid, superseded).",
    ["outcome"],
)
CLUSTER_LIVE_WORKERS = Gauge(
    "stockade_cluster_live_workers",
    "Live workers (cordoned ones included) the leader's placer read in its last round; 0 on a standby.",
)
CLUSTER_CPU_CAPACITY_MILLIS = Gauge(
    "stockade_cluster_cpu_capacity_millis",
    "CPU the live workers offer, in millicores, summed, as the leader's placer read it in its last "
    "round; 0 on a standby.",
)
CLUSTER_CPU_ALLOCATED_MILLIS = Gauge(
    "stockade_cluster_cpu_allocated_millis",
    "CPU the active assignments hold on the live workers, in millicores, summed, as the leader's "
    "placer read it in its last round (before placing); 0 on a standby.",
)
CLUSTER_MEMORY_CAPACITY_MB = Gauge(
    "stockade_cluster_memory_capacity_mb",
    "Memory the live workers offer, in MiB, summed, as the leader's placer read it in its last "
    "round; 0 on a standby.",
)
CLUSTER_MEMORY_ALLOCATED_MB = Gauge(
    "stockade_cluster_memory_allocated_mb",
    "Memory the active assignments hold on the live workers, in MiB, summed, as the leader's "
    "placer read it in its last round (before placing); 0 on a standby.",
)


def set_cluster_packing(
    *, workers: int, cpu_millis: int, cpu_allocated_millis: int, memory_mb: int, memory_allocated_mb: int
) -> None:
    """Set the cluster packing gauges (``CLUSTER_*``; all 0 on a standby)."""
    CLUSTER_LIVE_WORKERS.set(workers)
    CLUSTER_CPU_CAPACITY_MILLIS.set(cpu_millis)
    CLUSTER_CPU_ALLOCATED_MILLIS.set(cpu_allocated_millis)
    CLUSTER_MEMORY_CAPACITY_MB.set(memory_mb)
    CLUSTER_MEMORY_ALLOCATED_MB.set(memory_allocated_mb)


WORKER_STATES = ("registering", "live", "paused", "self_fenced")
"""The ``state`` label values of ``stockade_agent_fence_state``."""


@attrs.frozen(kw_only=True)
class WorkerReading:
    """What one worker's scrape-time gauges show (:class:`WorkerGauges`)."""

    jobs_running: int
    """Jobs started and not ended yet (those waiting for a start slot are not counted)."""
    heartbeat_ack_age_s: float | None
    """Seconds since the send of the newest heartbeat (or registration) a control plane
    acknowledged: the fence deadline is that send plus ``fence_after_s``. None before the first."""
    fence_after_s: float
    """The self-fence span in force, in seconds."""
    state: str
    """One of :data:`WORKER_STATES`."""


class WorkerGauges(Collector):
    """Gauges of every worker of this process (:meth:`collect`), read from its agent when
    Prometheus scrapes, so that the heartbeat path pays nothing for them. A reader runs on the
    metrics server's thread: it must only read plain attributes, and must not raise.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readers: dict[str, Callable[[], WorkerReading]] = {}

    def watch(self, worker_id: str, read: Callable[[], WorkerReading]) -> None:
        """Show ``read()`` as ``worker_id``'s gauges from now on (replacing an earlier reader)."""
        with self._lock:
            self._readers[worker_id] = read

    def forget(self, worker_id: str, read: Callable[[], WorkerReading]) -> None:
        """Stop showing ``worker_id``'s gauges, if ``read`` is still the reader shown."""
        with self._lock:
            if self._readers.get(worker_id) == read:
                del self._readers[worker_id]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            readers = sorted(self._readers.items())
        running = GaugeMetricFamily(
            "stockade_agent_jobs_running",
            "Jobs a worker runs now: started and not ended (a job waiting for a start slot is not counted).",
            labels=["worker_id"],
        )
        age = GaugeMetricFamily(
            "stockade_agent_heartbeat_ack_age_seconds",
            "Seconds since a worker sent the newest heartbeat (or registration) a control plane "
            "acknowledged; its jobs pause when this reaches stockade_agent_fence_after_seconds.",
            labels=["worker_id"],
        )
        fence_after = GaugeMetricFamily(
            "stockade_agent_fence_after_seconds",
            "The self-fence span a worker applies, in seconds (self_fence_after_s, or less when "
            "the control planes' dead_after_s leaves too small a margin).",
            labels=["worker_id"],
        )
        state = GaugeMetricFamily(
            "stockade_agent_fence_state",
            "1 for a worker's current state, 0 for the others: registering (not registered yet, "
            "or registering again), live, paused (jobs held: no heartbeat acknowledged in time), "
            "self_fenced (jobs killed).",
            labels=["worker_id", "state"],
        )
        for worker_id, read in readers:
            reading = read()
            running.add_metric([worker_id], reading.jobs_running)
            if reading.heartbeat_ack_age_s is not None:
                age.add_metric([worker_id], reading.heartbeat_ack_age_s)
            fence_after.add_metric([worker_id], reading.fence_after_s)
            for name in WORKER_STATES:
                state.add_metric([worker_id, name], 1.0 if name == reading.state else 0.0)
        yield from (running, age, fence_after, state)


WORKER_GAUGES = WorkerGauges()
REGISTRY.register(WORKER_GAUGES)


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Serve /metrics on ``host``:``port`` from a background thread (``host``: the process's
    own listen address, 127.0.0.1 on a machine, the container's address in a container)."""
    start_http_server(port, addr=host)


DATABASE_CONNECTIONS_LOST = Counter(
    "stockade_database_connections_lost",
    "Pooled database connections dropped after a call on them failed (reset, unanswered within "
    "the call timeout, a session the server ended, a standby), by the pool's owner.",
    ["owner"],
)
DATABASE_TRANSACTION_RETRIES = Counter(
    "stockade_database_transaction_retries",
    "Transactions run again from their start after a schema change invalidated a cached "
    "statement (asyncpg InvalidCachedStatementError, OutdatedSchemaCacheError), by what ran.",
    ["what"],
)


DATABASE_OLDEST_TRANSACTION_SECONDS = Gauge(
    "stockade_database_oldest_transaction_seconds",
    "Age of the oldest transaction open in Stockade's database (any client's but the sampling "
    "session's; an idle one left open counts), as this control plane last sampled it "
    "(actors.database_watch); 0 when none is open. While one is open, vacuum cannot remove the "
    "row versions updated since it began.",
)
DATABASE_DEAD_ROWS = Gauge(
    "stockade_database_dead_rows",
    "Dead row versions of a table Stockade updates often (workers, jobs, assignments, lease), not "
    "yet removed by vacuum, as PostgreSQL's statistics last counted them (n_dead_tup) when this "
    "control plane sampled them, by table.",
    ["table"],
)
DATABASE_LIVE_ROWS = Gauge(
    "stockade_database_live_rows",
    "Live rows of a table Stockade updates often, as PostgreSQL's statistics last counted them "
    "(n_live_tup) when this control plane sampled them, by table.",
    ["table"],
)
