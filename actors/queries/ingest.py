"""Ingest's statements (:mod:`actors.ingest`): the unfenced writes (submissions, cancels,
registrations, heartbeats, leaves, presence, cordons and drains, the idempotency sweep) and the
reads they need; the reads behind job queries and the status view are :mod:`actors.queries.reads`.
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

# $1 id, $2 address, $3 cpu_millis, $4 memory_mb, $5 labels (json text), $6 agent run id, $7
# registration number within that run, $8 the registration's sha256 (actors/idempotency.py), $9
# the devices it offers (JSON {name: [unit, ...]}; docs/devices.md).
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
                     registration_seq, registration_sha256, resources)
VALUES ($1, $2, $3, $4, $5::jsonb, nextval('worker_incarnation_seq'), $6, $7, $8, $9::jsonb)
ON CONFLICT (id) DO UPDATE
   SET address = EXCLUDED.address, cpu_millis = EXCLUDED.cpu_millis,
       memory_mb = EXCLUDED.memory_mb, labels = EXCLUDED.labels,
       incarnation = EXCLUDED.incarnation, state = 'alive',
       registered_at = now(), last_heartbeat_at = now(), dead_at = NULL, dead_epoch = NULL,
       left_at = NULL, hold_until = NULL,
       agent_run_id = EXCLUDED.agent_run_id, registration_seq = EXCLUDED.registration_seq,
       registration_sha256 = EXCLUDED.registration_sha256, resources = EXCLUDED.resources
 WHERE workers.agent_run_id <> EXCLUDED.agent_run_id
    OR workers.registration_seq < EXCLUDED.registration_seq
RETURNING incarnation
"""

# $1 worker id, $2 the incarnation this transaction registered or continued, $3 true for a new
# registration (REGISTER_WORKER made it), false for a continued one (CONTINUE_WORKER). The last
# statement of the registration's transaction, right before its commit: the worker's silence
# counts from here (clock_timestamp(), the statement's own time), not from the transaction's
# start (now()), which lock waits, outcomes and a busy control plane may put seconds earlier: a
# registration that took longer than dead_after to commit would otherwise be judged silent the
# moment it is seen. A new registration sets registered_at to the same time, so
# last_heartbeat_at stays equal to it until the new incarnation's first heartbeat
# (END_ORPHANED_ASSIGNMENTS counts on that). A copy of the applied registration (same agent
# run and number: a retry whose first answer was lost, a hedged copy) is answered again and
# stamps last_heartbeat_at alone ($3 false): its agent may learn of its incarnation only from
# this answer, and that agent stopped every job before it registered, so the orphan rule may
# count it as heard. A late copy of another run's registration is a new registration (above).
#
# It also sets the dead_after the worker is judged by to the one its reply tells ($4 $5: the
# interval and dead_after, ms, to tell while the leader chose none; schema.sql, heartbeat_told):
# a new incarnation's is that one, and its heartbeats' order starts anew; a continued or copied
# one's is never lowered (its agent may still derive its fence from a larger one). Returns the
# interval and the dead_after to tell (no row: the worker is not alive in that incarnation).
STAMP_REGISTRATION = """
UPDATE workers w
   SET last_heartbeat_at = greatest(w.last_heartbeat_at, c.at),
       registered_at = CASE WHEN $3 THEN c.at ELSE w.registered_at END,
       dead_after_ms = CASE WHEN $3 THEN t.dead_after_ms ELSE greatest(w.dead_after_ms, t.dead_after_ms) END,
       heartbeat_sent_us = CASE WHEN $3 THEN 0 ELSE w.heartbeat_sent_us END
  FROM (SELECT clock_timestamp() AS at) c, heartbeat_told($4, $5) t
 WHERE w.id = $1 AND w.incarnation = $2 AND w.state = 'alive'
RETURNING t.interval_ms, t.dead_after_ms
"""

# $1 worker id, $2 incarnation, $3 $4 the interval and dead_after (ms) to tell while the leader
# chose none. A copy of a continued registration, answered again: what its reply tells is
# recorded as the dead_after the worker is judged by (never lowered; see STAMP_REGISTRATION).
TELL_WORKER = """
UPDATE workers w SET dead_after_ms = greatest(w.dead_after_ms, t.dead_after_ms)
  FROM heartbeat_told($3, $4) t
 WHERE w.id = $1 AND w.incarnation = $2 AND w.state = 'alive'
RETURNING t.interval_ms, t.dead_after_ms
"""

# $1 worker id. The registration a REGISTER_WORKER (or CONTINUE_WORKER) that returned nothing met.
WORKER_REGISTRATION = """
SELECT incarnation, state, agent_run_id, registration_seq, registration_sha256 FROM workers WHERE id = $1
"""

# Restarts that keep their jobs (docs/design.md, "Restarts"): a registration that asks to
# continue incarnation $9. Parameters as REGISTER_WORKER's ($1 id, $2 address, $3 cpu_millis, $4
# memory_mb, $5 labels, $6 agent run id, $7 registration number, $8 sha256), then $9, and $10
# the devices it offers (as REGISTER_WORKER's $9). The row
# takes the new agent run, address, capacity and labels, a fresh heartbeat and no restart
# hold, keeping its incarnation, only if it is still alive in that incarnation (not declared
# dead, not left, not registered again since) and this is not a copy of a registration already
# applied (same run, a number not above the stored one): one statement, so a dead-worker
# declaration or another registration that commits first is seen (the UPDATE re-checks its
# condition on the row's newest version) and one that comes later finds the fresh heartbeat.
# Returns the incarnation; nothing when the row is not continued (WORKER_REGISTRATION says why).
CONTINUE_WORKER = """
UPDATE workers
   SET address = $2, cpu_millis = $3, memory_mb = $4, labels = $5::jsonb,
       last_heartbeat_at = now(), hold_until = NULL,
       agent_run_id = $6, registration_seq = $7, registration_sha256 = $8, resources = $10::jsonb
 WHERE id = $1 AND incarnation = $9 AND state = 'alive'
   AND (agent_run_id <> $6 OR registration_seq < $7)
RETURNING incarnation
"""

# $1 worker id, $2 the continued incarnation, $3 the assignment ids its agent holds. Ends every
# other active assignment of that incarnation on the worker's word (as a not_started outcome
# does, schema.sql record_outcomes): its agent runs none of them (it stopped whatever else of
# that incarnation it found running, and waited until it was gone, before it asked) and refuses
# them from the reply on. They end 'stopped' (end_reason 'released') and their jobs go to
# schema.sql's requeue_unspent. Returns the ended ids.
RELEASE_UNHELD_ASSIGNMENTS = """
WITH released AS (
    UPDATE assignments a
       SET state = 'stopped', ended_at = now(), end_reason = 'released',
           detail = 'released: its worker''s agent restarted and does not run it'
     WHERE a.worker_id = $1 AND a.worker_incarnation = $2 AND a.state = 'active'
       AND NOT (a.id = ANY($3::bigint[]))
 RETURNING a.id, a.job_id
)
SELECT coalesce(array_agg(id ORDER BY id), '{}'), requeue_unspent(array_agg(job_id)) FROM released
"""

# $1 worker id, $2 a continued incarnation. The assignments its continuation released
# (RELEASE_UNHELD_ASSIGNMENTS), for a copy of that continuation, whose reply must name them too
# (its agent refuses them if they are sent). Rare (a reply lost, then a retry), so a scan of the
# worker's assignments is fine.
RELEASED_ASSIGNMENTS = """
SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM assignments
 WHERE worker_id = $1 AND worker_incarnation = $2 AND state = 'stopped' AND end_reason = 'released'
"""

# $1 worker id, $2 the continued incarnation, $3 the assignment ids its agent holds. Confirms
# them as a heartbeat's running list does (the first listing sets confirmed_at, and an assigned
# job becomes running), and returns those that are not active on this worker in that
# incarnation: the agent stops them.
CONFIRM_HELD_ASSIGNMENTS = """
WITH confirmed AS (
    UPDATE assignments SET confirmed_at = now()
     WHERE id = ANY($3::bigint[]) AND worker_id = $1 AND worker_incarnation = $2
       AND state = 'active' AND confirmed_at IS NULL
 RETURNING job_id
),
running AS (
    UPDATE jobs j SET state = 'running', started_at = coalesce(j.started_at, now())
      FROM confirmed WHERE j.id = confirmed.job_id AND j.state = 'assigned'
)
SELECT coalesce(array_agg(h.id ORDER BY h.id), '{}') FROM unnest($3::bigint[]) AS h(id)
 WHERE NOT EXISTS (SELECT 1 FROM assignments a
                    WHERE a.id = h.id AND a.worker_id = $1 AND a.worker_incarnation = $2
                      AND a.state = 'active')
"""

# $1 worker id, $2 incarnation, $3 hold (s). A planned restart's hold, after the heartbeat that
# asks for it (HEARTBEAT, same connection): hold_until = now() + $3, only while the row is alive
# in that incarnation. Returns a row when it was recorded. The agent moves its fence deadline on
# by the hold only on that answer; the hold counts from this statement's now(), which is not
# before the heartbeat was sent (docs/design.md, "Restarts").
SET_RESTART_HOLD = """
WITH promised AS (SELECT id FROM workers WHERE id = $1 FOR UPDATE)
UPDATE workers w SET hold_until = now() + make_interval(secs => $3::float8)
  FROM promised
 WHERE w.id = promised.id AND w.incarnation = $2 AND w.state = 'alive'
RETURNING w.hold_until
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

# $1 worker id. Serialises the registrations of one worker id for the rest of the transaction
# (a transaction-level advisory lock, in a namespace of its own), taken first, before
# LOCK_WORKER: a copy of a worker's first registration that arrives while the original has not
# committed finds no row to lock, and without this would run REGISTER_WORKER, whose nextval is
# drawn before its conflict check, using up an incarnation number; with it, the copy waits and
# then finds the original's row. Only registrations take it, always first, so it joins no cycle.
# The namespace is 0x53524547 ("SREG"); two ids with the same hashtext only wait for each other.
LOCK_REGISTRATION = "SELECT pg_advisory_xact_lock(1397900615, hashtext($1))"

# $1 worker id. Locks the worker's row (if any) for the rest of the transaction, first in every
# transaction that takes it (one lock order). Every promise about the worker's future (a cordon,
# a drain, a clean leave, a registration, a restart hold) takes it before it writes or reads
# what it answers: FOR UPDATE conflicts with the FOR KEY SHARE a placement takes on its workers
# (actors/queries/ledger.py, COMMIT_PLACEMENTS), so a placement in progress commits first and
# the promise's next statement sees its assignments, and a placement after it sees the promise.
LOCK_WORKER = "SELECT id FROM workers WHERE id = $1 FOR UPDATE"

# A worker's finished outcomes, from a registration (heartbeats carry theirs through HEARTBEAT):
# the function record_outcomes in schema.sql, its parameters as $1 .. $9. Returns how many were
# recorded late.
RECORD_OUTCOMES = """
SELECT record_outcomes($1, $2::bigint[], $3::text[], $4::int[], $5::bigint[], $6::bigint[],
                       $7::text[], $8::text[], $9::text[])
"""

# One heartbeat, one statement: the function record_heartbeat in schema.sql (liveness, finished
# outcomes, running confirmations, which running assignments to stop), its parameters as
# $1 .. $15 and its row as it returns it.
HEARTBEAT = """
SELECT current_epoch, alive, stop_assignment_ids, database_unix_s, told_interval_ms, told_dead_after_ms
  FROM record_heartbeat($1, $2, $3::bigint[], $4::bigint[], $5::text[], $6::int[], $7::bigint[],
                        $8::bigint[], $9::text[], $10::text[], $11::text[], $12, $13, $14, $15)
"""

# Liveness-only heartbeats of several workers, one statement: the function record_heartbeats in
# schema.sql (actors/heartbeat_group.py gathers them), its parameters as $1 .. $8 and its rows as
# it returns them, one per member, in member order.
RECORD_HEARTBEATS = """
SELECT member, alive, skipped, stop_assignment_ids, newer_agent_run_id, newer_address,
       newer_incarnation, current_epoch, database_unix_s, told_interval_ms, told_dead_after_ms
  FROM record_heartbeats($1::text[], $2::bigint[], $3::bigint[], $4::int[], $5::bigint[], $6::int[],
                         $7, $8)
"""

# RECORD_HEARTBEATS ($1 .. $8, its rows in member order) and, in the same statement, the usage
# samples of the members it recorded alive (not skipped): $9 their member numbers (1-based, as
# in $1), $10 assignment ids (0: the worker's jobs together), $11 cpu_millis, $12 memory_mb,
# $13 span_ms (record_usage in schema.sql). A group whose heartbeats carry no sample runs
# RECORD_HEARTBEATS alone.
RECORD_HEARTBEATS_AND_USAGE = (
    "WITH beats AS MATERIALIZED ("
    + RECORD_HEARTBEATS
    + """), samples AS (
SELECT record_usage(array_agg(w.worker_id), array_agg(u.assignment_id), array_agg(u.cpu_millis),
                    array_agg(u.memory_mb), array_agg(u.span_ms)) AS kept
  FROM unnest($9::int[], $10::bigint[], $11::int[], $12::int[], $13::int[])
       AS u (member, assignment_id, cpu_millis, memory_mb, span_ms)
  JOIN beats b ON b.member = u.member AND b.alive AND NOT b.skipped
  JOIN unnest($1::text[]) WITH ORDINALITY AS w (worker_id, member) ON w.member = u.member
)
SELECT b.* FROM beats b CROSS JOIN samples ORDER BY b.member
"""
)

CURRENT_EPOCH = "SELECT epoch FROM lease WHERE id = 1"

# The current epoch and the database's clock (now(), unix s: the start of the caller's
# transaction), for a registration's reply: the agent times its log by it (agent/dbclock.py).
EPOCH_AND_CLOCK = "SELECT epoch, extract(epoch FROM now())::float8 AS database_unix_s FROM lease WHERE id = 1"

# $1 worker id, $2 an incarnation. The registration that replaced it, when the worker is alive
# in a newer incarnation: its agent run, address and incarnation (no row: none). Asked only
# for a heartbeat that is told to register again.
NEWER_REGISTRATION = """
SELECT agent_run_id, address, incarnation FROM workers
 WHERE id = $1 AND state = 'alive' AND incarnation > $2
"""

# $1 id, $2 address, $3 pid, $4 its console's origin (NULL: it serves none), $5 the CPU time one
# heartbeat costs it (µs; NULL: not measured yet), $6 the 99th percentile over the workers of
# the waits their heartbeats reported lately (ms; NULL: too few workers reported)
RECORD_PRESENCE = """
INSERT INTO control_planes (id, address, pid, started_at, seen_at, console_url, cpu_per_heartbeat_us,
                            heartbeat_wait_p99_ms)
VALUES ($1, $2, $3, now(), now(), $4, $5, $6)
ON CONFLICT (id) DO UPDATE
   SET address = EXCLUDED.address, seen_at = now(), console_url = EXCLUDED.console_url,
       cpu_per_heartbeat_us = coalesce(EXCLUDED.cpu_per_heartbeat_us, control_planes.cpu_per_heartbeat_us),
       heartbeat_wait_p99_ms = EXCLUDED.heartbeat_wait_p99_ms,
       started_at = CASE WHEN control_planes.pid IS DISTINCT FROM EXCLUDED.pid
                         THEN now() ELSE control_planes.started_at END,
       pid = EXCLUDED.pid
"""

# ---------------------------------------------------------------- drain and cordon (unfenced)

# What a cordon, uncordon or drain answers (the rows stored as its idempotent answer): the
# worker's schedule columns after the request, and the jobs active on it then.
_WORKER_SCHEDULE = """
RETURNING id, cordoned_at IS NOT NULL AS cordoned, drain_requested_at IS NOT NULL AS drain_requested,
          extract(epoch FROM drain_deadline_at)::float8 AS drain_deadline_unix_s,
          unhealthy_at IS NOT NULL AS unhealthy, unhealthy_reason,
          (SELECT coalesce(array_agg(a.job_id ORDER BY a.job_id), '{}') FROM assignments a
            WHERE a.worker_id = workers.id AND a.state = 'active') AS job_ids
"""

# The worker $1 as the call found it, for a cordon's and an uncordon's ``changed`` (see once):
# locked (a concurrent call's change is seen, not missed) before the update, which names it so
# that it runs first (run after, FOR UPDATE would pass over the row this statement changed).
_WORKER_BEFORE = """before AS (
    SELECT cordoned_at, drain_requested_at, unhealthy_at FROM workers
     WHERE id = $1::text AND EXISTS (SELECT FROM fresh)
       FOR UPDATE
),"""

# $1 worker id; then the audit's, the idempotency key and the request's sha256 (see once). No new
# placement on the worker from now on (schema.sql, workers.cordoned_at); a cordon already there is
# kept with its time. Answer rows: _WORKER_SCHEDULE (none: no such worker).
CORDON_WORKER = once(
    "cordon_worker",
    """
UPDATE workers SET cordoned_at = coalesce(cordoned_at, now())
 WHERE id = $1::text AND EXISTS (SELECT FROM before)
"""
    + _WORKER_SCHEDULE,
    params=1,
    action="cordon",
    steps=_WORKER_BEFORE,
    changed="EXISTS (SELECT FROM before WHERE cordoned_at IS NULL)",
)

# $1 worker id; then the audit's, the key and the sha256. Ends the cordon and any drain (jobs a
# drain already stopped stay requeued), and clears a mark of the worker as unhealthy (schema.sql,
# worker health): its runs until now are not judged again, and the leader's judgement of the
# version before is not written (health_version). Answer rows: _WORKER_SCHEDULE (none: no such
# worker).
UNCORDON_WORKER = once(
    "uncordon_worker",
    """
UPDATE workers SET cordoned_at = NULL, drain_requested_at = NULL, drain_deadline_at = NULL,
                   health_since = CASE WHEN unhealthy_at IS NULL THEN health_since ELSE now() END,
                   health_version = health_version + (unhealthy_at IS NOT NULL)::int,
                   unhealthy_at = NULL, unhealthy_marked_at = NULL, unhealthy_reason = '',
                   unhealthy_probe_at = NULL
 WHERE id = $1::text AND EXISTS (SELECT FROM before)
"""
    + _WORKER_SCHEDULE,
    params=1,
    action="uncordon",
    steps=_WORKER_BEFORE,
    changed="""EXISTS (SELECT FROM before WHERE cordoned_at IS NOT NULL
                                        OR drain_requested_at IS NOT NULL OR unhealthy_at IS NOT NULL)""",
)

# $1 worker id, $2 deadline (seconds from now, database time; NULL: none); then the audit's, the
# key and the sha256. Cordons the worker and asks for its drain; a new drain replaces the deadline
# of one in progress. Answer rows: _WORKER_SCHEDULE (none: no such worker).
DRAIN_WORKER = once(
    "drain_worker",
    """
UPDATE workers
   SET cordoned_at = coalesce(cordoned_at, now()),
       drain_requested_at = coalesce(drain_requested_at, now()),
       drain_deadline_at = now() + make_interval(secs => $2::float8)
 WHERE id = $1::text AND EXISTS (SELECT FROM fresh)
"""
    + _WORKER_SCHEDULE,
    params=2,
    action="drain",
)

# ---------------------------------------------------------------- schedules (docs/schedules.md)

# $1 name, $2 cron, $3 tz, $4 the job template (JSON: actors/queries/jobs.py, job_template), $5
# concurrency policy, $6 starting_deadline_s, $7 its owner (the caller's account), $8 the job's
# priority when held to the owner's max_priority (NULL: an operator; as SUBMIT_JOB's $22); then
# the audit's, the idempotency key and the request's sha256 (see once). The schedule's cursor
# starts at now(): its first slot is the first after it was added. Answer: one row, id; none
# when a schedule of that name exists (nothing stored). Refused over the owner's max_priority
# (SK002, check_submission).
ADD_SCHEDULE = once(
    "add_schedule",
    """
INSERT INTO schedules (name, cron, tz, job, concurrency_policy, starting_deadline_s, owner)
SELECT $1::text, $2::text, $3::text, $4::jsonb, $5::text, $6::int, $7::text FROM fresh, capped
 WHERE capped.ok
    ON CONFLICT (name) DO NOTHING
RETURNING id
""",
    params=8,
    action="schedule_add",
    steps="""capped AS (SELECT check_submission($7::text, 0, $8::bigint) AS ok FROM fresh),""",
)

# The schedule a pause or resume changes (see PAUSE_SCHEDULE's parameters), locked, and whether
# it was paused before.
_SCHEDULE_TARGET = """target AS (
    SELECT id, paused AS was_paused FROM schedules
     WHERE name = $1::text AND ($2::text IS NULL OR owner = $2::text) AND EXISTS (SELECT FROM fresh)
       FOR NO KEY UPDATE
),"""

# $1 name, $2 the only owner whose schedule it may change (NULL: any; another's is as none);
# then the audit's, the idempotency key and the request's sha256 (see once). Answer: one row,
# id (none: no such schedule). Audited only when it was not paused already.
PAUSE_SCHEDULE = once(
    "pause_schedule",
    """
UPDATE schedules s SET paused = true FROM target t WHERE s.id = t.id RETURNING s.id
""",
    params=2,
    action="schedule_pause",
    changed="EXISTS (SELECT FROM target WHERE NOT was_paused)",
    steps=_SCHEDULE_TARGET,
)

# As PAUSE_SCHEDULE, resuming: a paused schedule's cursor moves to now(), so the slots of its
# pause are none of its slots (none fires late, none is recorded). Audited only when it was paused.
RESUME_SCHEDULE = once(
    "resume_schedule",
    """
UPDATE schedules s
   SET paused = false,
       slots_through = CASE WHEN t.was_paused THEN greatest(s.slots_through, now()) ELSE s.slots_through END
  FROM target t WHERE s.id = t.id RETURNING s.id
""",
    params=2,
    action="schedule_resume",
    changed="EXISTS (SELECT FROM target WHERE was_paused)",
    steps=_SCHEDULE_TARGET,
)

# As PAUSE_SCHEDULE, removing the schedule and its slots' records (the jobs it fired stay).
# Answer: one row, the schedule as it was (id, name, cron, tz, job, concurrency_policy,
# starting_deadline_s, paused, owner, and its slots fired and skipped, read in the statement's
# snapshot, before the records go with it).
REMOVE_SCHEDULE = once(
    "remove_schedule",
    """
DELETE FROM schedules s
 WHERE name = $1::text AND ($2::text IS NULL OR owner = $2::text) AND EXISTS (SELECT FROM fresh)
RETURNING id, name, cron, tz, job, concurrency_policy, starting_deadline_s, paused, owner,
          (SELECT count(*) FROM schedule_slots WHERE schedule_id = s.id AND outcome = 'fired') AS fired,
          (SELECT count(*) FROM schedule_slots WHERE schedule_id = s.id AND outcome = 'skipped') AS skipped
""",
    params=2,
    action="schedule_remove",
)
