"""Ingest's statements (:mod:`actors.ingest`): the unfenced writes of clients' jobs (submissions,
cancels, accounts) and the sweeps, and the reads they need; the workers' own calls are
:mod:`actors.queries.ingest_workers`, operators' calls on workers and schedules
:mod:`actors.queries.ingest_admin`, the reads behind job queries and the status view
:mod:`actors.queries.reads`.
"""

from __future__ import annotations

from actors.queries.idempotent import once

# ---------------------------------------------------------------- ingest (unfenced writes)

# $1 name, $2 cpu_millis, $3 memory_mb, $4 priority, $5 runtime, $6 sleep_ms, $7 argv, $8 image,
# $9 max_attempts, $10 retry_backoff_ms, $11 count_lost, $12 timeout_ms, $13 constraints (JSON),
# $14 env (JSON), $15 workdir, $16 after_ids, $17 an array's first index (NULL: one job), $18 its
# last index, $19 its limit (0: none), $20 retry_on_exit, $21 no_retry_on, $22 the array's
# max_failed_tasks (NULL: none), $23 its owner (the caller's account), $24 the one account
# whose jobs it may name in after_ids (NULL: any; a user's own: another account's job is as no
# job, so a dependency tells nothing of it), $25 its priority when held to the owner's
# max_priority (NULL: the caller is not capped, an operator), $26 the devices it asks (JSON
# {name: count}; docs/devices.md); then the audit's, the idempotency key and the request's
# sha256 (see once). One job, or one row per task of an array:
# the first task's id is drawn first and is the array's id (array_id of every task). Its
# dependencies are read in the statement's snapshot (schema.sql, dependency_states); it stores
# nothing when one does not exist (its answer is then empty and no key is kept: the caller names
# the missing ids). A task is waiting while a dependency has not succeeded, or while it is beyond
# its array's limit (its position k from 1 above the limit); else pending. Answer: one row, id
# (the job's, or the array's or gang's), tasks (how many rows) and gang (whether a gang). Refused
# whole when $25 is above the owner's max_priority (SQLSTATE SK002), or when its rows would take
# the owner's pending and waiting jobs over its max_pending (SK001) (schema.sql,
# check_submission; a replay is not checked).
# $27 a gang's tasks (NULL: not a gang) and $28 whether they spread: one row per task, ranks 0 to
# $27 - 1, gang_id the first task's id, and the gang's row (docs/gangs.md).
SUBMIT_JOB = once(
    "submit_job",
    """
SELECT min(id) AS id, count(*) AS tasks, bool_or(gang_id IS NOT NULL) AS gang FROM inserted
HAVING count(*) > 0
""",
    params=28,
    action="submit",
    steps="""deps AS (
    SELECT (SELECT count(*) FROM jobs d WHERE d.id = ANY($16::bigint[])
                                          AND ($24::text IS NULL OR d.owner = $24::text))
               = cardinality($16::bigint[]) AS all_exist,
           coalesce((SELECT array_agg(s.dep ORDER BY s.dep) FROM dependency_states($16::bigint[]) s
                      WHERE s.state <> 'succeeded'), '{}') AS unfinished
),
queued AS (
    SELECT check_submission($23::text, coalesce($18::int - $17::int + 1, $27::int, 1), $25::bigint) AS ok
      FROM fresh
),
first AS (
    SELECT nextval('jobs_id_seq') AS id FROM fresh, deps, queued WHERE deps.all_exist AND queued.ok
),
tasks AS (
    SELECT i, row_number() OVER (ORDER BY i) AS k
      FROM generate_series(coalesce($17::int, 0), coalesce($18::int, $27::int - 1, 0)) AS i
),
gang AS (
    INSERT INTO gangs (id, size, spread, max_attempts)
    SELECT f.id, $27::int, $28::boolean, $9::int FROM first f WHERE $27::int IS NOT NULL
),
inserted AS (
    INSERT INTO jobs (id, name, cpu_millis, memory_mb, priority, runtime, sleep_ms, argv, image,
                      max_attempts, retry_backoff_ms, count_lost, timeout_ms, constraints, env,
                      workdir, after_ids, array_id, array_index, array_max_running, state, reason,
                      pending_seq, owner, retry_on_exit, no_retry_on, array_max_failed, resources,
                      gang_id, gang_rank)
    SELECT CASE WHEN t.k = 1 THEN f.id ELSE nextval('jobs_id_seq') END,
           $1::text, $2::int, $3::int, $4::int, $5::text, $6::bigint, $7::text[], $8::text,
           $9::int, $10::bigint, $11::boolean, $12::bigint, $13::jsonb, $14::jsonb, $15::text,
           $16::bigint[],
           CASE WHEN $17::int IS NULL THEN NULL ELSE f.id END,
           CASE WHEN $17::int IS NULL THEN NULL ELSE t.i END,
           CASE WHEN $17::int IS NULL THEN NULL ELSE $19::int END,
           CASE WHEN cardinality(deps.unfinished) > 0 OR (coalesce($19::int, 0) > 0 AND t.k > $19::int)
                THEN 'waiting' ELSE 'pending' END,
           CASE WHEN cardinality(deps.unfinished) > 0
                THEN 'waiting for job ' || array_to_string(deps.unfinished, ', ')
                WHEN coalesce($19::int, 0) > 0 AND t.k > $19::int
                THEN 'array limit: ' || $19::int || ' running'
                ELSE '' END,
           nextval('pending_seq'), $23::text, $20::int[], $21::text[],
           CASE WHEN $17::int IS NULL THEN NULL ELSE $22::int END, $26::jsonb,
           CASE WHEN $27::int IS NULL THEN NULL ELSE f.id END,
           CASE WHEN $27::int IS NULL THEN NULL ELSE t.i END
      FROM first f, deps, tasks t
     ORDER BY t.k
 RETURNING id, gang_id
),""",
)

# $1 names, $2 cpu_millis, $3 memory_mb, $4 priorities, $5 runtimes, $6 sleep_ms, $7 argv as
# JSON arrays (NULL for sleep jobs), $8 images (NULL but for container jobs), $9 max_attempts,
# $10 retry_backoff_ms, $11 count_lost, $12 timeout_ms, $13 constraints (JSON), $14 env (JSON),
# $15 workdir, $16 after_ids, $17 retry_on_exit, $18 no_retry_on (JSON arrays), $19 an array's
# first index (NULL: one job), $20 its last index, $21 its limit (0: none), $22 its
# max_failed_tasks (NULL: none), $23 the jobs of the batch each must wait for (JSON arrays of
# their positions in the batch, from 1), $24 each job's place in the order of storing (from 1:
# each after those it waits for; runtime.validation.pipeline_order); $25 their owner (the
# caller's account), $26 the one account whose jobs they may name (as SUBMIT_JOB's $24), $27
# their highest priority when held to the owner's max_priority (as SUBMIT_JOB's $25), $28 the
# devices each asks (JSON {name: count}; as SUBMIT_JOB's $26), $29 each gang's tasks (NULL: not a
# gang; as SUBMIT_JOB's $27), $30 whether they spread (as SUBMIT_JOB's $28); then the audit's,
# the idempotency key and the request's sha256 (see once). One statement: all jobs or
# none; none when a job names a dependency that does not exist. The ids of all rows (a job, or
# each task of an array or a gang) are drawn first, then handed out in ascending order by the
# order of storing (tasks by index or rank), so a job's id is above those of the jobs of the
# batch it waits for (jobs_after_older_check) whatever order nextval ran in; an array's id is
# its first task's, a gang's its rank 0 task's, with the gang's row as SUBMIT_JOB stores it.
# A job naming jobs of the batch waits for their ids (an array's or a gang's: all its tasks, as
# dependency_states reads it) with its other dependencies; a task beyond its array's limit
# waits as SUBMIT_JOB's. Answer rows: id (the job's, the array's or the gang's), n (its position
# in the batch, from 1), tasks. Refused whole over the owner's max_priority or max_pending, as
# SUBMIT_JOB (every row counts).
SUBMIT_JOBS = once(
    "submit_jobs",
    """
SELECT h.id, h.n, b.tasks FROM heads h JOIN batch b ON b.n = h.n
 WHERE h.id IN (SELECT id FROM inserted)
 ORDER BY h.n
""",
    params=30,
    action="submit",
    steps="""batch AS (
    SELECT t.name, t.cpu, t.mem, t.prio, t.runtime, t.sleep_ms, t.argv, t.image, t.max_attempts,
           t.backoff_ms, t.count_lost, t.timeout_ms, t.constraints, t.env, t.workdir, t.n,
           t.array_first, t.array_last, t.array_max_running, t.array_max_failed, t.ord, t.resources,
           t.gang_tasks, t.spread,
           ARRAY(SELECT jsonb_array_elements_text(t.after_ids::jsonb)::bigint) AS after,
           ARRAY(SELECT jsonb_array_elements_text(t.retry_on_exit_json::jsonb)::int) AS retry_on_exit,
           ARRAY(SELECT jsonb_array_elements_text(t.no_retry_on_json::jsonb)) AS no_retry_on,
           ARRAY(SELECT jsonb_array_elements_text(t.after_ns_json::jsonb)::bigint) AS after_ns,
           CASE WHEN t.array_first IS NOT NULL THEN t.array_last - t.array_first + 1
                ELSE coalesce(t.gang_tasks, 1) END AS tasks
      FROM unnest($1::text[], $2::int[], $3::int[], $4::int[], $5::text[], $6::bigint[], $7::text[],
                  $8::text[], $9::int[], $10::bigint[], $11::boolean[], $12::bigint[], $13::text[],
                  $14::text[], $15::text[], $16::text[], $17::text[], $18::text[], $19::int[],
                  $20::int[], $21::int[], $22::int[], $23::text[], $24::int[], $28::text[],
                  $29::int[], $30::boolean[])
           WITH ORDINALITY AS t(name, cpu, mem, prio, runtime, sleep_ms, argv, image, max_attempts,
                                backoff_ms, count_lost, timeout_ms, constraints, env, workdir,
                                after_ids, retry_on_exit_json, no_retry_on_json, array_first,
                                array_last, array_max_running, array_max_failed, after_ns_json,
                                ord, resources, gang_tasks, spread, n)
),
deps AS (
    SELECT b.n, (SELECT count(*) FROM jobs d WHERE d.id = ANY(b.after)
                                       AND ($26::text IS NULL OR d.owner = $26::text))
                = cardinality(b.after) AS all_exist,
           coalesce((SELECT array_agg(s.dep ORDER BY s.dep) FROM dependency_states(b.after) s
                      WHERE s.state <> 'succeeded'), '{}') AS unfinished
      FROM batch b
),
queued AS (
    SELECT check_submission($25::text, (SELECT sum(tasks) FROM batch), $27::bigint) AS ok FROM fresh
),
placed AS (
    SELECT b.n, b.array_first, b.array_last, b.gang_tasks,
           coalesce(sum(b.tasks) OVER (ORDER BY b.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                    0) AS start
      FROM batch b
),
-- One row per row to store (a job, or each task of an array by index, of a gang by rank): its
-- place k among the ids drawn, counted from 1 in the order of storing.
expanded AS (
    SELECT p.n, i AS array_index, i - coalesce(p.array_first, 0) + 1 AS pos,
           p.start + i - coalesce(p.array_first, 0) + 1 AS k
      FROM placed p
     CROSS JOIN LATERAL generate_series(coalesce(p.array_first, 0),
                                        coalesce(p.array_last, p.gang_tasks - 1, 0)) AS i
),
drawn AS (
    SELECT row_number() OVER (ORDER BY x.id) AS k, x.id
      FROM (SELECT nextval('jobs_id_seq') AS id
              FROM fresh, queued, generate_series(1, (SELECT sum(tasks) FROM batch)::int)
             WHERE queued.ok AND NOT EXISTS (SELECT FROM deps WHERE NOT deps.all_exist)) x
),
heads AS (
    SELECT p.n, d.id FROM placed p JOIN drawn d ON d.k = p.start + 1
),
gang AS (
    INSERT INTO gangs (id, size, spread, max_attempts)
    SELECT h.id, b.gang_tasks, b.spread, b.max_attempts
      FROM heads h JOIN batch b ON b.n = h.n WHERE b.gang_tasks IS NOT NULL
),
named AS (
    SELECT b.n, array_agg(h.id ORDER BY h.id) AS ids
      FROM batch b CROSS JOIN LATERAL unnest(b.after_ns) AS a(n) JOIN heads h ON h.n = a.n
     GROUP BY b.n
),
rows_ AS (
    SELECT b.*, dr.id, h.id AS head_id, e.array_index, e.pos,
           coalesce(nm.ids, '{}') AS batch_after, d.unfinished
      FROM expanded e
      JOIN drawn dr ON dr.k = e.k
      JOIN batch b ON b.n = e.n
      JOIN deps d ON d.n = e.n
      JOIN heads h ON h.n = e.n
      LEFT JOIN named nm ON nm.n = e.n
),
inserted AS (
    INSERT INTO jobs (id, name, cpu_millis, memory_mb, priority, runtime, sleep_ms, argv, image,
                      max_attempts, retry_backoff_ms, count_lost, timeout_ms, constraints, env,
                      workdir, after_ids, array_id, array_index, array_max_running,
                      array_max_failed, state, reason, pending_seq, owner, retry_on_exit,
                      no_retry_on, resources, gang_id, gang_rank)
    SELECT r.id, r.name, r.cpu, r.mem, r.prio, r.runtime, r.sleep_ms,
           CASE WHEN r.argv IS NULL THEN NULL
                ELSE ARRAY(SELECT jsonb_array_elements_text(r.argv::jsonb)) END,
           r.image, r.max_attempts, r.backoff_ms, r.count_lost, r.timeout_ms, r.constraints::jsonb,
           r.env::jsonb, r.workdir, r.after || r.batch_after,
           CASE WHEN r.array_first IS NULL THEN NULL ELSE r.head_id END,
           CASE WHEN r.array_first IS NULL THEN NULL ELSE r.array_index END,
           CASE WHEN r.array_first IS NULL THEN NULL ELSE r.array_max_running END,
           CASE WHEN r.array_first IS NULL THEN NULL ELSE r.array_max_failed END,
           CASE WHEN cardinality(w.ids) > 0
                     OR (coalesce(r.array_max_running, 0) > 0 AND r.pos > r.array_max_running)
                THEN 'waiting' ELSE 'pending' END,
           CASE WHEN cardinality(w.ids) > 0
                THEN 'waiting for job ' || array_to_string(w.ids, ', ')
                WHEN coalesce(r.array_max_running, 0) > 0 AND r.pos > r.array_max_running
                THEN 'array limit: ' || r.array_max_running || ' running'
                ELSE '' END,
           nextval('pending_seq'), $25::text, r.retry_on_exit, r.no_retry_on, r.resources::jsonb,
           CASE WHEN r.gang_tasks IS NULL THEN NULL ELSE r.head_id END,
           CASE WHEN r.gang_tasks IS NULL THEN NULL ELSE r.array_index END
      FROM rows_ r
     CROSS JOIN LATERAL (
         SELECT ARRAY(SELECT u FROM unnest(r.unfinished || r.batch_after) AS u ORDER BY u) AS ids
     ) w
     ORDER BY r.id
 RETURNING id
),""",
)

# $1 account name, $2 cpu_millis cap, $3 memory_mb cap, $4 max_pending, $5 max_priority (each
# NULL: keep the stored one), $6 weight (NULL: keep; a new row's is 1), $7 settings to remove
# (text[]); then the audit's (action account_set), the idempotency key and the request's sha256
# (see once). Answer: one row, the account as stored (id: its name).
SET_ACCOUNT = once(
    "set_account",
    """
INSERT INTO accounts AS a (name, cpu_millis, memory_mb, max_pending, max_priority, weight)
SELECT $1::text, $2::bigint, $3::bigint, $4::bigint, $5::bigint, coalesce($6::float8, 1) FROM fresh
    ON CONFLICT (name) DO UPDATE SET
       cpu_millis = CASE WHEN 'cpu_millis' = ANY($7::text[]) THEN NULL
                         ELSE coalesce(EXCLUDED.cpu_millis, a.cpu_millis) END,
       memory_mb = CASE WHEN 'memory_mb' = ANY($7::text[]) THEN NULL
                        ELSE coalesce(EXCLUDED.memory_mb, a.memory_mb) END,
       max_pending = CASE WHEN 'max_pending' = ANY($7::text[]) THEN NULL
                          ELSE coalesce(EXCLUDED.max_pending, a.max_pending) END,
       max_priority = CASE WHEN 'max_priority' = ANY($7::text[]) THEN NULL
                           ELSE coalesce(EXCLUDED.max_priority, a.max_priority) END,
       weight = coalesce($6::float8, a.weight), updated_at = now()
RETURNING name AS id, cpu_millis, memory_mb, max_pending, max_priority, weight
""",
    params=7,
    action="account_set",
)

# $1 job ids, $2 the one account whose jobs count (NULL: any). Those that do not exist, or are
# another account's, by id (a submission naming them stored nothing).
MISSING_JOBS = """
SELECT coalesce(array_agg(i ORDER BY i), '{}') FROM unnest($1::bigint[]) AS i
 WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE id = i AND ($2::text IS NULL OR owner = $2::text))
"""

# $1 job id, $2 only this job (not the array it is the id of), $3 the only owner whose jobs it
# may cancel (NULL: any; another's job is as no job); then the audit's, the idempotency key and
# the request's sha256 (see once). The job, or, when $1 is an array's id and $2 is false, every task
# of the array that has not ended (an array's id is its first task's). Pending or waiting:
# cancelled at once. Assigned or running: the leader cancels it on its worker and ends the
# assignment (a fenced write). A job that has ended is left as it is, but answered (a job of its
# own; an array's id when every task has ended). A gang's task: every task of its gang, and the
# gang is cancelled (docs/gangs.md). Answer: one row (none: no such job): id, state
# (cancelled when any was cancelled at once, else the first's), cancel_requested (any), tasks
# (how many the call cancelled or is cancelling, 0 for a job).
CANCEL_JOB = once(
    "cancel_job",
    """
SELECT $1::bigint AS id,
       CASE WHEN bool_or(was_open AND state = 'cancelled') THEN 'cancelled'
            ELSE (array_agg(state ORDER BY id))[1] END AS state,
       bool_or(cancel_requested) AS cancel_requested,
       CASE WHEN (bool_or(array_id = $1::bigint) AND NOT $2::boolean) OR bool_or(gang_id IS NOT NULL)
            THEN count(*) FILTER (WHERE was_open) ELSE 0 END AS tasks
  FROM cancelled
HAVING count(*) > 0
""",
    params=3,
    action="cancel",
    # Something changed: a job that had not ended and was not being cancelled already.
    changed="""EXISTS (SELECT FROM targets
                 WHERE was IN ('waiting', 'pending', 'assigned', 'running') AND NOT was_requested)""",
    steps="""targets AS (
    SELECT id, state AS was, cancel_requested AS was_requested FROM jobs
     WHERE EXISTS (SELECT FROM fresh)
       AND ($3::text IS NULL OR owner = $3::text)
       AND (id = $1::bigint
            OR (NOT $2::boolean AND array_id = $1::bigint
                AND state IN ('waiting', 'pending', 'assigned', 'running'))
            -- a gang runs whole: a cancel of any of its tasks cancels every one (docs/gangs.md)
            OR (gang_id = (SELECT g.gang_id FROM jobs g WHERE g.id = $1::bigint)
                AND state IN ('waiting', 'pending', 'assigned', 'running')))
       FOR UPDATE
),
cancelled AS (
    UPDATE jobs j
       SET cancel_requested = j.state IN ('assigned', 'running'),
           cancel_requested_at = CASE WHEN j.state IN ('waiting', 'pending', 'assigned', 'running')
                                      THEN coalesce(j.cancel_requested_at, now())
                                      ELSE j.cancel_requested_at END,
           reason = CASE WHEN j.state IN ('pending', 'waiting') THEN '' ELSE j.reason END,
           state = CASE WHEN j.state IN ('pending', 'waiting') THEN 'cancelled' ELSE j.state END,
           finished_at = CASE WHEN j.state IN ('pending', 'waiting') THEN now() ELSE j.finished_at END
      FROM targets t
     WHERE j.id = t.id
 RETURNING j.id, j.array_id, j.gang_id, j.state, j.cancel_requested,
           t.was IN ('waiting', 'pending', 'assigned', 'running') AS was_open
),
gang_cancelled AS (
    UPDATE gangs g SET state = 'cancelled', detail = 'cancelled'
     WHERE g.id IN (SELECT gang_id FROM cancelled) AND g.state = 'live'
),""",
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

# $1 retention_s, $2 most rows. Deletes up to $2 usage samples recorded more than $1 seconds ago
# (index usage_samples_by_age), skipping rows another replica's sweep holds; returns how many.
SWEEP_USAGE_SAMPLES = """
WITH swept AS (
    DELETE FROM usage_samples
     WHERE ctid IN (SELECT ctid FROM usage_samples
                     WHERE at < now() - make_interval(secs => $1::float8)
                     LIMIT $2 FOR UPDATE SKIP LOCKED)
 RETURNING 1
)
SELECT count(*) FROM swept
"""

# The usage samples of a heartbeat recorded alone and alive, one per element (the function
# record_usage in schema.sql): $1 worker ids, $2 assignment ids (0: all the worker's jobs
# together), $3 cpu_millis, $4 memory_mb, $5 span_ms; returns how many were kept.
RECORD_USAGE = "SELECT record_usage($1::text[], $2::bigint[], $3::int[], $4::int[], $5::int[])"
