"""Prometheus metrics of a Stockade process (prometheus-client), served on ``--metrics-port``.

The placer's round time is a histogram with fine buckets; quantiles are estimated from it by
linear interpolation within a bucket, as Prometheus' ``histogram_quantile`` does
(prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

ROUND_BUCKETS_S = (
    0.0005,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.004,
    0.005,
    0.006,
    0.008,
    0.01,
    0.0125,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
    2.0,
    5.0,
)

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
ROUNDS = Counter("stockade_placer_rounds", "Placer rounds while leader, by outcome.", ["outcome"])


LAG_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
EVENT_LOOP_LAG_SECONDS = Histogram(
    "stockade_event_loop_lag_seconds",
    "How late a trio loop woke a task due at a given time (runtime.lag), by loop.",
    ["loop"],
    buckets=LAG_BUCKETS_S,
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
