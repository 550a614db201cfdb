"""The reconciler's reads (:mod:`actors.reconciler`): heartbeat ages, unconfirmed and
cancel-requested assignments, those of drains whose deadline has passed, and those to preempt.
"""

from __future__ import annotations

from actors.queries.ledger import GANG_SEAT

# The database's time, and every worker judged by its silence (the view judged_workers) with the
# time (database time) since its last recorded heartbeat or, when later, since the server started
# (pg_postmaster_start_time(): a restart is an outage, and no worker could heartbeat through it) or
# since a planned restart's hold ends (workers.hold_until: negative while it holds; greatest()
# skips its NULL), and the dead_after it is judged by (the larger of its row's and the leader's
# policy's; see DECLARE_DEAD_WORKERS); one row with a NULL id when there is no worker.
HEARTBEAT_AGES = """
SELECT n.now_unix_s, w.id, w.incarnation, greatest(w.dead_after_ms, n.policy_ms) AS dead_after_ms,
       extract(epoch FROM n.now - greatest(w.last_heartbeat_at, pg_postmaster_start_time(),
                                           w.hold_until))::float8
           AS age_s
  FROM (SELECT now() AS now, extract(epoch FROM now())::float8 AS now_unix_s,
               (SELECT p.dead_after_ms FROM heartbeat_policy p WHERE p.id = 1) AS policy_ms) n
  LEFT JOIN judged_workers w ON true
"""

# Active assignments on live workers of the right incarnation, with what a stop or a re-send
# needs; each query below narrows them with AND ... and orders them by id.
_ACTIVE_ON_LIVE_WORKERS = (
    """
SELECT a.id AS assignment_id, a.job_id, a.worker_id, a.worker_incarnation AS incarnation,
       a.epoch, w.address, j.name, j.cpu_millis, j.memory_mb, j.priority, j.runtime, j.sleep_ms, j.argv,
       j.image, j.timeout_ms, j.env::text AS env, j.workdir, j.array_index, j.array_id,
       j.attempts > 1 AS placed_before, extract(epoch FROM now() - a.created_at)::float8 AS age_s,
       held_units(a.id) AS units, s.*
  FROM assignments a
  JOIN workers w ON w.id = a.worker_id
  JOIN jobs j ON j.id = a.job_id
  LEFT JOIN LATERAL ("""
    + GANG_SEAT
    + """) s ON j.gang_id IS NOT NULL
 WHERE a.state = 'active' AND w.state = 'alive' AND w.incarnation = a.worker_incarnation
"""
)

# Active assignments no heartbeat has confirmed, on live workers of the right incarnation.
UNCONFIRMED_ASSIGNMENTS = (
    _ACTIVE_ON_LIVE_WORKERS
    + """
   AND a.confirmed_at IS NULL
 ORDER BY a.id
"""
)

# $1 margin (s). Active assignments, on live workers of the right incarnation, whose job has run
# past its timeout_s by the margin, or by a tenth of the timeout when that is longer, counted from
# the first heartbeat that listed it (or its commit, if none did); not those a cancel is asked of
# (cancelled already). The leader stops them (actors/reconciler.py).
OVERDUE_ASSIGNMENTS = (
    _ACTIVE_ON_LIVE_WORKERS
    + """
   AND j.timeout_ms IS NOT NULL AND NOT j.cancel_requested
   AND now() - coalesce(a.confirmed_at, a.created_at)
       > make_interval(secs => j.timeout_ms / 1000.0 + greatest($1::float8, j.timeout_ms / 10000.0))
 ORDER BY a.id
"""
)

# Active assignments of jobs a user asked to cancel, on live workers of the right incarnation.
CANCEL_REQUESTED_ASSIGNMENTS = (
    _ACTIVE_ON_LIVE_WORKERS
    + """
   AND j.cancel_requested
 ORDER BY a.id
"""
)

# $1 most rows. The waiting jobs the leader can settle now (actors/dependencies.py): those with
# a dependency that failed or was cancelled, and those whose dependencies all succeeded (none
# counts as all) unless they are tasks of an array whose limit is reached; of an array's ready
# tasks only as many as its limit leaves room for, lowest index first. Each with its
# dependencies' ids and states (an array's id as the whole array: dependency_states in schema.sql),
# and its array's tasks pending, assigned or running. Reads every waiting job's dependencies
# (index jobs_waiting, then primary-key and jobs_by_array probes per dependency): on a read
# connection of the reconciler's, outside any fenced write.
WAITING_JOBS = """
WITH w AS (
    SELECT j.id, j.array_id, coalesce(j.array_index, 0) AS array_index,
           coalesce(j.array_max_running, 0) AS array_max_running,
           coalesce(d.ids, '{}') AS after_ids, coalesce(d.states, '{}') AS after_states
      FROM jobs j
      LEFT JOIN LATERAL (
          SELECT array_agg(s.dep ORDER BY s.dep) AS ids, array_agg(s.state ORDER BY s.dep) AS states
            FROM dependency_states(j.after_ids) s
      ) d ON cardinality(j.after_ids) > 0
     WHERE j.state = 'waiting'
),
active AS (
    SELECT t.array_id, count(*) AS n
      FROM jobs t
     WHERE t.array_id IN (SELECT array_id FROM w WHERE array_max_running > 0)
       AND t.state IN ('pending', 'assigned', 'running')
     GROUP BY t.array_id
),
decidable AS (
    SELECT w.*, coalesce(a.n, 0) AS array_active,
           'failed' = ANY(w.after_states) OR 'cancelled' = ANY(w.after_states) AS doomed,
           row_number() OVER (PARTITION BY w.array_id, w.after_states <@ ARRAY['succeeded']
                              ORDER BY w.array_index, w.id) AS k
      FROM w LEFT JOIN active a ON a.array_id = w.array_id
)
SELECT id, array_id, array_index, array_max_running, after_ids, after_states, array_active
  FROM decidable
 WHERE doomed
    OR (after_states <@ ARRAY['succeeded']
        AND (array_max_running = 0 OR array_id IS NULL OR k <= array_max_running - array_active))
 ORDER BY id
 LIMIT $1
"""

# Active assignments on live workers of the right incarnation whose drain deadline has passed
# (database time; schema.sql, workers.drain_deadline_at): stopped on their worker, then ended
# and requeued (queries.END_DRAINED_ASSIGNMENTS). Jobs a user asked to cancel are left to
# CANCEL_REQUESTED_ASSIGNMENTS.
DRAIN_DUE_ASSIGNMENTS = (
    _ACTIVE_ON_LIVE_WORKERS
    + """
   AND NOT j.cancel_requested AND w.drain_deadline_at <= now()
 ORDER BY a.id
"""
)

# Active assignments marked to be preempted (queries.PREEMPT_ASSIGNMENTS) on live workers of
# the right incarnation: stopped on their worker with the preemption's grace, then ended and
# requeued (queries.END_PREEMPTED_ASSIGNMENTS). Jobs a user asked to cancel are left to
# CANCEL_REQUESTED_ASSIGNMENTS. A mark whose preempting job is no longer pending (cancelled, or
# placed elsewhere) has lapsed: its run is left alone. A mark with no preempting job is a gang's
# stop (schema.sql, gang_runs_ended: another task of its attempt ended) and never lapses. Index
# assignments_preempt_requested.
PREEMPT_DUE_ASSIGNMENTS = (
    _ACTIVE_ON_LIVE_WORKERS
    + """
   AND a.preempt_requested_at IS NOT NULL AND NOT j.cancel_requested
   AND (a.preempted_by IS NULL
        OR EXISTS (SELECT 1 FROM jobs p WHERE p.id = a.preempted_by AND p.state = 'pending'))
 ORDER BY a.id
"""
)

# $1 most runs per worker (health_window_runs), $2 window (s, health_window_s), $3 the end
# reasons of failures that are the job's own doing (actors/health.py, JOB_FAULTS). Every alive
# worker with its health and its judged runs, newest first, as parallel arrays: those it ended
# itself (state 'finished': succeeded or failed, but not failed for a reason of $3) within the
# window and after its health_since, at most $1 (index assignments_finished_by_worker). For
# each: whether it ended after the worker's last mark or renewal (unhealthy_marked_at), how long
# ago it ended (s), its job's array and a digest of what the job runs (its siblings), whether a
# run of the same job failed on another worker within the window (for a reason not in $3), and
# whether one succeeded on another worker (index assignments_by_job, both).
WORKER_RUNS = """
SELECT w.id, w.health_version, w.unhealthy_at IS NOT NULL AS unhealthy,
       w.cordoned_at IS NULL AS takes_placements,
       coalesce(r.job_ids, '{}') AS job_ids, coalesce(r.failed, '{}') AS failed,
       coalesce(r.details, '{}') AS details, coalesce(r.after_mark, '{}') AS after_mark,
       coalesce(r.ages_s, '{}') AS ages_s, coalesce(r.array_ids, '{}') AS array_ids,
       coalesce(r.spec_keys, '{}') AS spec_keys,
       coalesce(r.failed_elsewhere, '{}') AS failed_elsewhere,
       coalesce(r.succeeded_elsewhere, '{}') AS succeeded_elsewhere
  FROM workers w
  LEFT JOIN LATERAL (
      SELECT array_agg(x.job_id ORDER BY x.ended_at DESC, x.id DESC) AS job_ids,
             array_agg(x.failed ORDER BY x.ended_at DESC, x.id DESC) AS failed,
             array_agg(x.detail ORDER BY x.ended_at DESC, x.id DESC) AS details,
             array_agg(x.after_mark ORDER BY x.ended_at DESC, x.id DESC) AS after_mark,
             array_agg(extract(epoch FROM now() - x.ended_at)::float8 ORDER BY x.ended_at DESC, x.id DESC)
                 AS ages_s,
             array_agg(j.array_id ORDER BY x.ended_at DESC, x.id DESC) AS array_ids,
             array_agg(md5(concat_ws(' ', j.runtime, j.argv::text, j.image, j.sleep_ms::text))
                       ORDER BY x.ended_at DESC, x.id DESC) AS spec_keys,
             array_agg(e.failed ORDER BY x.ended_at DESC, x.id DESC) AS failed_elsewhere,
             array_agg(e.succeeded ORDER BY x.ended_at DESC, x.id DESC) AS succeeded_elsewhere
        FROM (SELECT a.id, a.job_id, a.ended_at, a.outcome = 'failed' AS failed,
                     coalesce(a.detail, '') AS detail,
                     coalesce(a.ended_at > w.unhealthy_marked_at, false) AS after_mark
                FROM assignments a
               WHERE a.worker_id = w.id AND a.state = 'finished'
                 AND a.ended_at > now() - make_interval(secs => $2::float8)
                 AND a.ended_at > coalesce(w.health_since, '-infinity')
                 AND NOT (a.outcome = 'failed' AND a.end_reason = ANY($3::text[]))
               ORDER BY a.ended_at DESC, a.id DESC
               LIMIT $1) x
        JOIN jobs j ON j.id = x.job_id
        -- The job's runs on other workers, found by the job alone (assignments_by_job): what
        -- they ended as is tested in the aggregates, not the WHERE, so that no plan can reach
        -- them through assignments_finished_by_worker instead, a scan of every run that ended
        -- in the window for each judged run (a plan made while the table was small chose it,
        -- and the statement took 1.3 to 2.8 s a pass with 10,000 runs).
        CROSS JOIN LATERAL (
            SELECT coalesce(bool_or(o.state = 'finished' AND o.outcome = 'failed'
                                    AND o.ended_at > now() - make_interval(secs => $2::float8)
                                    AND NOT coalesce(o.end_reason = ANY($3::text[]), false)), false)
                       AS failed,
                   coalesce(bool_or(o.state = 'finished' AND o.outcome = 'succeeded'), false) AS succeeded
              FROM assignments o
             WHERE o.job_id = x.job_id AND o.worker_id <> w.id
        ) e
  ) r ON true
 WHERE w.state = 'alive'
 ORDER BY w.id
"""

# The heartbeat policy in force (no row: none chosen yet), and what one heartbeat costs each
# control plane seen in the last $1 seconds (µs; those that measured it) and the 99th percentile
# of the waits its heartbeats reported (ms; those that had enough), and how many were seen, for
# the leader's choice of the interval (actors/heartbeat_policy.py).
HEARTBEAT_POLICY_INPUTS = """
SELECT p.interval_ms, p.dead_after_ms, p.workers, p.cpu_per_heartbeat_us, p.reason,
       ARRAY(SELECT c.cpu_per_heartbeat_us FROM control_planes c
              WHERE c.seen_at > now() - make_interval(secs => $1)
                AND c.cpu_per_heartbeat_us IS NOT NULL) AS costs_us,
       ARRAY(SELECT c.heartbeat_wait_p99_ms FROM control_planes c
              WHERE c.seen_at > now() - make_interval(secs => $1)
                AND c.heartbeat_wait_p99_ms IS NOT NULL) AS waits_ms,
       (SELECT count(*) FROM control_planes c
         WHERE c.seen_at > now() - make_interval(secs => $1))::int AS replicas
  FROM (SELECT 1) one LEFT JOIN heartbeat_policy p ON p.id = 1
"""
