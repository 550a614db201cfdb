"""The reads ingest answers clients with (:mod:`actors.ingest`): a job, its runs and its history,
where its output is read, job lists, and the status view.
"""

from __future__ import annotations

# ---------------------------------------------------------------- jobs

_JOB_INFO = """
SELECT j.id, j.name, j.cpu_millis, j.memory_mb, j.priority, j.runtime, j.sleep_ms, j.argv, j.image,
       j.max_attempts, j.retry_backoff_ms, j.count_lost, j.timeout_ms,
       j.constraints::text AS constraints, j.env::text AS env, j.workdir, j.after_ids, j.array_max_running,
       j.array_max_failed, j.retry_on_exit, j.no_retry_on,
       j.failures, j.array_id, j.array_index,
       CASE WHEN j.resources = '{}'::jsonb THEN NULL ELSE j.resources::text END AS resources,
       extract(epoch FROM j.not_before)::float8 AS not_before_unix_s,
       j.state, j.reason, j.cancel_requested, j.attempts, j.exit_code,
       extract(epoch FROM j.submitted_at)::float8 AS submitted_unix_s,
       extract(epoch FROM j.started_at)::float8 AS started_unix_s,
       extract(epoch FROM j.finished_at)::float8 AS finished_unix_s,
       j.stdout_path, j.stderr_path, j.detail, j.owner,
       a.id AS assignment_id, a.worker_id, a.epoch, r.array_first, r.array_last,
       extract(epoch FROM now())::float8 AS read_unix_s,
       j.gang_id, j.gang_rank, g.size AS gang_size, g.spread AS gang_spread, g.state AS gang_state,
       g.attempts AS gang_attempts, g.failures AS gang_failures, g.detail AS gang_detail,
       sl.schedule_name, extract(epoch FROM sl.slot_at)::float8 AS schedule_slot_unix_s
  FROM jobs j
  LEFT JOIN gangs g ON g.id = j.gang_id
  -- A job a schedule fired: the schedule and the slot (schedule_slots' unique job_id)
  LEFT JOIN LATERAL (
      SELECT s.name AS schedule_name, ss.slot_at
        FROM schedule_slots ss JOIN schedules s ON s.id = ss.schedule_id
       WHERE ss.job_id = j.id
  ) sl ON true
  LEFT JOIN LATERAL (
      SELECT id, worker_id, epoch FROM assignments
       WHERE job_id = j.id ORDER BY id DESC LIMIT 1
  ) a ON true
  -- An array's id (its first task) reads as the array's spec: its range, so that the job's
  -- spec submitted again is the array again (index jobs_by_array); other tasks as one job.
  LEFT JOIN LATERAL (
      SELECT min(t.array_index) AS array_first, max(t.array_index) AS array_last
        FROM jobs t WHERE t.array_id = j.id
  ) r ON j.array_id = j.id
"""

# $1 job id, $2 the only owner whose job it reads (NULL: any; another's job is as no job).
GET_JOB = _JOB_INFO + " WHERE j.id = $1 AND ($2::text IS NULL OR j.owner = $2::text)"

# $1 array id. How many of the array's tasks are in each state.
ARRAY_COUNTS = """
SELECT state, count(*)::bigint AS count FROM jobs WHERE array_id = $1 GROUP BY state
"""

# $1 job id. Its runs (assignments), oldest first, each with the device units it holds or held
# (units: JSON {resource: [unit, ...]}, numbers in their order; NULL: none).
JOB_ATTEMPTS = """
SELECT id, worker_id, epoch, state, coalesce(end_reason, '') AS end_reason, exit_code,
       extract(epoch FROM created_at)::float8 AS created_unix_s,
       extract(epoch FROM ended_at)::float8 AS ended_unix_s,
       coalesce(detail, '') AS detail, counted,
       (SELECT jsonb_object_agg(u.resource, u.units)::text
          FROM (SELECT resource, jsonb_agg(unit ORDER BY length(unit), unit) AS units FROM assignment_units
                 WHERE assignment_id = a.id GROUP BY resource) u) AS units
  FROM assignments a WHERE job_id = $1 ORDER BY id
"""

# $1 job id, $2 the only owner whose job it reads (NULL: any). The job's history (GetJobEvents),
# rebuilt from what the tables keep (docs/design.md, "A job's history", says where each event
# comes from), in time order (database time; ties, as in one transaction, in the order the
# transaction did them): one row per event, none when there is no such job. Columns: kind
# (submitted, waiting, cancel_requested, placed, confirmed, worker_dead, ended, requeued, final),
# at_unix_s, assignment_id, worker_id, incarnation, epoch (and leader, the holder of that epoch in
# lease_history), state, reason, outcome, exit_code, detail, not_before_unix_s (NULL where they do
# not apply), and job_state (the job's state now, on every row). Reads the job's row and its
# assignments (index assignments_by_job), one worker_deaths probe per assignment ended by a death
# and one lease_history probe per event: a read of a few rows, on any replica, that writes nothing
# and adds nothing to the hot paths.
JOB_EVENTS = """
WITH j AS (
    SELECT * FROM jobs WHERE id = $1 AND ($2::text IS NULL OR owner = $2::text)
),
runs AS (
    SELECT a.*,
           a.state <> 'active' AND (
               lead(a.id) OVER (ORDER BY a.id) IS NOT NULL
               OR j.state = 'pending'
               OR (a.state = 'finished' AND j.state = 'cancelled'
                   AND j.cancel_requested_at > a.ended_at)
               OR (a.state <> 'finished' AND j.state IN ('succeeded', 'failed', 'cancelled')
                   AND j.finished_at IS DISTINCT FROM a.ended_at)
           ) AS requeued,
           -- The requeues that write jobs.not_before (a retry's delay, a loss's backoff, NULL
           -- after a clean leave); a drain, a preemption, a release and a start that never
           -- happened keep it.
           NOT (a.state = 'stopped' AND a.end_reason IN ('drained', 'preempted', 'released', 'not_started'))
               AS writes_not_before
      FROM assignments a, j
     WHERE a.job_id = $1
),
last_backoff AS (
    SELECT max(id) AS id FROM runs WHERE requeued AND writes_not_before
),
before_end AS (
    SELECT 'submitted' AS kind, j.submitted_at AS at, 0 AS rank, NULL::bigint AS assignment_id,
           NULL::text AS worker_id, NULL::bigint AS incarnation, NULL::bigint AS epoch,
           NULL::text AS state, NULL::text AS reason, NULL::text AS outcome,
           NULL::integer AS exit_code,
           (SELECT 'fired by schedule ' || s.name || '''s slot '
                   || to_char(ss.slot_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
              FROM schedule_slots ss JOIN schedules s ON s.id = ss.schedule_id
             WHERE ss.job_id = j.id) AS detail,
           NULL::timestamptz AS not_before
      FROM j
    UNION ALL
    SELECT 'waiting', j.submitted_at, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
           'waiting for job ' || array_to_string(j.after_ids, ', '), NULL
      FROM j WHERE cardinality(j.after_ids) > 0
    UNION ALL
    SELECT 'cancel_requested', j.cancel_requested_at, 2, NULL, NULL, NULL, NULL, NULL, NULL,
           NULL, NULL,
           -- who asked, where the asker said so: a schedule's replace (FIRE_SCHEDULE_SLOTS)
           CASE WHEN j.detail LIKE 'replaced by schedule %' THEN j.detail END, NULL
      FROM j WHERE j.cancel_requested_at IS NOT NULL
    UNION ALL
    SELECT 'placed', r.created_at, 3, r.id, r.worker_id, r.worker_incarnation, r.epoch, NULL,
           NULL, NULL, NULL, NULL, NULL
      FROM runs r
    UNION ALL
    SELECT 'confirmed', r.confirmed_at, 4, r.id, r.worker_id, r.worker_incarnation, NULL, NULL,
           NULL, NULL, NULL, NULL, NULL
      FROM runs r WHERE r.confirmed_at IS NOT NULL
    UNION ALL
    SELECT 'worker_dead', d.declared_at, 5, r.id, d.worker_id, d.incarnation, d.epoch, NULL,
           NULL, NULL, NULL,
           'last heartbeat ' || to_char(d.last_heartbeat_at AT TIME ZONE 'UTC', 'HH24:MI:SS.MS')
           || ' UTC', NULL
      FROM runs r
      JOIN LATERAL (
          SELECT * FROM worker_deaths d
           WHERE d.worker_id = r.worker_id AND d.incarnation = r.worker_incarnation
           ORDER BY d.id LIMIT 1
      ) d ON true
     WHERE r.end_reason = 'worker_dead'
    UNION ALL
    SELECT 'ended', r.ended_at, 6, r.id, r.worker_id, r.worker_incarnation, r.ended_epoch,
           r.state, r.end_reason, r.outcome, r.exit_code, nullif(r.detail, ''), NULL
      FROM runs r WHERE r.state <> 'active'
    UNION ALL
    SELECT 'requeued', r.ended_at, 7, r.id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
           CASE WHEN r.id = (SELECT id FROM last_backoff) THEN j.not_before END
      FROM runs r, j WHERE r.requeued
),
events AS (
    SELECT * FROM before_end
    UNION ALL
    SELECT 'final', greatest(j.finished_at, (SELECT max(at) FROM before_end)), 8, NULL, NULL, NULL,
           NULL, j.state, NULL, NULL, j.exit_code, nullif(j.detail, ''), NULL
      FROM j WHERE j.state IN ('succeeded', 'failed', 'cancelled')
)
SELECT e.kind, extract(epoch FROM e.at)::float8 AS at_unix_s, e.assignment_id, e.worker_id,
       e.incarnation, e.epoch, h.holder AS leader, e.state, e.reason, e.outcome, e.exit_code,
       e.detail, extract(epoch FROM e.not_before)::float8 AS not_before_unix_s,
       (SELECT state FROM j) AS job_state
  FROM events e LEFT JOIN lease_history h ON h.epoch = e.epoch
 ORDER BY e.at, e.rank, e.assignment_id
"""

# $1 job id, $2 an assignment id (0: any), $3 the only owner whose job it reads (NULL: any; no
# row for another's). What ReadJobLogs reads (actors/logs.py): the job's
# runtime, state and reason; its newest run that started (a heartbeat listed it as running, or
# its worker reported its outcome), that is $2 when $2 is not 0, with that worker's address and
# state (alive, dead, left); and the worker of its active run when that has not started yet. No
# row: no such job. Index assignments_by_job.
LOG_SOURCE = """
SELECT j.runtime, j.state, j.reason,
       a.id AS assignment_id, a.worker_id, w.address, w.state AS worker_state,
       (SELECT p.worker_id FROM assignments p
         WHERE p.job_id = j.id AND p.state = 'active') AS pending_worker_id
  FROM jobs j
  LEFT JOIN LATERAL (
      SELECT id, worker_id FROM assignments
       WHERE job_id = j.id AND (confirmed_at IS NOT NULL OR outcome IS NOT NULL)
         AND ($2::bigint = 0 OR id = $2::bigint)
       ORDER BY id DESC LIMIT 1
  ) a ON true
  LEFT JOIN workers w ON w.id = a.worker_id
 WHERE j.id = $1 AND ($3::text IS NULL OR j.owner = $3::text)
"""

# $1 state ('' for any), $2 limit, $3 the only owner whose jobs it lists (NULL: any; index
# jobs_by_owner). Newest first.
LIST_JOBS = (
    _JOB_INFO
    + " WHERE ($1 = '' OR j.state = $1) AND ($3::text IS NULL OR j.owner = $3::text)"
    + " ORDER BY j.id DESC LIMIT $2"
)

# ---------------------------------------------------------------- the audit trail

# $1 the only account (NULL: any), $2 the only action ('' any), $3 only rows of the last $3
# seconds of database time (NULL: all), $4 limit. Newest first (index audit_log_by_account when
# $1 is given).
LIST_AUDIT = """
SELECT id, extract(epoch FROM at)::float8 AS at_unix_s, role, actor_id, account, address, action,
       target_ids::text AS target_ids_json, arguments::text AS arguments_json
  FROM audit_log
 WHERE ($1::text IS NULL OR account = $1::text)
   AND ($2::text = '' OR action = $2::text)
   AND ($3::float8 IS NULL OR at >= now() - make_interval(secs => $3::float8))
 ORDER BY id DESC LIMIT $4
"""

# ---------------------------------------------------------------- status

STATUS_CONTROL_PLANES = """
SELECT id, address, extract(epoch FROM seen_at)::float8 AS seen_unix_s,
       seen_at > now() - interval '3 seconds' AS up
  FROM control_planes ORDER BY id
"""

# A worker row's last columns, its devices (the units it offers and those its active
# assignments hold, JSON text; NULL for a worker without any), and its join to its active
# assignments (``a``): the end of STATUS_WORKERS and of the console's worker reads.
WORKER_DEVICES = """CASE WHEN w.resources <> '{}'::jsonb THEN w.resources::text END AS resources,
       CASE WHEN w.resources <> '{}'::jsonb THEN
           (SELECT json_agg(json_build_array(u.resource, u.unit) ORDER BY u.resource, u.unit)::text
              FROM assignment_units u WHERE u.worker_id = w.id AND u.active) END AS units_in_use
  FROM workers w
  LEFT JOIN assignments a ON a.worker_id = w.id AND a.state = 'active'
"""

# $1 job id. The newest usage sample of its active run (index usage_samples_by_job), as
# [cpu_millis, memory_mb, age in ms] (NULL, or no row: none); STATUS_WORKERS's usage_now is a
# worker's (its jobs together, in the last minute).
JOB_USAGE_NOW = """
SELECT (SELECT ARRAY[s.cpu_millis, s.memory_mb, (extract(epoch FROM now() - s.at) * 1000)::int]
          FROM usage_samples s WHERE s.job_id = a.job_id AND s.assignment_id = a.id
         ORDER BY s.at DESC LIMIT 1)
  FROM assignments a WHERE a.job_id = $1 AND a.state = 'active'
"""

STATUS_WORKERS = (
    """
SELECT w.id, w.address, w.state, w.cpu_millis, w.memory_mb, w.incarnation,
       extract(epoch FROM now() - w.last_heartbeat_at)::float8 AS heartbeat_age_s,
       w.cordoned_at IS NOT NULL AS cordoned, w.drain_requested_at IS NOT NULL AS drain_requested,
       extract(epoch FROM w.drain_deadline_at)::float8 AS drain_deadline_unix_s,
       w.labels::text AS labels, w.unhealthy_at IS NOT NULL AS unhealthy, w.unhealthy_reason,
       extract(epoch FROM w.unhealthy_at)::float8 AS unhealthy_since_unix_s,
       coalesce(sum(a.cpu_millis), 0)::bigint AS cpu_allocated_millis,
       coalesce(sum(a.memory_mb), 0)::bigint AS memory_allocated_mb,
       coalesce(array_agg(a.job_id ORDER BY a.job_id) FILTER (WHERE a.id IS NOT NULL), '{}')
           AS job_ids,
       (SELECT ARRAY[s.cpu_millis, s.memory_mb, (extract(epoch FROM now() - s.at) * 1000)::int]
          FROM usage_samples s WHERE s.worker_id = w.id AND s.job_id IS NULL
           AND s.at > now() - interval '1 minute' ORDER BY s.at DESC LIMIT 1) AS usage_now,
"""
    + WORKER_DEVICES
    + " GROUP BY w.id ORDER BY w.id\n"
)

# The pending queue's length (the ingest's limit on submissions; index jobs_pending_by_xid).
# The queue the ingest's limit counts (max_pending_jobs): pending jobs and waiting ones (each
# task of an array counts).
COUNT_PENDING = "SELECT count(*) FROM jobs WHERE state IN ('pending', 'waiting')"

STATUS_JOB_COUNTS = "SELECT state, count(*)::bigint AS count FROM jobs GROUP BY state"

# $1 $2 the interval and the dead_after (ms) told while the leader chose none. The heartbeat
# policy in force, as status shows it: interval_ms, dead_after_ms, reason (NULL: the defaults).
STATUS_HEARTBEAT_POLICY = """
SELECT t.interval_ms, t.dead_after_ms, p.reason, p.workers
  FROM heartbeat_told($1, $2) t LEFT JOIN heartbeat_policy p ON p.id = 1
"""

# The first 20 jobs no worker could ever hold; a gang once, by its id (its rank 0 task: its tasks
# share one spec and one reason).
STATUS_UNSCHEDULABLE = (
    _JOB_INFO
    + """
 WHERE j.state = 'pending' AND j.reason LIKE 'unschedulable%' AND (j.gang_id IS NULL OR j.id = j.gang_id)
 ORDER BY j.id LIMIT 20
"""
)


# $1 an account. Whether it is known: it has settings (a row of accounts) or owns a job, in
# any state (index jobs_by_owner). An operator's GetAccount refuses a name that is not (a
# mistyped name would otherwise read as an account with nothing set).
ACCOUNT_KNOWN = """
SELECT EXISTS (SELECT 1 FROM accounts WHERE name = $1) OR EXISTS (SELECT 1 FROM jobs WHERE owner = $1)
"""

# $1 one account (NULL: every account with a row or with queued or in-use jobs). Each, by name:
# its caps (NULL: none), max_priority (NULL: the default) and weight (1 without a row), the
# cpu_millis and memory_mb of its assigned and running jobs, and how many of its jobs are pending
# or waiting. One account is answered even with no row and no jobs (no caps, weight 1, nothing
# used).
ACCOUNTS = """
WITH names AS (
    SELECT $1::text AS name WHERE $1::text IS NOT NULL
    UNION SELECT name FROM accounts WHERE $1::text IS NULL
    UNION SELECT DISTINCT owner FROM jobs
     WHERE $1::text IS NULL AND state IN ('pending', 'waiting', 'assigned', 'running')
)
SELECT n.name, a.cpu_millis, a.memory_mb, a.max_pending, a.max_priority,
       coalesce(a.weight, 1) AS weight,
       coalesce(u.used_cpu_millis, 0) AS used_cpu_millis,
       coalesce(u.used_memory_mb, 0) AS used_memory_mb, coalesce(u.queued_jobs, 0) AS queued_jobs
  FROM names n
  LEFT JOIN accounts a ON a.name = n.name
  LEFT JOIN LATERAL (
      SELECT sum(j.cpu_millis) FILTER (WHERE j.state IN ('assigned', 'running')) AS used_cpu_millis,
             sum(j.memory_mb) FILTER (WHERE j.state IN ('assigned', 'running')) AS used_memory_mb,
             count(*) FILTER (WHERE j.state IN ('pending', 'waiting')) AS queued_jobs
        FROM jobs j
       WHERE j.owner = n.name AND j.state IN ('pending', 'waiting', 'assigned', 'running')
  ) u ON true
 ORDER BY n.name
"""

# $1 the only owner whose schedules it reads (NULL: any), $2 the only name (NULL: any). Each
# schedule by name, with the database's now(), its cursor, its slots recorded (fired, skipped),
# its last slot, the job of its last fired slot and the reason of its last skipped one
# (docs/schedules.md).
LIST_SCHEDULES = """
SELECT s.id, s.name, s.cron, s.tz, s.job::text AS job, s.concurrency_policy, s.starting_deadline_s,
       s.paused, s.owner, s.created_at, s.slots_through, now() AS now,
       c.fired, c.skipped, c.last_slot_at,
       (SELECT job_id FROM schedule_slots WHERE schedule_id = s.id AND job_id IS NOT NULL
         ORDER BY slot_at DESC LIMIT 1) AS last_job_id,
       (SELECT reason FROM schedule_slots WHERE schedule_id = s.id AND outcome = 'skipped'
         ORDER BY slot_at DESC LIMIT 1) AS last_skip_reason
  FROM schedules s,
       LATERAL (SELECT count(*) FILTER (WHERE outcome = 'fired') AS fired,
                       count(*) FILTER (WHERE outcome = 'skipped') AS skipped,
                       max(slot_at) AS last_slot_at
                  FROM schedule_slots WHERE schedule_id = s.id) c
 WHERE ($1::text IS NULL OR s.owner = $1::text) AND ($2::text IS NULL OR s.name = $2::text)
 ORDER BY s.name
"""
