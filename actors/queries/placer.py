"""The placer's reads (:mod:`actors.placer`): live workers, pending jobs, one round's reads."""

from __future__ import annotations


# Whether a worker is on trial (actors/placer.py, probe_limit: one job at a time), with $N the
# placer's trial_run_s (0: no trial): no run of its incarnation that ended (or is still going)
# after its registration and its health_since (set when an unhealthy mark was cleared) has
# succeeded or run for $N seconds since a heartbeat first listed it, a run cancelled after
# that long included (a user's cancel, or a drain, does not put a worker back on trial)
# (indexes assignments_finished_by_worker, assignments_cancelled_by_worker and
# assignments_active_by_worker: one worker's runs since).
def _on_trial(n: int) -> str:
    return f"""(${n}::float8 > 0
       AND NOT EXISTS (SELECT 1 FROM assignments t
                        WHERE t.worker_id = w.id AND t.state = 'finished'
                          AND t.ended_at > greatest(w.registered_at, coalesce(w.health_since, '-infinity'))
                          AND t.worker_incarnation = w.incarnation
                          AND (t.outcome = 'succeeded'
                               OR t.confirmed_at + make_interval(secs => ${n}::float8) <= t.ended_at))
       AND NOT EXISTS (SELECT 1 FROM assignments t
                        WHERE t.worker_id = w.id AND t.state = 'cancelled'
                          AND t.ended_at > greatest(w.registered_at, coalesce(w.health_since, '-infinity'))
                          AND t.worker_incarnation = w.incarnation
                          AND t.confirmed_at + make_interval(secs => ${n}::float8) <= t.ended_at)
       AND NOT EXISTS (SELECT 1 FROM assignments t
                        WHERE t.worker_id = w.id AND t.state = 'active'
                          AND t.worker_incarnation = w.incarnation
                          AND t.confirmed_at + make_interval(secs => ${n}::float8) <= now()))"""


# $1 worker_fresh_s, $2 trial_run_s. Live workers (not held for a planned restart: schema.sql,
# workers.hold_until) with their allocation and their send window's counters (kept
# by the assignments triggers in worker_allocations), whether each runs container jobs (its
# label container=docker, actors/placement.py), whether it is cordoned (read so that an
# unschedulable reason can name the cordoned workers it did not count; never placed on), and
# whether it is marked unhealthy and, if so, whether its probe is due (schema.sql, worker
# health: an unhealthy worker takes a probe then, else nothing), and whether it is on trial.
LIVE_WORKERS = f"""
SELECT w.id, w.address, w.incarnation, w.cpu_millis, w.memory_mb, a.cpu_allocated_millis,
       a.memory_allocated_mb, a.unconfirmed_assignments, a.confirmed_assignments,
       coalesce(w.labels->>'container' = 'docker', false) AS runs_containers, w.labels::text AS labels,
       w.cordoned_at IS NOT NULL AS cordoned, w.unhealthy_at IS NOT NULL AS unhealthy,
       coalesce(w.unhealthy_probe_at <= now(), false) AS probe_due, {_on_trial(2)} AS trial
  FROM workers w JOIN worker_allocations a ON a.worker_id = w.id
 WHERE w.state = 'alive' AND w.last_heartbeat_at > now() - make_interval(secs => $1)
   AND (w.hold_until IS NULL OR w.hold_until <= now())
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
               array_agg(pending_seq) AS p_pending_seq, array_agg(wait_s) AS p_wait_s,
               array_agg(container) AS p_container, array_agg(constraints) AS p_constraints,
               array_agg(failed_on) AS p_failed_on"""

# The workers where a run of the job failed before, as one text of ids separated by spaces (ids
# hold none), NULL for none: a retry prefers other workers (actors/placement.py). Looked up only
# for a job that spent an attempt (index assignments_by_job).
_FAILED_ON = """CASE WHEN failures > 0 THEN
    (SELECT string_agg(DISTINCT a.worker_id, ' ') FROM assignments a
      WHERE a.job_id = jobs.id AND a.outcome = 'failed') END AS failed_on"""

_PENDING_ROW = (
    f"id, cpu_millis, memory_mb, priority, reason, pending_xid, pending_seq, {_WAIT_S},"
    " runtime = 'container' AS container,"
    " CASE WHEN constraints = '[]'::jsonb THEN NULL ELSE constraints::text END AS constraints,"
    f" {_FAILED_ON}"
)

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
# transactions in flight, $6 trial_run_s. One round's reads in one round trip, as parallel arrays in one row
# (an array is NULL when it has no rows), with the snapshot they were read in: LIVE_WORKERS;
# the jobs that became pending after the mark, in (pending_xid, pending_seq) order, up to the
# limit; and those at or below the mark made pending by a transaction that was still in flight
# at the previous read (see actors/placer_store.py, PendingMark).
ROUND_READ = f"""
SELECT w.*, p.*, {_SNAPSHOT}
  FROM (SELECT array_agg(w.id) AS w_id, array_agg(w.address) AS w_address,
               array_agg(w.incarnation) AS w_incarnation, array_agg(w.cpu_millis) AS w_cpu_millis,
               array_agg(w.memory_mb) AS w_memory_mb,
               array_agg(a.cpu_allocated_millis) AS w_cpu_allocated_millis,
               array_agg(a.memory_allocated_mb) AS w_memory_allocated_mb,
               array_agg(a.unconfirmed_assignments) AS w_unconfirmed_assignments,
               array_agg(a.confirmed_assignments) AS w_confirmed_assignments,
               array_agg(coalesce(w.labels->>'container' = 'docker', false)) AS w_runs_containers,
               array_agg(w.labels::text) AS w_labels,
               array_agg(w.cordoned_at IS NOT NULL) AS w_cordoned,
               array_agg(w.unhealthy_at IS NOT NULL) AS w_unhealthy,
               array_agg(coalesce(w.unhealthy_probe_at <= now(), false)) AS w_probe_due,
               array_agg({_on_trial(6)}) AS w_trial
          FROM workers w JOIN worker_allocations a ON a.worker_id = w.id
         WHERE w.state = 'alive'
           AND w.last_heartbeat_at > now() - make_interval(secs => $1::float8)
           AND (w.hold_until IS NULL OR w.hold_until <= now())) w,
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
