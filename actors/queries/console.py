"""The web console's statements (:mod:`actors.console`): reads only, never a write.

Every time is the database's: ages and reigns are computed by ``now()`` in the statement, and
instants are returned as Unix seconds (``*_unix_s``) for display. Each statement is bounded by
its index or a ``LIMIT``, so no page reads more than a few hundred rows.
"""

from __future__ import annotations

from actors.queries.reads import GET_JOB, JOB_EVENTS, LOG_SOURCE, WORKER_DEVICES

# The lease, whether it is live by database time, and how long its holder has led (since the
# takeover that began its epoch, from lease_history).
CONSOLE_LEASE = """
SELECT l.holder, l.epoch, l.expires_at > now() AS live,
       extract(epoch FROM l.expires_at - now())::float8 AS remaining_s,
       extract(epoch FROM h.acquired_at)::float8 AS acquired_unix_s,
       extract(epoch FROM now() - h.acquired_at)::float8 AS led_for_s,
       extract(epoch FROM now())::float8 AS now_unix_s
  FROM lease l LEFT JOIN lease_history h ON h.epoch = l.epoch
 WHERE l.id = 1
"""

# Every replica that has announced itself: its addresses, its process and how recently it did.
CONSOLE_CONTROL_PLANES = """
SELECT id, address, console_url, pid,
       extract(epoch FROM started_at)::float8 AS started_unix_s,
       extract(epoch FROM now() - seen_at)::float8 AS seen_age_s,
       seen_at > now() - interval '3 seconds' AS up
  FROM control_planes ORDER BY id
"""

# The consoles of the replicas seen in the last 10 s: where an open page may move.
CONSOLE_URLS = """
SELECT id, console_url FROM control_planes
 WHERE console_url IS NOT NULL AND seen_at > now() - interval '10 seconds'
 ORDER BY id
"""

# $1 how many. The last elections, newest first, with their cause and how long each reign
# lasted (NULL for the current one).
CONSOLE_ELECTIONS = """
SELECT epoch, holder, previous, coalesce(cause, '') AS cause,
       extract(epoch FROM acquired_at)::float8 AS acquired_unix_s,
       extract(epoch FROM lead(acquired_at) OVER (ORDER BY epoch) - acquired_at)::float8 AS reign_s
  FROM (SELECT * FROM lease_history ORDER BY epoch DESC LIMIT $1) recent
 ORDER BY epoch DESC
"""

_WORKER_COLUMNS = (
    """
SELECT w.id, w.address, w.state, w.cpu_millis, w.memory_mb, w.incarnation, w.labels::text AS labels,
       extract(epoch FROM now() - w.last_heartbeat_at)::float8 AS heartbeat_age_s,
       extract(epoch FROM w.registered_at)::float8 AS registered_unix_s,
       w.cordoned_at IS NOT NULL AS cordoned, w.drain_requested_at IS NOT NULL AS drain_requested,
       extract(epoch FROM w.drain_deadline_at - now())::float8 AS drain_deadline_in_s,
       extract(epoch FROM w.hold_until - now())::float8 AS hold_for_s,
       w.unhealthy_at IS NOT NULL AS unhealthy, w.unhealthy_reason,
       extract(epoch FROM w.unhealthy_at)::float8 AS unhealthy_since_unix_s,
       extract(epoch FROM w.unhealthy_probe_at - now())::float8 AS probe_in_s,
       coalesce(sum(a.cpu_millis), 0)::bigint AS cpu_allocated_millis,
       coalesce(sum(a.memory_mb), 0)::bigint AS memory_allocated_mb,
       count(a.id)::bigint AS job_count,
"""
    + WORKER_DEVICES
)

# Every worker with what its active assignments hold (index assignments_active_by_worker).
CONSOLE_WORKERS = _WORKER_COLUMNS + " GROUP BY w.id ORDER BY w.id"

# $1 worker id. One worker, as CONSOLE_WORKERS (no row: no such worker).
CONSOLE_WORKER = _WORKER_COLUMNS + " WHERE w.id = $1 GROUP BY w.id"

# $1 worker id, $2 how many, $3 the only owner whose jobs' runs it lists (NULL: any). Its
# assignments, active ones first, then the newest.
CONSOLE_WORKER_ASSIGNMENTS = """
SELECT a.id, a.job_id, j.name, j.array_index, j.gang_rank, a.state, a.epoch, a.worker_incarnation,
       a.cpu_millis, a.memory_mb,
       coalesce(a.end_reason, '') AS end_reason, a.exit_code,
       extract(epoch FROM a.created_at)::float8 AS created_unix_s,
       extract(epoch FROM a.ended_at)::float8 AS ended_unix_s
  FROM assignments a JOIN jobs j ON j.id = a.job_id
 WHERE a.worker_id = $1 AND ($3::text IS NULL OR j.owner = $3::text)
 ORDER BY a.state = 'active' DESC, a.id DESC LIMIT $2
"""

# $1 state ('' any), $2 a part of the name ('' any; matched as text, not as a pattern),
# $3 a worker id ('' any: else jobs with a run on that worker), $4 how many, $5 the only owner
# whose jobs it lists (NULL: any), $6 a job id (NULL: any; an array's or a gang's id also matches
# its tasks), $7 an array task's index or a gang task's rank (NULL: any), $8 only jobs older than
# this id (NULL: from the newest).
# Newest first, with the worker of each job's latest run.
CONSOLE_JOBS = """
SELECT j.id, j.name, j.array_index, j.gang_rank, j.state, j.reason, j.runtime, j.cpu_millis, j.memory_mb,
       j.priority, j.attempts, j.exit_code, j.owner,
       extract(epoch FROM j.submitted_at)::float8 AS submitted_unix_s,
       extract(epoch FROM now() - j.submitted_at)::float8 AS age_s, a.worker_id
  FROM jobs j
  LEFT JOIN LATERAL (
      SELECT worker_id FROM assignments WHERE job_id = j.id ORDER BY id DESC LIMIT 1
  ) a ON true
 WHERE ($1 = '' OR j.state = $1)
   AND ($2 = '' OR strpos(lower(j.name), lower($2)) > 0)
   AND ($3 = '' OR EXISTS (SELECT FROM assignments b WHERE b.job_id = j.id AND b.worker_id = $3))
   AND ($5::text IS NULL OR j.owner = $5::text)
   AND ($6::bigint IS NULL OR j.id = $6::bigint OR j.array_id = $6::bigint OR j.gang_id = $6::bigint)
   AND ($7::int IS NULL OR j.array_index = $7::int OR j.gang_rank = $7::int)
   AND ($8::bigint IS NULL OR j.id < $8::bigint)
 ORDER BY j.id DESC LIMIT $4
"""

# $1 the only owner whose jobs it counts (NULL: any).
CONSOLE_JOB_COUNTS = """
SELECT state, count(*)::bigint AS count FROM jobs WHERE $1::text IS NULL OR owner = $1::text GROUP BY state
"""

# $1 job id, $2 the only owner whose job it reads (NULL: any). The job and its spec's columns (as
# the GetJob RPC reads it; no row: no such job, or another owner's).
CONSOLE_JOB = GET_JOB

# $1 job id. Every run (assignment) of the job, oldest first.
CONSOLE_JOB_ATTEMPTS = """
SELECT id, worker_id, worker_incarnation, epoch, state, coalesce(end_reason, '') AS end_reason,
       ended_epoch, outcome, exit_code, coalesce(detail, '') AS detail, counted,
       extract(epoch FROM created_at)::float8 AS created_unix_s,
       extract(epoch FROM confirmed_at)::float8 AS confirmed_unix_s,
       extract(epoch FROM ended_at)::float8 AS ended_unix_s
  FROM assignments WHERE job_id = $1 ORDER BY id
"""

# $1 job id, $2 0 (any run), $3 the only owner (NULL: any). Where the job's output is read
# (actors/logs.py: the same row ReadJobLogs reads).
CONSOLE_LOG_SOURCE = LOG_SOURCE

# $1 job id, $2 the only owner (NULL: any). The job's history, oldest first (as GetJobEvents and
# `stockade job ID --events` read it); no row: no such job, or another owner's.
CONSOLE_JOB_EVENTS = JOB_EVENTS

# The cluster's packing now: the capacity of the alive workers and what active assignments hold
# on them, and how many jobs run (one sample of the packing chart).
CONSOLE_PACKING_SAMPLE = """
SELECT coalesce(sum(w.cpu_millis), 0)::bigint AS cpu_capacity_millis,
       coalesce(sum(w.memory_mb), 0)::bigint AS memory_capacity_mb,
       coalesce(sum(t.cpu_millis), 0)::bigint AS cpu_allocated_millis,
       coalesce(sum(t.memory_mb), 0)::bigint AS memory_allocated_mb,
       coalesce(sum(t.jobs), 0)::bigint AS job_count,
       count(w.id)::bigint AS worker_count
  FROM workers w
  LEFT JOIN LATERAL (
      SELECT sum(a.cpu_millis) AS cpu_millis, sum(a.memory_mb) AS memory_mb, count(*) AS jobs
        FROM assignments a WHERE a.worker_id = w.id AND a.state = 'active'
  ) t ON true
 WHERE w.state = 'alive'
"""

# A series of usage samples (docs/console.md, "Usage"), one row: the database's now and the
# samples' instants (unix s), cpu_millis and memory_mb, oldest first: the newest $3 of those
# recorded in the last $2 seconds that the WHERE clause between the two parts picks ($1).
_USAGE_SERIES_HEAD = """
SELECT extract(epoch FROM now())::float8 AS now_unix_s,
       coalesce(array_agg(extract(epoch FROM s.at)::float8 ORDER BY s.at), '{}') AS unix_s,
       coalesce(array_agg(s.cpu_millis ORDER BY s.at), '{}') AS cpu_millis,
       coalesce(array_agg(s.memory_mb ORDER BY s.at), '{}') AS memory_mb
  FROM (SELECT at, cpu_millis, memory_mb FROM usage_samples
"""
_USAGE_SERIES_TAIL = """
           AND at > now() - make_interval(secs => $2::float8)
         ORDER BY at DESC LIMIT $3) s
"""

# $1 job id, $2 span (s), $3 most samples: a job's samples, all its runs' (index usage_samples_by_job).
CONSOLE_JOB_USAGE = _USAGE_SERIES_HEAD + "WHERE job_id = $1" + _USAGE_SERIES_TAIL

# $1 worker id, $2 span (s), $3 most samples: the samples of all a worker's jobs together
# (index usage_samples_by_worker).
CONSOLE_WORKER_USAGE = _USAGE_SERIES_HEAD + "WHERE worker_id = $1 AND job_id IS NULL" + _USAGE_SERIES_TAIL
