"""Every SQL statement the control plane runs, by name.

Writes appear only in two places: the ledger (fenced: placements, endings, dead workers) and
ingest (unfenced: submissions, cancels, registrations, heartbeats, presence, and the sweep of
expired idempotency keys). Reads are used by the lease keeper, placer, reconciler and ingest.
Durations are passed as float seconds and turned into intervals with ``make_interval(secs =>
$n)``; all times are the database's ``now()``.

A job's spec is stored in the columns of ``jobs``: :func:`job_spec_of` reads it from a row and
:func:`job_columns` gives the columns a spec is stored in, the one place the runtimes meet SQL.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from runtime.jobs import CommandRuntime, JobRuntime, JobSpec, SleepRuntime

# ---------------------------------------------------------------- a job's spec in ``jobs``


def job_spec_of(row: Mapping[str, Any]) -> JobSpec:
    """The spec of a job from a row with its ``name``, ``cpu_millis``, ``memory_mb``,
    ``priority``, ``runtime``, ``sleep_ms`` and ``argv`` (of :data:`GET_JOB`,
    :data:`COMMIT_PLACEMENTS` with the argv of :data:`JOB_ARGVS`, :data:`UNCONFIRMED_ASSIGNMENTS`).

    ``runtime`` is ``'sleep'`` (``sleep_ms``: the duration) or ``'command'`` (``argv``); the
    column that does not belong to the runtime is NULL and not read.

    Raises:
        ValueError: ``runtime`` names no known runtime.
    """
    name, cpu_millis, memory_mb, priority = row["name"], row["cpu_millis"], row["memory_mb"], row["priority"]
    runtime: JobRuntime
    match row["runtime"]:
        case SleepRuntime.kind:
            runtime = SleepRuntime(duration_ms=int(row["sleep_ms"] or 0))
        case CommandRuntime.kind:
            runtime = CommandRuntime(argv=row["argv"] or ())
        case other:  # schema.sql's CHECK on jobs.runtime admits no other
            raise ValueError(f"jobs.runtime {other!r} is not a runtime this control plane knows")
    return JobSpec(
        name=name,
        cpu_millis=int(cpu_millis),
        memory_mb=int(memory_mb),
        priority=int(priority),
        runtime=runtime,
    )


@attrs.frozen
class JobColumns:
    """A spec as the columns of ``jobs`` it is stored in: parameters $1-$7 of :data:`SUBMIT_JOB`."""

    name: str
    cpu_millis: int
    memory_mb: int
    priority: int
    runtime: str
    """``'sleep'`` or ``'command'`` (the runtime's ``kind``)."""
    sleep_ms: int | None
    """A sleep's duration in milliseconds; None for another runtime."""
    argv: list[str] | None
    """A command's argv; None for another runtime."""


def job_columns(spec: JobSpec) -> JobColumns:
    """The columns ``spec`` is stored in; it must have a runtime (a checked spec has one).

    Raises:
        ValueError: ``spec.runtime`` is None.
    """
    sleep_ms: int | None = None
    argv: list[str] | None = None
    match spec.runtime:
        case SleepRuntime(duration_ms=duration_ms):
            sleep_ms = duration_ms
        case CommandRuntime(argv=command):
            argv = list(command)
        case None:
            raise ValueError(f"job {spec.name!r} has no runtime: check it before storing it")
    return JobColumns(
        spec.name, spec.cpu_millis, spec.memory_mb, spec.priority, spec.runtime.kind, sleep_ms, argv
    )


def job_column_arrays(specs: Sequence[JobSpec]) -> tuple[list[Any], ...]:
    """The columns of many specs as parameters $1-$7 of :data:`SUBMIT_JOBS`: one array per
    column, argv as JSON text (a ``text[]`` cannot hold arrays of different lengths).

    Raises:
        ValueError: a spec has no runtime.
    """
    columns = [job_columns(spec) for spec in specs]
    return (
        [c.name for c in columns],
        [c.cpu_millis for c in columns],
        [c.memory_mb for c in columns],
        [c.priority for c in columns],
        [c.runtime for c in columns],
        [c.sleep_ms for c in columns],
        [None if c.argv is None else json.dumps(c.argv) for c in columns],
    )


# ---------------------------------------------------------------- schema

SCHEMA_LOCK_KEY = 0x53544F43  # "STOC": serialises concurrent schema application
APPLY_SCHEMA_LOCK = "SELECT pg_advisory_lock($1)"
APPLY_SCHEMA_UNLOCK = "SELECT pg_advisory_unlock($1)"
# Which schema.sql the database holds (its sha256), so an unchanged schema is not applied
# again: some statements take strong locks even when they change nothing.
SCHEMA_VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_version (id int PRIMARY KEY CHECK (id = 1), sha256 text)"
)
SCHEMA_VERSION = "SELECT sha256 FROM schema_version WHERE id = 1"
RECORD_SCHEMA_VERSION = """
INSERT INTO schema_version (id, sha256) VALUES (1, $1)
ON CONFLICT (id) DO UPDATE SET sha256 = EXCLUDED.sha256
"""

# ---------------------------------------------------------------- lease keeper

# Namespace of the session-level advisory lock (LEASE_LOCK_SPACE, epoch) that the leader of an
# epoch holds on its lease connection for its whole reign. PostgreSQL releases it the moment
# that session ends, so a standby that can take the lock knows the leader's session is gone.
LEASE_LOCK_SPACE = 0x53544B  # "STK"

# One standby poll: the lease, whether it expired by database time, and whether its holder's
# session is gone (the try-lock succeeds; the caller then holds the lock and must release it).
PROBE_LEASE = """
SELECT epoch, expires_at < now() AS expired,
       pg_try_advisory_lock($1, epoch::int) AS orphaned
  FROM lease WHERE id = 1
"""

# $1 holder, $2 ttl_s, $3 the epoch probed, $4 whether its holder's session is gone.
# Takes the lease if it is still at that epoch and has expired or lost its holder's session;
# bumps the epoch, appends the reign to lease_history and takes the new epoch's advisory lock,
# all in this one statement, so no standby can see the new epoch before its lock is held.
TAKE_OVER_LEASE = f"""
WITH previous AS (SELECT holder FROM lease WHERE id = 1),
taken AS (
    UPDATE lease
       SET holder = $1, epoch = epoch + 1, expires_at = now() + make_interval(secs => $2)
     WHERE id = 1 AND epoch = $3 AND (expires_at < now() OR $4::boolean)
 RETURNING epoch, holder
),
history AS (
    INSERT INTO lease_history (epoch, holder, acquired_at, previous)
    SELECT taken.epoch, taken.holder, now(), (SELECT holder FROM previous) FROM taken
)
SELECT epoch, pg_advisory_lock({LEASE_LOCK_SPACE}, epoch::int) IS NULL AS locked FROM taken
"""

# $1 lock space, $2 epoch.
TRY_LEASE_LOCK = "SELECT pg_try_advisory_lock($1, $2::int)"
UNLOCK_LEASE_LOCK = "SELECT pg_advisory_unlock($1, $2::int)"

# $1 holder, $2 epoch, $3 ttl_s. No row back: someone else holds the lease now.
RENEW_LEASE = """
UPDATE lease SET expires_at = now() + make_interval(secs => $3)
 WHERE id = 1 AND holder = $1 AND epoch = $2
RETURNING epoch
"""

# $1 holder, $2 epoch. A clean shutdown hands the lease over at once.
RELEASE_LEASE = """
UPDATE lease SET expires_at = '-infinity'
 WHERE id = 1 AND holder = $1 AND epoch = $2
"""

READ_LEASE = """
SELECT holder, epoch, expires_at > now() AS live,
       extract(epoch FROM expires_at - now())::float8 AS remaining_s
  FROM lease WHERE id = 1
"""

# ---------------------------------------------------------------- ledger (fenced)

# The fence: same transaction as the writes. A takeover's UPDATE of this row (it changes the
# epoch, a key: schema.sql, lease_epoch_key) waits until the transaction holding the key-share
# lock commits or aborts; the leader's renewal (it changes only expires_at) does not.
FENCE_EPOCH = "SELECT epoch FROM lease WHERE id = 1 FOR KEY SHARE"

# One round's placements as one fenced statement: the fence, the claim, the assignments and
# the pending reasons commit together in one round trip (the statement is its own transaction).
# $1 job ids, $2 worker ids, $3 incarnations, $4 epoch, $5 fenced (always true but in the
# test-only negative control), $6 job ids and $7 reasons to store on jobs left pending.
#
# The share lock on the lease row is taken before any row is written: every written row comes
# from ``p`` or ``r``, which read ``allowed``, which reads ``fence``. Under READ COMMITTED a
# FOR KEY SHARE read of a row a takeover changed after this statement's snapshot returns the newest
# version, so a replaced leader sees the newer epoch and writes nothing; a takeover that comes
# later waits for the share lock until this statement commits. Claims only jobs still pending
# (invariant 3) on workers still alive in that incarnation. Returns one row with ``epoch_seen``
# and no assignment when nothing was placed, else one row per assignment created: small rows
# only (a command's argv, up to 64 KiB, is read by JOB_ARGVS after the commit), so the server
# never holds the share lock while it waits to hand a large result to a client that froze.
#
# Linear in the placements, as every fenced write must be (it holds the share lock throughout):
# ``claimed`` draws each assignment's id itself, so the result needs no join of ``created`` with
# ``claimed``. A CTE has no index and, planned generically, such a join is a nested loop: with
# 2,000 placements it took 350 of the statement's 384 ms. The reasons skip placed jobs with a
# hashed ``NOT IN`` (``<> ALL`` compared every reason with every placement).
COMMIT_PLACEMENTS = """
WITH fence AS (
    SELECT epoch FROM lease WHERE id = 1 FOR KEY SHARE
),
allowed AS (
    SELECT epoch FROM fence WHERE epoch = $4 OR NOT $5::boolean
),
p AS (
    SELECT p.*
      FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS p(job_id, worker_id, incarnation), allowed
),
claimed AS (
    UPDATE jobs j
       SET state = 'assigned', reason = '', attempts = j.attempts + 1
      FROM p JOIN workers w ON w.id = p.worker_id AND w.incarnation = p.incarnation
                           AND w.state = 'alive'
     WHERE j.id = p.job_id AND (j.state = 'pending' OR NOT $5::boolean)
 RETURNING nextval('assignments_id_seq') AS assignment_id, j.id, p.worker_id, p.incarnation,
           j.cpu_millis, j.memory_mb, j.name, j.priority, j.runtime, j.sleep_ms,
           j.argv IS NOT NULL AS has_argv
),
created AS (
    INSERT INTO assignments (id, job_id, worker_id, worker_incarnation, cpu_millis, memory_mb, epoch)
    SELECT assignment_id, id, worker_id, incarnation, cpu_millis, memory_mb, $4 FROM claimed
),
reasons AS (
    -- Only pending jobs carry a reason; never a job this statement places.
    UPDATE jobs j SET reason = r.reason
      FROM unnest($6::bigint[], $7::text[]) AS r(id, reason), allowed
     WHERE j.id = r.id AND j.state = 'pending' AND j.reason IS DISTINCT FROM r.reason
       AND j.id NOT IN (SELECT unnest($1::bigint[]))
)
SELECT fence.epoch AS epoch_seen, claimed.*
  FROM fence LEFT JOIN claimed ON true
"""

# $1 job ids. The commands of command jobs, read after their placement committed.
JOB_ARGVS = "SELECT id, argv FROM jobs WHERE id = ANY($1::bigint[])"

# Workers judged by their silence: every 'alive' row, and a 'left' row that still has active
# assignments: of another incarnation, since the leader ends the left one's at once. Only a
# registration the agent running them did not send (a late copy, another process claiming the
# worker id) followed by a leave makes such a row; if that agent lives, its next heartbeat
# (answered "register again") stops them, and if it is gone, nothing else would ever end them:
# silence judges it, as any worker.
_JUDGED = """(w.state = 'alive'
        OR (w.state = 'left'
            AND EXISTS (SELECT 1 FROM assignments a WHERE a.worker_id = w.id AND a.state = 'active')))"""

# $1 epoch, $2 dead_after_s, $3 worker ids, $4 incarnations. Re-judged by database time on
# heartbeats any replica recorded, so a heartbeat that landed after the reconciler's read wins.
DECLARE_DEAD_WORKERS = f"""
WITH dead AS (
    UPDATE workers w SET state = 'dead', dead_at = now(), dead_epoch = $1
      FROM unnest($3::text[], $4::bigint[]) AS c(id, incarnation)
     WHERE w.id = c.id AND w.incarnation = c.incarnation AND {_JUDGED}
       AND w.last_heartbeat_at < now() - make_interval(secs => $2)
 RETURNING w.id, w.incarnation, w.last_heartbeat_at
),
logged AS (
    INSERT INTO worker_deaths (worker_id, incarnation, epoch, last_heartbeat_at)
    SELECT id, incarnation, $1, last_heartbeat_at FROM dead
)
SELECT id FROM dead
"""

# The writing transaction's id, as stored in jobs.pending_xid whenever a job becomes pending
# (the column's default covers inserts; see schema.sql and actors/placer.py, PendingMark).
_THIS_XID = "pg_current_xact_id()::text::bigint"

# Requeue backoff, for the two requeues after a loss (END_ORPHANED_ASSIGNMENTS and the
# withdrawal of unconfirmed assignments in END_CANCELLED_ASSIGNMENTS): a CTE ``backoff`` with
# each ended job's not_before, ``now() + random() * cap``, the cap of its loss count taken from
# the array parameter {caps} (:func:`actors.reconciler.backoff_caps_s`: entry k is the cap after
# the k-th loss, the last one serves every later loss; an empty array means no backoff). Full
# jitter ("Exponential Backoff And Jitter", AWS Architecture Blog, 2015), by database time, so a
# new leader honours it. The job's reason says until when (UTC). {clean}, an expression over
# ``ended``, marks the jobs whose assignment ended because their worker stopped cleanly: not a
# loss, so no backoff (``not_before`` NULL, ``clean`` true). The requeue that follows reads
# ``backoff`` alone (one row per ended job): joining it with ``ended`` as well, two CTEs, was a
# nested loop that took 560 of 598 ms when 2,000 assignments ended at once.
_REQUEUE_BACKOFF = """backoff AS (
    SELECT j.id, {clean} AS clean,
           CASE WHEN {clean} THEN NULL ELSE now() + make_interval(
               secs => random() * ({caps}::float8[])[least(j.losses + 1, cardinality({caps}::float8[]))]
           ) END AS not_before
      FROM jobs j JOIN ended ON j.id = ended.job_id
)"""
_BACKOFF_REASON = (
    "'backoff: placed again after ' || to_char(b.not_before AT TIME ZONE 'UTC', 'HH24:MI:SS.MS') || ' UTC'"
)

# $1 epoch, $2 requeue backoff caps (seconds; see _REQUEUE_BACKOFF), $3 most assignments to
# end. Ends active assignments whose worker is dead, has left or has registered again, the $3
# oldest of them, and requeues their jobs (or finishes the cancellation of jobs whose cancel
# was requested). Those of a dead or re-registered worker end as lost, and the job counts one
# more loss and waits a backoff; those of the incarnation that left (its agent stopped every job
# before it said so: queries.LEAVE_WORKER) end as stopped ('worker_left'), and the job is placed
# again at once, not counted as lost. ``more`` is true when $3 were
# found: some may be left for the next batch. The bound keeps the fenced transaction short (see
# actors/ledger.py). An assignment that a heartbeat ended meanwhile is skipped: the UPDATE
# re-checks ``state`` on the row's newest version.
# A registration alone does not end the previous incarnation's assignments: only once the new
# incarnation has heartbeated (last_heartbeat_at past registered_at, both set by the
# registration). An agent stops every job before it registers, so the agent that heartbeats
# under the new incarnation has stopped the old one's; but a registration its agent did not
# send (a late copy of an older one, or another process claiming the worker id) starts an
# incarnation no agent heartbeats under, and the agent still running the old incarnation's
# jobs learns of it only from its next heartbeat's answer (register again), which stops them
# first. A dead worker's assignments end at once: it fenced itself before dead_after. So do
# those of the incarnation that left, which stopped them before it left; a left row's older
# incarnations' assignments follow the rule of a registration (the leave does not move
# last_heartbeat_at).
END_ORPHANED_ASSIGNMENTS = f"""
WITH orphaned AS (
    SELECT a.id, CASE WHEN w.state = 'dead' THEN 'worker_dead'
                      WHEN w.state = 'left' AND w.incarnation = a.worker_incarnation THEN 'worker_left'
                      ELSE 'worker_restarted' END AS reason
      FROM assignments a JOIN workers w ON w.id = a.worker_id
     WHERE a.state = 'active'
       AND (w.state = 'dead'
            OR (w.state = 'left' AND w.incarnation = a.worker_incarnation)
            OR (w.incarnation <> a.worker_incarnation AND w.last_heartbeat_at > w.registered_at))
     ORDER BY a.id
     LIMIT $3
),
ended AS (
    UPDATE assignments a
       SET state = CASE WHEN o.reason = 'worker_left' THEN 'stopped' ELSE 'lost' END,
           ended_at = now(), ended_epoch = $1, end_reason = o.reason
      FROM orphaned o
     WHERE a.id = o.id AND a.state = 'active'
 RETURNING a.id, a.job_id, a.end_reason
),
{_REQUEUE_BACKOFF.format(caps="$2", clean="ended.end_reason = 'worker_left'")},
requeued AS (
    UPDATE jobs j
       SET state = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'pending' END,
           finished_at = CASE WHEN j.cancel_requested THEN now() ELSE NULL END,
           started_at = NULL,
           pending_seq = CASE WHEN j.cancel_requested THEN j.pending_seq ELSE nextval('pending_seq') END,
           pending_xid = CASE WHEN j.cancel_requested THEN j.pending_xid ELSE {_THIS_XID} END,
           losses = CASE WHEN b.clean THEN j.losses ELSE j.losses + 1 END,
           not_before = CASE WHEN j.cancel_requested THEN j.not_before ELSE b.not_before END,
           reason = CASE WHEN j.cancel_requested OR b.not_before IS NULL THEN j.reason
                         ELSE {_BACKOFF_REASON} END
      FROM backoff b
     WHERE j.id = b.id AND j.state IN ('assigned', 'running')
 RETURNING j.id, j.state
)
SELECT (SELECT coalesce(array_agg(id), '{{}}') FROM ended) AS ended_ids,
       (SELECT coalesce(array_agg(id), '{{}}') FROM requeued WHERE state = 'pending') AS requeued_ids,
       (SELECT count(*) FROM orphaned) = $3 AS more
"""

# $1 epoch, $2 assignment ids, $3 end reason, $4 requeue, $5 requeue backoff caps (seconds; see
# _REQUEUE_BACKOFF). Only for assignments whose worker acknowledged the cancel: the job runs
# nowhere now. A requeue (an unconfirmed assignment withdrawn) counts as a loss of the job.
END_CANCELLED_ASSIGNMENTS = f"""
WITH ended AS (
    UPDATE assignments
       SET state = 'cancelled', ended_at = now(), ended_epoch = $1, end_reason = $3
     WHERE id = ANY($2::bigint[]) AND state = 'active'
 RETURNING id, job_id
),
{_REQUEUE_BACKOFF.format(caps="$5", clean="false")},
jobs_ended AS (
    UPDATE jobs j
       SET state = CASE WHEN $4 AND NOT j.cancel_requested THEN 'pending' ELSE 'cancelled' END,
           finished_at = CASE WHEN $4 AND NOT j.cancel_requested THEN NULL ELSE now() END,
           started_at = CASE WHEN $4 AND NOT j.cancel_requested THEN NULL ELSE j.started_at END,
           pending_seq = CASE WHEN $4 AND NOT j.cancel_requested THEN nextval('pending_seq')
                              ELSE j.pending_seq END,
           pending_xid = CASE WHEN $4 AND NOT j.cancel_requested THEN {_THIS_XID}
                              ELSE j.pending_xid END,
           losses = CASE WHEN $4 THEN j.losses + 1 ELSE j.losses END,
           not_before = CASE WHEN $4 AND NOT j.cancel_requested THEN b.not_before ELSE j.not_before END,
           reason = CASE WHEN $4 AND NOT j.cancel_requested AND b.not_before IS NOT NULL
                         THEN {_BACKOFF_REASON} ELSE j.reason END
      FROM backoff b
     WHERE j.id = b.id AND j.state IN ('assigned', 'running')
)
SELECT id FROM ended
"""

# $1 holder, $2 epoch, $3 epoch_seen, $4 what. Written after a refused fenced write.
RECORD_STALE_WRITE = """
INSERT INTO stale_writes (holder, epoch, epoch_seen, what) VALUES ($1, $2, $3, $4)
"""

# ---------------------------------------------------------------- placer (reads)

# $1 worker_fresh_s. Live workers with their allocation and their send window's counters (kept
# by the assignments triggers in worker_allocations).
LIVE_WORKERS = """
SELECT w.id, w.address, w.incarnation, w.cpu_millis, w.memory_mb, a.cpu_allocated_millis,
       a.memory_allocated_mb, a.unconfirmed_assignments, a.confirmed_assignments
  FROM workers w JOIN worker_allocations a ON a.worker_id = w.id
 WHERE w.state = 'alive' AND w.last_heartbeat_at > now() - make_interval(secs => $1)
"""

# How long (s, database time) a pending job must still wait for its requeue backoff; NULL: none.
_WAIT_S = "greatest(extract(epoch FROM not_before - now()), 0)::float8 AS wait_s"

# The snapshot a statement reads in (pg_current_snapshot() is the statement's own), as the
# placer's PendingMark needs it: xmax, the first transaction id not yet assigned, and xip, the
# transactions in progress. xid8 values travel as bigint (they stay below 2^63).
_SNAPSHOT = """pg_snapshot_xmax(snap.s)::text::bigint AS snapshot_xmax,
       ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(snap.s) x) AS snapshot_xip"""

_PENDING_COLUMNS = """array_agg(id) AS p_id, array_agg(cpu_millis) AS p_cpu_millis,
               array_agg(memory_mb) AS p_memory_mb, array_agg(priority) AS p_priority,
               array_agg(reason) AS p_reason, array_agg(pending_xid) AS p_pending_xid,
               array_agg(pending_seq) AS p_pending_seq, array_agg(wait_s) AS p_wait_s"""

_PENDING_ROW = f"id, cpu_millis, memory_mb, priority, reason, pending_xid, pending_seq, {_WAIT_S}"

# $1 limit. Every pending job (the placer's full resync), highest priority first, then
# submission order, with the transaction and the sequence number of its becoming pending and
# its backoff wait; as parallel arrays in one row (NULL when there are none), with the
# snapshot the statement read in (_SNAPSHOT).
PENDING_JOBS = f"""
SELECT p.*, {_SNAPSHOT}
  FROM (SELECT {_PENDING_COLUMNS}
          FROM (SELECT {_PENDING_ROW} FROM jobs WHERE state = 'pending'
                 ORDER BY priority DESC, id LIMIT $1) ps) p,
       (SELECT pg_current_snapshot() AS s) snap
"""

# $1 worker_fresh_s, $2 $3 the mark (pending_xid, pending_seq), $4 limit, $5 the mark's
# transactions in flight. One round's reads in one round trip, as parallel arrays in one row
# (an array is NULL when it has no rows), with the snapshot they were read in: LIVE_WORKERS;
# the jobs that became pending after the mark, in (pending_xid, pending_seq) order, up to the
# limit; and those at or below the mark made pending by a transaction that was still in flight
# at the previous read (see actors/placer.py, PendingMark).
ROUND_READ = f"""
SELECT w.*, p.*, {_SNAPSHOT}
  FROM (SELECT array_agg(w.id) AS w_id, array_agg(w.address) AS w_address,
               array_agg(w.incarnation) AS w_incarnation, array_agg(w.cpu_millis) AS w_cpu_millis,
               array_agg(w.memory_mb) AS w_memory_mb,
               array_agg(a.cpu_allocated_millis) AS w_cpu_allocated_millis,
               array_agg(a.memory_allocated_mb) AS w_memory_allocated_mb,
               array_agg(a.unconfirmed_assignments) AS w_unconfirmed_assignments,
               array_agg(a.confirmed_assignments) AS w_confirmed_assignments
          FROM workers w JOIN worker_allocations a ON a.worker_id = w.id
         WHERE w.state = 'alive'
           AND w.last_heartbeat_at > now() - make_interval(secs => $1::float8)) w,
       (SELECT {_PENDING_COLUMNS}
          FROM ((SELECT {_PENDING_ROW}
                   FROM jobs WHERE state = 'pending' AND (pending_xid, pending_seq) > ($2, $3)
                  ORDER BY pending_xid, pending_seq LIMIT $4)
                UNION ALL
                (SELECT {_PENDING_ROW}
                   FROM jobs WHERE state = 'pending' AND pending_xid = ANY($5::bigint[])
                    AND (pending_xid, pending_seq) <= ($2, $3))) ps) p,
       (SELECT pg_current_snapshot() AS s) snap
"""

# $1 job ids. Those no longer pending.
NO_LONGER_PENDING = "SELECT id FROM jobs WHERE id = ANY($1::bigint[]) AND state <> 'pending'"

# ---------------------------------------------------------------- reconciler (reads)

# Alive workers and how long ago (database time) their last heartbeat was recorded.
HEARTBEAT_AGES = f"""
SELECT w.id, w.incarnation, extract(epoch FROM now() - w.last_heartbeat_at)::float8 AS age_s
  FROM workers w WHERE {_JUDGED}
"""

_ASSIGNMENT_PAYLOAD = """
SELECT a.id AS assignment_id, a.job_id, a.worker_id, a.worker_incarnation AS incarnation,
       a.epoch, w.address, j.name, j.cpu_millis, j.memory_mb, j.priority, j.runtime, j.sleep_ms, j.argv,
       extract(epoch FROM now() - a.created_at)::float8 AS age_s
  FROM assignments a
  JOIN workers w ON w.id = a.worker_id
  JOIN jobs j ON j.id = a.job_id
"""

# Active assignments no heartbeat has confirmed, on live workers of the right incarnation.
UNCONFIRMED_ASSIGNMENTS = (
    _ASSIGNMENT_PAYLOAD
    + """
 WHERE a.state = 'active' AND a.confirmed_at IS NULL
   AND w.state = 'alive' AND w.incarnation = a.worker_incarnation
 ORDER BY a.id
"""
)

# Active assignments of jobs a user asked to cancel.
CANCEL_REQUESTED_ASSIGNMENTS = (
    _ASSIGNMENT_PAYLOAD
    + """
 WHERE a.state = 'active' AND j.cancel_requested
   AND w.state = 'alive' AND w.incarnation = a.worker_incarnation
 ORDER BY a.id
"""
)

# ---------------------------------------------------------------- ingest (unfenced writes)


def once(rpc: str, effect: str, *, params: int) -> str:
    """A mutating call's statement, carried out at most once per idempotency key
    (:mod:`actors.idempotency`): ``effect`` (a data-modifying statement with ``params``
    parameters that writes only when the CTE ``fresh`` has a row, and returns the rows that
    make up the call's answer) wrapped so that one statement, one transaction:

    - reads the key's row (``prior``, in the statement's snapshot);
    - carries out the effect only when there is none (``fresh``);
    - stores the key, ``rpc``, the request's digest and the effect's rows as JSON (the answer),
      when the effect returned any (a call that changed nothing, such as a cancel of an
      unknown job, stores no key either);
    - returns one row: ``replayed`` (the key was stored already), ``rpc`` and
      ``request_sha256`` of the stored call (NULL when not replayed), and ``answer``, the
      stored answer or the new one.

    Parameters: the effect's ``$1 .. $params``, then the key and the request's sha256. A copy
    that stored the key after this statement's snapshot was taken makes the key's INSERT wait
    for it and then break the primary key (``idempotency_keys_pkey``): the statement rolls back
    whole, effect included, and the caller runs it again to get the stored answer. A copy
    still in progress makes it wait at most the session's ``lock_timeout``.
    """
    if not rpc.isidentifier():
        raise ValueError(f"rpc must be a method name, got {rpc!r}")
    key, digest = f"${params + 1}", f"${params + 2}"
    return f"""
WITH prior AS (
    SELECT rpc, request_sha256, answer FROM idempotency_keys WHERE key = {key}::text
),
fresh AS (SELECT WHERE NOT EXISTS (SELECT FROM prior)),
effect AS ({effect}),
answer AS (SELECT coalesce(jsonb_agg(effect), '[]'::jsonb) AS rows, count(*) AS n FROM effect),
kept AS (
    INSERT INTO idempotency_keys (key, rpc, request_sha256, answer)
    SELECT {key}::text, '{rpc}', {digest}::bytea, answer.rows FROM answer WHERE answer.n > 0
)
SELECT prior.rpc IS NOT NULL AS replayed, prior.rpc, prior.request_sha256,
       coalesce(prior.answer, answer.rows)::text AS answer
  FROM answer LEFT JOIN prior ON true
"""


# $1 name, $2 cpu_millis, $3 memory_mb, $4 priority, $5 runtime, $6 sleep_ms, $7 argv; then the
# idempotency key and the request's sha256 (see once). Answer rows: id.
SUBMIT_JOB = once(
    "submit_job",
    """
INSERT INTO jobs (name, cpu_millis, memory_mb, priority, runtime, sleep_ms, argv, pending_seq)
SELECT $1::text, $2::int, $3::int, $4::int, $5::text, $6::bigint, $7::text[], nextval('pending_seq')
  FROM fresh
RETURNING id
""",
    params=7,
)

# $1 names, $2 cpu_millis, $3 memory_mb, $4 priorities, $5 runtimes, $6 sleep_ms, $7 argv as
# JSON arrays (NULL for sleep jobs); then the idempotency key and the request's sha256 (see
# once). One statement: all jobs or none. Answer rows: id, one per job, drawn in order.
SUBMIT_JOBS = once(
    "submit_jobs",
    """
INSERT INTO jobs (name, cpu_millis, memory_mb, priority, runtime, sleep_ms, argv, pending_seq)
SELECT t.name, t.cpu, t.mem, t.prio, t.runtime, t.sleep_ms,
       CASE WHEN t.argv IS NULL THEN NULL
            ELSE ARRAY(SELECT jsonb_array_elements_text(t.argv::jsonb)) END,
       nextval('pending_seq')
  FROM unnest($1::text[], $2::int[], $3::int[], $4::int[], $5::text[], $6::bigint[], $7::text[])
       WITH ORDINALITY AS t(name, cpu, mem, prio, runtime, sleep_ms, argv, n), fresh
 ORDER BY t.n
RETURNING id
""",
    params=7,
)

# $1 job id; then the idempotency key and the request's sha256 (see once). Pending: cancelled at
# once. Assigned or running: the leader cancels it on its worker and ends the assignment (a
# fenced write). Answer rows: id, state, cancel_requested (none: no such job).
CANCEL_JOB = once(
    "cancel_job",
    """
UPDATE jobs
   SET cancel_requested = state IN ('assigned', 'running'),
       reason = CASE WHEN state = 'pending' THEN '' ELSE reason END,
       state = CASE WHEN state = 'pending' THEN 'cancelled' ELSE state END,
       finished_at = CASE WHEN state = 'pending' THEN now() ELSE finished_at END
 WHERE id = $1::bigint AND EXISTS (SELECT FROM fresh)
RETURNING id, state, cancel_requested
""",
    params=1,
)

# The constraint a copy of a mutating call breaks when another copy stored its key first.
IDEMPOTENCY_KEY_CONSTRAINT = "idempotency_keys_pkey"

# $1 retention_s, $2 most rows. Deletes up to $2 of the oldest keys stored more than $1 seconds
# ago (index idempotency_keys_by_age), skipping rows another replica's sweep holds; returns how
# many it deleted.
SWEEP_IDEMPOTENCY_KEYS = """
WITH swept AS (
    DELETE FROM idempotency_keys
     WHERE key IN (SELECT key FROM idempotency_keys
                    WHERE created_at < now() - make_interval(secs => $1::float8)
                    ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)
 RETURNING 1
)
SELECT count(*) FROM swept
"""

_JOB_INFO = """
SELECT j.id, j.name, j.cpu_millis, j.memory_mb, j.priority, j.runtime, j.sleep_ms, j.argv,
       j.state, j.reason, j.cancel_requested, j.attempts, j.exit_code,
       extract(epoch FROM j.submitted_at)::float8 AS submitted_unix_s,
       extract(epoch FROM j.started_at)::float8 AS started_unix_s,
       extract(epoch FROM j.finished_at)::float8 AS finished_unix_s,
       j.stdout_path, j.stderr_path, j.detail,
       a.id AS assignment_id, a.worker_id, a.epoch
  FROM jobs j
  LEFT JOIN LATERAL (
      SELECT id, worker_id, epoch FROM assignments
       WHERE job_id = j.id ORDER BY id DESC LIMIT 1
  ) a ON true
"""

GET_JOB = _JOB_INFO + " WHERE j.id = $1"

# $1 state ('' for any), $2 limit. Newest first.
LIST_JOBS = _JOB_INFO + " WHERE ($1 = '' OR j.state = $1) ORDER BY j.id DESC LIMIT $2"

# $1 id, $2 address, $3 cpu_millis, $4 memory_mb, $5 labels (json text), $6 agent run id, $7
# registration number within that run, $8 the registration's sha256 (actors/idempotency.py).
# A registration is a new incarnation, alive, with a fresh heartbeat, and a send window that
# starts again (nothing is addressed to the new incarnation yet: see schema.sql), unless it is
# a copy of one already applied or older than the latest of its agent run (same run id, a
# number not above the stored one): then the row stays as it is and nothing is returned (see
# WORKER_REGISTRATION). Late and hedged copies of one registration thus never start another
# incarnation under an agent that runs jobs under the first. A registration of another run
# (the agent restarted) is always new. (Worker id, run id, number) is the registration's
# idempotency key, kept in the worker's row until the next registration replaces it.
REGISTER_WORKER = """
INSERT INTO workers (id, address, cpu_millis, memory_mb, labels, incarnation, agent_run_id,
                     registration_seq, registration_sha256)
VALUES ($1, $2, $3, $4, $5::jsonb, nextval('worker_incarnation_seq'), $6, $7, $8)
ON CONFLICT (id) DO UPDATE
   SET address = EXCLUDED.address, cpu_millis = EXCLUDED.cpu_millis,
       memory_mb = EXCLUDED.memory_mb, labels = EXCLUDED.labels,
       incarnation = EXCLUDED.incarnation, state = 'alive',
       registered_at = now(), last_heartbeat_at = now(), dead_at = NULL, dead_epoch = NULL,
       left_at = NULL,
       agent_run_id = EXCLUDED.agent_run_id, registration_seq = EXCLUDED.registration_seq,
       registration_sha256 = EXCLUDED.registration_sha256
 WHERE workers.agent_run_id <> EXCLUDED.agent_run_id
    OR workers.registration_seq < EXCLUDED.registration_seq
RETURNING incarnation
"""

# $1 worker id. The registration a REGISTER_WORKER that returned nothing met.
WORKER_REGISTRATION = """
SELECT incarnation, agent_run_id, registration_seq, registration_sha256 FROM workers WHERE id = $1
"""

# $1 worker id, $2 incarnation, $3 agent run id. A clean stop (actors/ingest.py, leave_worker),
# after LOCK_WORKER in the same transaction: the row becomes 'left' if it is alive in that
# incarnation, registered by that agent run, and the stop is logged in worker_leaves. Returns
# the row as it was (no row: unknown worker) and whether this statement made it left. A late
# leave (an earlier incarnation's) or one from anyone but the agent that registered the
# incarnation changes nothing. The leader's next reconcile pass ends the incarnation's
# assignments (END_ORPHANED_ASSIGNMENTS).
LEAVE_WORKER = """
WITH current AS (
    SELECT id, state, incarnation, agent_run_id FROM workers WHERE id = $1
),
left_now AS (
    UPDATE workers w SET state = 'left', left_at = now()
      FROM current c
     WHERE w.id = c.id AND c.state = 'alive' AND c.incarnation = $2 AND c.agent_run_id = $3
 RETURNING w.id, w.incarnation
),
logged AS (
    INSERT INTO worker_leaves (worker_id, incarnation) SELECT id, incarnation FROM left_now
)
SELECT c.state, c.incarnation, c.agent_run_id = $3 AS same_run, EXISTS (SELECT 1 FROM left_now) AS left_now
  FROM current c
"""

# $1 worker id. Locks the worker's row (if any) for the rest of the transaction.
LOCK_WORKER = "SELECT id FROM workers WHERE id = $1 FOR UPDATE"

# A worker's finished outcomes (heartbeats carry them through HEARTBEAT; registrations through
# this): the function record_outcomes in schema.sql, which says what becomes of an outcome that
# arrives on time and of one that arrives after the leader ended its assignment as lost.
# $1 worker id, then parallel arrays: $2 assignment ids, $3 states, $4 exit codes (NULL for
# none), $5 started (unix s), $6 finished (unix s), $7 stdout paths, $8 stderr paths, $9
# details. Returns how many were recorded late.
RECORD_OUTCOMES = """
SELECT record_outcomes($1, $2::bigint[], $3::text[], $4::int[], $5::float8[], $6::float8[],
                       $7::text[], $8::text[], $9::text[])
"""

# One heartbeat, one statement: the function record_heartbeat in schema.sql records the
# worker's liveness, its finished outcomes (ending the assignments still active) and its
# running confirmations, and says which of the running assignments to stop.
# $1 worker id, $2 incarnation, $3 running assignment ids; the finished outcomes as parallel
# arrays: $4 assignment ids, $5 states, $6 exit codes (NULL for none), $7 started (unix s),
# $8 finished (unix s), $9 stdout paths, $10 stderr paths, $11 details.
# Row: current_epoch, alive (false: unknown, dead or another incarnation -> re-register),
# stop_assignment_ids.
HEARTBEAT = """
SELECT current_epoch, alive, stop_assignment_ids
  FROM record_heartbeat($1, $2, $3::bigint[], $4::bigint[], $5::text[], $6::int[], $7::float8[],
                        $8::float8[], $9::text[], $10::text[], $11::text[])
"""

CURRENT_EPOCH = "SELECT epoch FROM lease WHERE id = 1"

# $1 id, $2 address, $3 pid
RECORD_PRESENCE = """
INSERT INTO control_planes (id, address, pid, started_at, seen_at)
VALUES ($1, $2, $3, now(), now())
ON CONFLICT (id) DO UPDATE
   SET address = EXCLUDED.address, seen_at = now(),
       started_at = CASE WHEN control_planes.pid IS DISTINCT FROM EXCLUDED.pid
                         THEN now() ELSE control_planes.started_at END,
       pid = EXCLUDED.pid
"""

# ---------------------------------------------------------------- status (reads)

STATUS_CONTROL_PLANES = """
SELECT id, address, extract(epoch FROM seen_at)::float8 AS seen_unix_s,
       seen_at > now() - interval '3 seconds' AS up
  FROM control_planes ORDER BY id
"""

STATUS_WORKERS = """
SELECT w.id, w.address, w.state, w.cpu_millis, w.memory_mb, w.incarnation,
       extract(epoch FROM now() - w.last_heartbeat_at)::float8 AS heartbeat_age_s,
       coalesce(sum(a.cpu_millis), 0)::bigint AS cpu_allocated_millis,
       coalesce(sum(a.memory_mb), 0)::bigint AS memory_allocated_mb,
       coalesce(array_agg(a.job_id ORDER BY a.job_id) FILTER (WHERE a.id IS NOT NULL), '{}')
           AS job_ids
  FROM workers w
  LEFT JOIN assignments a ON a.worker_id = w.id AND a.state = 'active'
 GROUP BY w.id ORDER BY w.id
"""

# The pending queue's length (the ingest's limit on submissions; index jobs_pending_by_xid).
COUNT_PENDING = "SELECT count(*) FROM jobs WHERE state = 'pending'"

STATUS_JOB_COUNTS = "SELECT state, count(*)::bigint AS count FROM jobs GROUP BY state"

STATUS_UNSCHEDULABLE = (
    _JOB_INFO
    + """
 WHERE j.state = 'pending' AND j.reason LIKE 'unschedulable%' ORDER BY j.id LIMIT 20
"""
)
