-- Stockade: the whole database schema. Idempotent: every control plane applies
-- it at start-up, under an advisory lock so concurrent starts do not race.
--
-- Units: cpu_millis (1000 = one core), memory_mb (MiB), times are timestamptz
-- judged by the database clock (now()), durations are interval.

-- The lease: one row. holder leads until expires_at (database time). epoch is
-- the fencing token, bumped at every takeover.
CREATE TABLE IF NOT EXISTS lease (
    id          integer PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    holder      text,
    epoch       bigint      NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    expires_at  timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO lease (id) VALUES (1) ON CONFLICT (id) DO NOTHING;
-- The epoch is a key: PostgreSQL takes FOR UPDATE on a row whose UPDATE changes a column of
-- a unique, non-partial index, and FOR NO KEY UPDATE on any other UPDATE ("Explicit Locking",
-- row-level lock modes). Fenced writes read the epoch FOR KEY SHARE, which conflicts with the
-- first and not with the second: a takeover (it bumps the epoch) waits for every fenced write
-- in progress, and they wait for it, while the leader's renewal and release (they change only
-- expires_at) never wait for its own fenced writes.
CREATE UNIQUE INDEX IF NOT EXISTS lease_epoch_key ON lease (epoch);

-- Every takeover appends its reign here, in the takeover's transaction.
CREATE TABLE IF NOT EXISTS lease_history (
    epoch        bigint PRIMARY KEY,
    holder       text        NOT NULL,
    acquired_at  timestamptz NOT NULL DEFAULT now(),
    -- the holder of the lease just before this takeover (NULL for the first)
    previous     text
);

-- Control-plane replicas announce themselves here (unfenced presence).
CREATE TABLE IF NOT EXISTS control_planes (
    id          text PRIMARY KEY,
    address     text        NOT NULL,
    pid         integer,
    started_at  timestamptz NOT NULL DEFAULT now(),
    seen_at     timestamptz NOT NULL DEFAULT now()
);

CREATE SEQUENCE IF NOT EXISTS worker_incarnation_seq;

CREATE TABLE IF NOT EXISTS workers (
    id                 text PRIMARY KEY,
    address            text        NOT NULL,
    cpu_millis         integer     NOT NULL CHECK (cpu_millis > 0),
    memory_mb          integer     NOT NULL CHECK (memory_mb > 0),
    labels             jsonb       NOT NULL DEFAULT '{}',
    -- fresh at every registration; assignments are addressed to one incarnation
    incarnation        bigint      NOT NULL,
    state              text        NOT NULL DEFAULT 'alive' CHECK (state IN ('alive', 'dead')),
    registered_at      timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    -- set by the fenced dead-worker declaration
    dead_at            timestamptz,
    dead_epoch         bigint
) WITH (fillfactor = 70);
-- Every heartbeat updates its worker's row (last_heartbeat_at and the two columns beside it),
-- thousands of times a second in a large cluster. None of those columns is indexed, so such an
-- update is a HOT update (no index entry written) when the row's page has room for the new
-- version: fillfactor 70 keeps 30 % of each page free for them, and the page's old versions are
-- pruned in place. Set on an existing table too (it applies to the pages written from now on).
-- No index may name last_heartbeat_at, heartbeat_sent_us or dead_after_ms: it would make every
-- heartbeat a non-HOT update (ops/bench/measure_heartbeat.py, workers_update_counts, shows the share).
ALTER TABLE workers SET (fillfactor = 70);

CREATE TABLE IF NOT EXISTS jobs (
    id                bigserial PRIMARY KEY,
    name              text        NOT NULL,
    cpu_millis        integer     NOT NULL CHECK (cpu_millis > 0),
    memory_mb         integer     NOT NULL CHECK (memory_mb > 0),
    priority          integer     NOT NULL DEFAULT 0,
    runtime           text        NOT NULL CHECK (runtime IN ('sleep', 'command', 'container')),
    sleep_ms          bigint,
    argv              text[],
    image             text,
    state             text        NOT NULL DEFAULT 'pending'
                      CHECK (state IN ('pending', 'assigned', 'running',
                                       'succeeded', 'failed', 'cancelled')),
    -- why a pending job waits, written by the placer ('' when it may be placed)
    reason            text        NOT NULL DEFAULT '',
    cancel_requested  boolean     NOT NULL DEFAULT false,
    attempts          integer     NOT NULL DEFAULT 0,
    submitted_at      timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz,
    exit_code         integer,
    stdout_path       text,
    stderr_path       text,
    detail            text        NOT NULL DEFAULT ''
);
-- Container jobs (runtime 'container'): the image in ``image``, the command in ``argv`` as a
-- command job's (empty: the image's own). Older databases lack both the column and the
-- runtime in the CHECK: added once.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS image text;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                    WHERE conrelid = 'jobs'::regclass AND conname = 'jobs_runtime_check'
                      AND pg_get_constraintdef(oid) LIKE '%container%') THEN
        ALTER TABLE jobs DROP CONSTRAINT IF EXISTS jobs_runtime_check;
        ALTER TABLE jobs ADD CONSTRAINT jobs_runtime_check
            CHECK (runtime IN ('sleep', 'command', 'container'));
    END IF;
END $$;
CREATE INDEX IF NOT EXISTS jobs_pending_order
    ON jobs (priority DESC, id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS jobs_cancel_requested
    ON jobs (id) WHERE cancel_requested AND state IN ('assigned', 'running');

-- The committed record of a placement. epoch is the leader's epoch at commit
-- (checked under FOR KEY SHARE in the same transaction); ended_epoch likewise for
-- fenced endings (NULL when the worker reported the end itself).
CREATE TABLE IF NOT EXISTS assignments (
    id                  bigserial PRIMARY KEY,
    job_id              bigint      NOT NULL REFERENCES jobs (id),
    worker_id           text        NOT NULL REFERENCES workers (id),
    worker_incarnation  bigint      NOT NULL,
    cpu_millis          integer     NOT NULL,
    memory_mb           integer     NOT NULL,
    epoch               bigint      NOT NULL,
    state               text        NOT NULL DEFAULT 'active'
                        CHECK (state IN ('active', 'finished', 'cancelled', 'lost')),
    created_at          timestamptz NOT NULL DEFAULT now(),
    -- first heartbeat that listed it as running
    confirmed_at        timestamptz,
    ended_at            timestamptz,
    ended_epoch         bigint,
    end_reason          text
);
-- Invariant 1: at most one active assignment per job.
CREATE UNIQUE INDEX IF NOT EXISTS assignments_one_active_per_job
    ON assignments (job_id) WHERE state = 'active';
CREATE INDEX IF NOT EXISTS assignments_active_by_worker
    ON assignments (worker_id) WHERE state = 'active';
CREATE INDEX IF NOT EXISTS assignments_by_job ON assignments (job_id);

-- Fenced writes that the database refused because their epoch was no longer
-- current (written by the refused leader in a separate transaction, after the
-- rollback; the checker and `just chaos` count them).
CREATE TABLE IF NOT EXISTS stale_writes (
    id           bigserial PRIMARY KEY,
    holder       text        NOT NULL,
    epoch        bigint      NOT NULL,
    epoch_seen   bigint      NOT NULL,
    what         text        NOT NULL,
    refused_at   timestamptz NOT NULL DEFAULT now()
);

-- Dead-worker declarations, one row each, with the declaring epoch.
CREATE TABLE IF NOT EXISTS worker_deaths (
    id              bigserial PRIMARY KEY,
    worker_id       text        NOT NULL,
    incarnation     bigint      NOT NULL,
    epoch           bigint      NOT NULL,
    declared_at     timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at timestamptz NOT NULL
);

-- Allocation per worker, kept exact by the triggers below in the same transaction as every
-- assignment that becomes or stops being active, so the placer reads 100 rows per round
-- instead of summing every active assignment; and the send window's counters (the placer's
-- pacing, actors/placement.py), for the worker's current incarnation only:
--   unconfirmed_assignments = its active assignments no heartbeat has listed yet
--                             (state 'active' and confirmed_at IS NULL);
--   confirmed_assignments   = its assignments a heartbeat has listed, as running
--                             (confirmed_at set) or as finished (state 'finished').
-- A row of its own per worker, not columns of ``workers``: a placement's statement locks the
-- allocation row of every worker it places on until it commits, and a heartbeat's liveness
-- (workers.last_heartbeat_at) must never wait for that. With both in one row, heartbeats
-- waited for the placements on their worker (lock timeouts, then self-fences) when the
-- machine was saturated. A worker's row is created with it, and a new incarnation (a
-- registration) sets both counters to 0 (nothing is addressed to it yet), by the triggers on
-- ``workers`` below. The assignments triggers add a row's change only to the
-- allocation row whose incarnation is the row's; under READ COMMITTED an UPDATE that meets a
-- concurrent registration re-reads the row and its incarnation, so an assignment of the
-- previous incarnation never counts for the new one. Older databases kept these as columns of
-- ``workers``: moved here once (recomputed from the assignments), and the columns dropped.
CREATE TABLE IF NOT EXISTS worker_allocations (
    worker_id               text    PRIMARY KEY REFERENCES workers (id),
    incarnation             bigint  NOT NULL,
    cpu_allocated_millis    bigint  NOT NULL DEFAULT 0,
    memory_allocated_mb     bigint  NOT NULL DEFAULT 0,
    unconfirmed_assignments integer NOT NULL DEFAULT 0,
    confirmed_assignments   integer NOT NULL DEFAULT 0
);
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM worker_allocations) AND EXISTS (SELECT 1 FROM workers) THEN
        INSERT INTO worker_allocations (worker_id, incarnation, cpu_allocated_millis,
                                        memory_allocated_mb, unconfirmed_assignments,
                                        confirmed_assignments)
        SELECT w.id, w.incarnation,
               coalesce(sum(a.cpu_millis) FILTER (WHERE a.state = 'active'), 0),
               coalesce(sum(a.memory_mb) FILTER (WHERE a.state = 'active'), 0),
               count(a.id) FILTER (WHERE a.worker_incarnation = w.incarnation
                                    AND a.state = 'active' AND a.confirmed_at IS NULL),
               count(a.id) FILTER (WHERE a.worker_incarnation = w.incarnation
                                    AND (a.confirmed_at IS NOT NULL OR a.state = 'finished'))
          FROM workers w LEFT JOIN assignments a ON a.worker_id = w.id
         GROUP BY w.id, w.incarnation;
    END IF;
    ALTER TABLE workers DROP COLUMN IF EXISTS cpu_allocated_millis,
                        DROP COLUMN IF EXISTS memory_allocated_mb,
                        DROP COLUMN IF EXISTS unconfirmed_assignments,
                        DROP COLUMN IF EXISTS confirmed_assignments;
END $$;

CREATE OR REPLACE FUNCTION workers_allocation_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO worker_allocations (worker_id, incarnation) VALUES (NEW.id, NEW.incarnation)
    ON CONFLICT (worker_id) DO UPDATE
       SET incarnation = EXCLUDED.incarnation, unconfirmed_assignments = 0, confirmed_assignments = 0
     WHERE worker_allocations.incarnation IS DISTINCT FROM EXCLUDED.incarnation;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER workers_allocation_insert AFTER INSERT ON workers
    FOR EACH ROW EXECUTE FUNCTION workers_allocation_row();
CREATE OR REPLACE TRIGGER workers_allocation_incarnation AFTER UPDATE OF incarnation ON workers
    FOR EACH ROW WHEN (OLD.incarnation IS DISTINCT FROM NEW.incarnation)
    EXECUTE FUNCTION workers_allocation_row();

-- Both triggers turn the statement's rows into changes per (worker, incarnation), then update
-- each allocation row once: allocation by worker, counters for the row's incarnation only (one
-- UPDATE ... FROM row per worker: a worker matched by two source rows would be updated once).
CREATE OR REPLACE FUNCTION assignments_allocate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE worker_allocations w
       SET cpu_allocated_millis = w.cpu_allocated_millis + n.cpu,
           memory_allocated_mb = w.memory_allocated_mb + n.mem,
           unconfirmed_assignments = w.unconfirmed_assignments
               + coalesce(n.unconfirmed[array_position(n.incarnations, w.incarnation)], 0),
           confirmed_assignments = w.confirmed_assignments
               + coalesce(n.confirmed[array_position(n.incarnations, w.incarnation)], 0)
      FROM (SELECT worker_id, sum(cpu) AS cpu, sum(mem) AS mem,
                   array_agg(worker_incarnation) AS incarnations,
                   array_agg(unconfirmed) AS unconfirmed, array_agg(confirmed) AS confirmed
              FROM (SELECT worker_id, worker_incarnation,
                           coalesce(sum(cpu_millis) FILTER (WHERE state = 'active'), 0) AS cpu,
                           coalesce(sum(memory_mb) FILTER (WHERE state = 'active'), 0) AS mem,
                           count(*) FILTER (WHERE state = 'active' AND confirmed_at IS NULL)::int
                               AS unconfirmed,
                           count(*) FILTER (WHERE confirmed_at IS NOT NULL OR state = 'finished')::int
                               AS confirmed
                      FROM created GROUP BY worker_id, worker_incarnation) c
             GROUP BY worker_id) n
     WHERE w.worker_id = n.worker_id;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION assignments_release() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE worker_allocations w
       SET cpu_allocated_millis = w.cpu_allocated_millis - n.cpu,
           memory_allocated_mb = w.memory_allocated_mb - n.mem,
           unconfirmed_assignments = w.unconfirmed_assignments
               + coalesce(n.unconfirmed[array_position(n.incarnations, w.incarnation)], 0),
           confirmed_assignments = w.confirmed_assignments
               + coalesce(n.confirmed[array_position(n.incarnations, w.incarnation)], 0)
      FROM (SELECT worker_id, sum(cpu) AS cpu, sum(mem) AS mem,
                   array_agg(worker_incarnation) AS incarnations,
                   array_agg(unconfirmed) AS unconfirmed, array_agg(confirmed) AS confirmed
              FROM (SELECT o.worker_id, o.worker_incarnation,
                           coalesce(sum(o.cpu_millis) FILTER (WHERE o.state = 'active'
                                                               AND a.state <> 'active'), 0) AS cpu,
                           coalesce(sum(o.memory_mb) FILTER (WHERE o.state = 'active'
                                                              AND a.state <> 'active'), 0) AS mem,
                           (count(*) FILTER (WHERE a.state = 'active' AND a.confirmed_at IS NULL)
                            - count(*) FILTER (WHERE o.state = 'active' AND o.confirmed_at IS NULL))::int
                               AS unconfirmed,
                           (count(*) FILTER (WHERE a.confirmed_at IS NOT NULL OR a.state = 'finished')
                            - count(*) FILTER (WHERE o.confirmed_at IS NOT NULL OR o.state = 'finished'))::int
                               AS confirmed
                      FROM before_rows o JOIN after_rows a ON a.id = o.id
                     -- only rows whose change moves a total
                     WHERE (o.state = 'active') <> (a.state = 'active')
                        OR (o.confirmed_at IS NULL) <> (a.confirmed_at IS NULL)
                        OR (o.state = 'finished') <> (a.state = 'finished')
                     GROUP BY o.worker_id, o.worker_incarnation) c
             GROUP BY worker_id) n
     WHERE w.worker_id = n.worker_id;
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER assignments_allocate AFTER INSERT ON assignments
    REFERENCING NEW TABLE AS created FOR EACH STATEMENT EXECUTE FUNCTION assignments_allocate();
CREATE OR REPLACE TRIGGER assignments_release AFTER UPDATE ON assignments
    REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION assignments_release();

-- The order in which jobs became pending (submitted or requeued), so the placer reads only
-- what is new since its last round.
CREATE SEQUENCE IF NOT EXISTS pending_seq;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                    WHERE table_name = 'jobs' AND column_name = 'pending_seq') THEN
        ALTER TABLE jobs ADD COLUMN pending_seq bigint;
    END IF;
END $$;
-- The transaction that last made a job pending (pg_current_xact_id() as a bigint): the
-- column's default at insert, set by every requeue (actors/queries.py). Transactions commit
-- their pending_seq numbers out of order, so the placer's incremental read is keyed by
-- (pending_xid, pending_seq) and asks again for the transactions a read's snapshot saw in
-- progress (actors/placer.py, PendingMark). Both columns have defaults, so an insert that
-- names neither is still read. Added without a default first, so an existing table is not
-- rewritten; its rows keep NULL, which only the full read returns.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                    WHERE table_name = 'jobs' AND column_name = 'pending_xid') THEN
        ALTER TABLE jobs ADD COLUMN pending_xid bigint;
        ALTER TABLE jobs ALTER COLUMN pending_xid SET DEFAULT pg_current_xact_id()::text::bigint;
        ALTER TABLE jobs ALTER COLUMN pending_seq SET DEFAULT nextval('pending_seq');
    END IF;
END $$;
DROP INDEX IF EXISTS jobs_pending_by_seq;
CREATE INDEX IF NOT EXISTS jobs_pending_by_xid ON jobs (pending_xid, pending_seq) WHERE state = 'pending';

-- One heartbeat in one statement (actors/ingest.py, queries.HEARTBEAT): one round trip
-- instead of up to seven (BEGIN, SET LOCAL, four statements, COMMIT), and the worker's row
-- is locked only while the statement runs, never across round trips. The statements, their
-- order and their conditions are those of the transaction it replaces; each one sees what the
-- ones before it wrote and takes a fresh snapshot (a VOLATILE function under READ COMMITTED),
-- as separate statements did. All commit together, with the calling statement.
-- p_worker_id, p_incarnation: who reports. p_running: the assignment ids it runs.
-- p_assignment_ids .. p_details: its finished outcomes, as parallel arrays: assignment ids,
-- states, exit codes (NULL for none), run lengths (ms), how long before the heartbeat was sent
-- each ended (ms), stdout paths, stderr paths, details (see record_outcomes).
-- Returns the current epoch, whether this incarnation is alive (false: re-register), which of
-- p_running are not active on this worker (stop them), and the database's clock (now(), unix
-- s), by which the agent times its log (agent/dbclock.py).
-- Its earlier form took the runs' start and end as the worker's wall-clock times: dropped.
-- p_sent_us, p_in_use_ms: when the worker sent it (its monotonic clock, µs: orders one
-- incarnation's heartbeats) and the dead_after its self-fence is derived from (ms; 0: none);
-- p_interval_ms, p_dead_after_ms: what to tell while the leader chose no heartbeat policy (see
-- heartbeat_told). Also returns the heartbeat interval and the dead_after to tell the worker,
-- and records the dead_after the worker is judged by (workers.dead_after_ms, below).
DROP FUNCTION IF EXISTS record_heartbeat(text, bigint, bigint[], bigint[], text[], int[], float8[],
                                         float8[], text[], text[], text[]);
DROP FUNCTION IF EXISTS record_heartbeat(text, bigint, bigint[], bigint[], text[], int[], bigint[],
                                         bigint[], text[], text[], text[]);
CREATE OR REPLACE FUNCTION record_heartbeat(
    p_worker_id text, p_incarnation bigint, p_running bigint[],
    p_assignment_ids bigint[], p_states text[], p_exit_codes int[], p_run_ms bigint[],
    p_ended_ago_ms bigint[], p_stdout_paths text[], p_stderr_paths text[], p_details text[],
    p_sent_us bigint, p_in_use_ms integer, p_interval_ms integer, p_dead_after_ms integer,
    OUT current_epoch bigint, OUT alive boolean, OUT stop_assignment_ids bigint[],
    OUT database_unix_s float8, OUT told_interval_ms integer, OUT told_dead_after_ms integer
) LANGUAGE plpgsql AS $$
DECLARE
    heard_at timestamptz;
BEGIN
    database_unix_s := extract(epoch FROM now());
    SELECT t.interval_ms, t.dead_after_ms INTO told_interval_ms, told_dead_after_ms
      FROM heartbeat_told(p_interval_ms, p_dead_after_ms) t;

    IF cardinality(p_assignment_ids) = 0 THEN
        -- Liveness only: losing it in a database crash makes the worker look a little older,
        -- and a lost running-confirmation is re-sent (workers deduplicate), so skip the WAL
        -- flush. Outcomes end assignments and are committed durably.
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;

    -- No row: unknown, dead or another incarnation -> re-register. The worker was heard now
    -- (clock_timestamp(): the statement's start, now(), may be a lock wait earlier).
    -- The dead_after it is judged by (docs/design.md, "Heartbeat interval"): at least the one
    -- told now and the one its fence is derived from, as this heartbeat says; a copy of an
    -- older heartbeat (not sent later than the newest recorded) never lowers it.
    UPDATE workers w SET last_heartbeat_at = clock_timestamp(),
           dead_after_ms = CASE WHEN p_sent_us > w.heartbeat_sent_us
                                THEN greatest(told_dead_after_ms, nullif(p_in_use_ms, 0))
                                ELSE greatest(w.dead_after_ms, told_dead_after_ms, nullif(p_in_use_ms, 0))
                           END,
           heartbeat_sent_us = greatest(w.heartbeat_sent_us, p_sent_us)
     WHERE w.id = p_worker_id AND w.incarnation = p_incarnation AND w.state = 'alive'
    RETURNING w.last_heartbeat_at INTO heard_at;
    alive := FOUND;

    SELECT l.epoch INTO current_epoch FROM lease l WHERE l.id = 1;

    IF cardinality(p_assignment_ids) > 0 THEN
        -- Recorded whether or not this incarnation is still alive: a result a job produced is
        -- never lost (see record_outcomes).
        PERFORM record_outcomes(p_worker_id, p_assignment_ids, p_states, p_exit_codes,
                                p_run_ms, p_ended_ago_ms, p_stdout_paths, p_stderr_paths,
                                p_details);
    END IF;

    stop_assignment_ids := '{}';
    IF alive AND cardinality(p_running) > 0 THEN
        -- The first heartbeat that lists an assignment confirms it.
        WITH confirmed AS (
            UPDATE assignments SET confirmed_at = now()
             WHERE id = ANY(p_running) AND worker_id = p_worker_id AND state = 'active'
               AND confirmed_at IS NULL
         RETURNING job_id
        )
        UPDATE jobs j SET state = 'running', started_at = coalesce(j.started_at, now())
          FROM confirmed WHERE j.id = confirmed.job_id AND j.state = 'assigned';

        -- Those that are not active on this worker: stop them.
        SELECT coalesce(array_agg(r.id), '{}') INTO stop_assignment_ids
          FROM unnest(p_running) AS r(id)
         WHERE NOT EXISTS (
             SELECT 1 FROM assignments a
              WHERE a.id = r.id AND a.worker_id = p_worker_id AND a.state = 'active'
         );
    END IF;

    -- The answer leaves when the statement ends: one that took a while (a wait for the row's
    -- lock, which can come before the stamp above is computed; many outcomes) moves the stamp
    -- to its end, so the worker's silence counts from the answer, as it counts it itself. The
    -- row is locked already: no wait, and no second row version for a quick heartbeat.
    IF alive AND clock_timestamp() > heard_at + interval '50 milliseconds' THEN
        UPDATE workers SET last_heartbeat_at = clock_timestamp()
         WHERE id = p_worker_id AND incarnation = p_incarnation;
    END IF;
END $$;

-- Requeue backoff (actors/reconciler.py): how often a job was lost with its worker (worker dead
-- or registered again, or an unconfirmed assignment withdrawn), and the database time before
-- which it must not be placed again. Written with the requeue, in its fenced transaction, so a
-- new leader honours it.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                    WHERE table_name = 'jobs' AND column_name = 'losses') THEN
        ALTER TABLE jobs ADD COLUMN losses integer NOT NULL DEFAULT 0,
                         ADD COLUMN not_before timestamptz;
        UPDATE jobs j SET losses = a.lost
          FROM (SELECT job_id, count(*) AS lost FROM assignments
                 WHERE state = 'lost' OR end_reason = 'unconfirmed' GROUP BY job_id) a
         WHERE j.id = a.job_id;
    END IF;
END $$;

-- The job lifecycle (runtime/jobs.py, JobSpec): retries, timeouts, constraints, environment,
-- working directory, dependencies and arrays. max_attempts: most runs; retry_backoff_ms: the
-- base of the retry delay (exponential, full jitter, capped: retry_delay_s below); count_lost:
-- a run lost with its worker spends an attempt; timeout_ms: longest run (NULL: none);
-- constraints: [{key, op, values}] on the workers' labels (runtime/constraints.py); env:
-- {name: value}; workdir: '' for the job's own folder; after_ids: jobs that must succeed first;
-- array_id, array_index, array_max_running: a task of an array (array_id: the array's id).
-- failures: the attempts spent (failed runs, and lost ones when count_lost).
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS max_attempts integer NOT NULL DEFAULT 1,
                 ADD COLUMN IF NOT EXISTS retry_backoff_ms bigint NOT NULL DEFAULT 1000,
                 ADD COLUMN IF NOT EXISTS count_lost boolean NOT NULL DEFAULT false,
                 ADD COLUMN IF NOT EXISTS timeout_ms bigint,
                 ADD COLUMN IF NOT EXISTS constraints jsonb NOT NULL DEFAULT '[]',
                 ADD COLUMN IF NOT EXISTS env jsonb NOT NULL DEFAULT '{}',
                 ADD COLUMN IF NOT EXISTS workdir text NOT NULL DEFAULT '',
                 ADD COLUMN IF NOT EXISTS after_ids bigint[] NOT NULL DEFAULT '{}',
                 ADD COLUMN IF NOT EXISTS array_id bigint,
                 ADD COLUMN IF NOT EXISTS array_index integer,
                 ADD COLUMN IF NOT EXISTS array_max_running integer,
                 ADD COLUMN IF NOT EXISTS failures integer NOT NULL DEFAULT 0;
-- An assignment's end as the worker told it ("exit code 1", "timeout: ..."), and whether the
-- run spent one of its job's attempts.
ALTER TABLE assignments ADD COLUMN IF NOT EXISTS detail text,
                        ADD COLUMN IF NOT EXISTS counted boolean NOT NULL DEFAULT false;

-- The delay before a job's next run after `failures` spent attempts, in seconds: exponential
-- backoff with full jitter ("Exponential Backoff And Jitter", M. Brooker, AWS Architecture
-- Blog, 2015): uniform in [0, min(cap, base * 2^(failures - 1))], the cap being
-- runtime/jobs.py's MAX_RETRY_BACKOFF_S (600 s). Drawn by the database (random()), so it is
-- written with the requeue and a new leader honours it (jobs.not_before).
CREATE OR REPLACE FUNCTION retry_delay_s(p_backoff_ms bigint, p_failures integer)
RETURNS float8 LANGUAGE sql VOLATILE AS $$
    SELECT random() * least(600.0, (p_backoff_ms / 1000.0) * power(2.0, greatest(p_failures, 1) - 1))
$$;

-- Whether a job is placed again after a run that spends one more of its attempts: attempts
-- are left after it (p_failures spent before, p_spent now) and no cancel was asked. The one
-- rule of every retry (record_outcomes; queries.END_TIMED_OUT_ASSIGNMENTS).
CREATE OR REPLACE FUNCTION retries(
    p_cancel_requested boolean, p_failures integer, p_spent integer, p_max_attempts integer
) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT NOT p_cancel_requested AND p_failures + p_spent < p_max_attempts
$$;

-- What a worker reported for an assignment that ended on its own: succeeded or failed, and
-- its exit code. Set with the end of an active assignment, and also on an assignment the
-- leader had already ended as lost when the report came in late (the worker fenced itself,
-- or was declared dead, just after its job ended); such an assignment stays lost.
ALTER TABLE assignments ADD COLUMN IF NOT EXISTS outcome text
    CHECK (outcome IN ('succeeded', 'failed'));
ALTER TABLE assignments ADD COLUMN IF NOT EXISTS exit_code integer;

-- When a run a worker reported ran, by the database's clock: the worker measures how long the
-- run lasted and how long before its report was sent the run ended, with its monotonic clock
-- (protocol: JobOutcome.run_ms, ended_ago_ms), never its wall clock, which may be off by any
-- amount or stepped while the job runs. The run ended p_ended_ago_ms before now() (late by the
-- report's way to the database, never early) and started p_run_ms before that; neither before
-- its assignment was created (p_created_at) nor after the assignment ended (p_ended_at: now()
-- for an assignment the report ends, the earlier end of one the leader had already ended). So
-- a job never starts before it was submitted or ends before it started or after its run was
-- recorded, whatever any worker's clock says.
CREATE OR REPLACE FUNCTION run_finished_at(
    p_created_at timestamptz, p_ended_at timestamptz, p_ended_ago_ms bigint
) RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT greatest(p_created_at, least(p_ended_at, now() - p_ended_ago_ms * interval '1 millisecond'))
$$;
CREATE OR REPLACE FUNCTION run_started_at(
    p_created_at timestamptz, p_finished_at timestamptz, p_run_ms bigint
) RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT greatest(p_created_at, p_finished_at - p_run_ms * interval '1 millisecond')
$$;

-- A worker's reported outcomes, from a heartbeat or a registration (actors/ingest.py), inside
-- the caller's transaction. p_worker_id: who reports; the arrays, in parallel: assignment ids,
-- states, exit codes (NULL for none), run lengths (ms), how long before the report was sent
-- each run ended (ms), stdout paths, stderr paths, details; the run's start and end are dated
-- by run_started_at and run_finished_at above. Only succeeded/failed outcomes end a run, and
-- not_started ones an assignment that never ran (below): anything else the worker reports (a
-- stop the control plane ordered, a fence) was or will be ended by the leader. Returns how
-- many outcomes were recorded late.
--
-- 1. An outcome of an assignment of this worker that is still active finishes it and ends its
--    job (assigned or running) with the outcome.
-- 2. A late outcome, of an assignment the leader already ended as lost (worker_dead,
--    worker_restarted: the worker was declared dead, or registered again, before the report got
--    through), is recorded on that assignment (outcome, exit_code; it stays lost), once.
--    The row lock on the assignment orders this against the leader's sweep that ends it
--    (END_ORPHANED_ASSIGNMENTS): whichever comes second waits, then (READ COMMITTED) re-checks
--    its WHERE against the newest row version, and SET and RETURNING are computed on that
--    version. So an outcome racing the sweep either finishes the active assignment first (the
--    sweep then finds it no longer active and does not requeue the job) or lands on the lost
--    branch.
-- 3. Then, in a statement of its own, a job whose lost assignment has just recorded a late
--    outcome and that is still pending (requeued, not placed again yet) ends with that outcome:
--    it ran to completion, it must not run again. So does a job the sweep ended `cancelled`
--    with that assignment (a cancel was asked while its worker was cut off, and nothing placed
--    it again since): the cancel never reached the run, which had ended on its own, and what
--    happened stands over what was asked. A job placed again is left to its new assignment
--    (the old assignment alone keeps the outcome). A statement of its own because
--    its snapshot is taken after step 2 (a VOLATILE function under READ COMMITTED takes one per
--    statement), so it sees the requeue that came with the assignment's end (one transaction of
--    the leader, which had committed, since step 2 saw the assignment lost); in one statement
--    the job's row could still be read as it was before that requeue.
--    Against a concurrent placement claim (COMMIT_PLACEMENTS claims with UPDATE jobs ... WHERE
--    j.state = 'pending'): both UPDATE the job's row, so its row lock orders them. Whichever
--    comes second waits until the first commits, then re-reads the newest version of the row
--    and re-checks its WHERE against it: after a claim the job is 'assigned', so step 3 leaves
--    it alone; after step 3 it is 'succeeded' or 'failed', so the claim skips it (invariant 3).
--    The job is never both ended here and placed again. A user's CancelJob of the pending job is
--    ordered the same way (it cancels only a pending job).
-- Its earlier form took the runs' start and end as the worker's wall-clock times: dropped.
DROP FUNCTION IF EXISTS record_outcomes(text, bigint[], text[], int[], float8[], float8[], text[],
                                        text[], text[]);
CREATE OR REPLACE FUNCTION record_outcomes(
    p_worker_id text, p_assignment_ids bigint[], p_states text[], p_exit_codes int[],
    p_run_ms bigint[], p_ended_ago_ms bigint[], p_stdout_paths text[], p_stderr_paths text[],
    p_details text[]
) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    late integer;
    late_ids bigint[];
    revived bigint[];
BEGIN
    -- Retries (the job lifecycle): a failed run of an active assignment spends one of its job's
    -- max_attempts (counted on the assignment); while attempts are left, and no cancel was
    -- asked, the job becomes pending again instead of failed, not placed before now() plus
    -- retry_delay_s (exponential backoff, full jitter), its reason saying which attempt failed.
    -- This is the outcome's consequence, not a leader's judgement: it commits with the end of
    -- the assignment (invariant 6 holds: the run has ended), the same on every replica, and
    -- the placement that follows is fenced as any. The conditions read the job's row as the
    -- UPDATE finds it (READ COMMITTED re-reads the newest version), so a cancel that commits
    -- first is seen.
    WITH o AS (
        SELECT * FROM unnest(p_assignment_ids, p_states, p_exit_codes, p_run_ms, p_ended_ago_ms,
                             p_stdout_paths, p_stderr_paths, p_details)
               AS o(assignment_id, state, exit_code, run_ms, ended_ago_ms, stdout_path,
                    stderr_path, detail)
         WHERE o.state IN ('succeeded', 'failed')
    ),
    recorded AS (
        UPDATE assignments a
           SET state = CASE WHEN a.state = 'active' THEN 'finished' ELSE a.state END,
               ended_at = CASE WHEN a.state = 'active' THEN now() ELSE a.ended_at END,
               -- A failure whose detail starts with a reason (``timeout: ...``,
               -- ``oom_killed: ...``, ``workdir_not_found: ...``) ends for that reason.
               end_reason = CASE WHEN a.state <> 'active' THEN a.end_reason
                                 WHEN o.state = 'failed' AND o.detail ~ '^[a-z_]+:'
                                 THEN split_part(o.detail, ':', 1)
                                 ELSE o.state END,
               outcome = o.state, exit_code = o.exit_code, detail = o.detail,
               counted = a.counted OR (o.state = 'failed' AND a.state = 'active')
          FROM o
         WHERE a.id = o.assignment_id AND a.worker_id = p_worker_id
           AND (a.state = 'active'
                OR (a.state = 'lost' AND a.end_reason IN ('worker_dead', 'worker_restarted')
                    AND a.outcome IS NULL))
     RETURNING a.id, a.job_id, a.state = 'finished' AS was_active, a.created_at, a.ended_at
    ),
    -- The run's end and start by the database's clock (the assignment's ended_at is now() for
    -- one this report ends).
    timed AS (
        SELECT r.id, r.job_id, r.was_active, f.finished_at,
               run_started_at(r.created_at, f.finished_at, o.run_ms) AS started_at
          FROM recorded r
          JOIN o ON o.assignment_id = r.id
         CROSS JOIN LATERAL (
             SELECT run_finished_at(r.created_at, r.ended_at, o.ended_ago_ms) AS finished_at
         ) f
    ),
    ended AS (
        UPDATE jobs j
           SET state = CASE WHEN o.state = 'failed'
                                 AND retries(j.cancel_requested, j.failures, 1, j.max_attempts)
                            THEN 'pending'
                            ELSE o.state END,
               failures = j.failures + CASE WHEN o.state = 'failed' THEN 1 ELSE 0 END,
               exit_code = o.exit_code,
               started_at = timed.started_at,
               finished_at = CASE WHEN o.state = 'failed'
                                       AND retries(j.cancel_requested, j.failures, 1, j.max_attempts)
                                  THEN NULL
                                  ELSE timed.finished_at END,
               stdout_path = o.stdout_path, stderr_path = o.stderr_path, detail = o.detail,
               pending_seq = CASE WHEN o.state = 'failed'
                                       AND retries(j.cancel_requested, j.failures, 1, j.max_attempts)
                                  THEN nextval('pending_seq') ELSE j.pending_seq END,
               pending_xid = CASE WHEN o.state = 'failed'
                                       AND retries(j.cancel_requested, j.failures, 1, j.max_attempts)
                                  THEN pg_current_xact_id()::text::bigint ELSE j.pending_xid END,
               not_before = CASE WHEN o.state = 'failed'
                                      AND retries(j.cancel_requested, j.failures, 1, j.max_attempts)
                                 THEN now() + make_interval(
                                          secs => retry_delay_s(j.retry_backoff_ms, j.failures + 1))
                                 ELSE j.not_before END,
               reason = CASE WHEN o.state = 'failed'
                                  AND retries(j.cancel_requested, j.failures, 1, j.max_attempts)
                             THEN 'retrying: attempt ' || (j.failures + 1) || ' of ' || j.max_attempts
                                  || ' failed (' || left(o.detail, 200) || ')'
                             ELSE '' END
          FROM timed JOIN o ON o.assignment_id = timed.id
         WHERE timed.was_active AND j.id = timed.job_id AND j.state IN ('assigned', 'running')
    )
    SELECT count(*) FILTER (WHERE NOT was_active),
           coalesce(array_agg(id) FILTER (WHERE NOT was_active), '{}')
      INTO late, late_ids FROM recorded;

    -- Not started (agent/messages.py, JobState.NOT_STARTED): the worker accepted the
    -- assignment, never started it, and ended it on its own (its reaper found the fence
    -- deadline passed), while its incarnation lives on. Nothing ran, so the assignment ends
    -- 'stopped' (end_reason 'not_started') and the job is placed again at once, with no attempt
    -- spent, no loss counted and no backoff (as after a clean leave); a job whose cancel was
    -- asked ends cancelled. Safe unfenced for the reason a retry is (docs/design.md): the run
    -- has ended, by the word of the only worker it was addressed to, so invariant 6 holds, and
    -- the placement that follows is fenced as any. Only an active assignment of this worker
    -- is ended: a report that comes after the leader ended it (worker declared dead, or
    -- registered again) changes nothing, the leader's requeue stands.
    WITH o AS (
        SELECT o.assignment_id, o.detail
          FROM unnest(p_assignment_ids, p_states, p_details) AS o(assignment_id, state, detail)
         WHERE o.state = 'not_started'
    ),
    stopped AS (
        UPDATE assignments a
           SET state = 'stopped', ended_at = now(), end_reason = 'not_started', detail = o.detail
          FROM o
         WHERE a.id = o.assignment_id AND a.worker_id = p_worker_id AND a.state = 'active'
     RETURNING a.job_id
    )
    UPDATE jobs j
       SET state = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'pending' END,
           finished_at = CASE WHEN j.cancel_requested THEN now() ELSE NULL END,
           started_at = NULL,
           pending_seq = CASE WHEN j.cancel_requested THEN j.pending_seq ELSE nextval('pending_seq') END,
           pending_xid = CASE WHEN j.cancel_requested THEN j.pending_xid
                              ELSE pg_current_xact_id()::text::bigint END,
           reason = ''
      FROM stopped
     WHERE j.id = stopped.job_id AND j.state IN ('assigned', 'running');

    IF late > 0 THEN
        -- A late outcome ends the job (step 3 above), but a late failure of a job with
        -- attempts left only spends one (none when count_lost: the loss spent it already),
        -- and the job stays pending, placed again as its requeue said. A job that count_lost
        -- made failed when this loss spent its last attempt takes the run's true outcome.
        WITH o AS (
            SELECT * FROM unnest(p_assignment_ids, p_states, p_exit_codes, p_run_ms,
                                 p_ended_ago_ms, p_stdout_paths, p_stderr_paths, p_details)
                   AS o(assignment_id, state, exit_code, run_ms, ended_ago_ms, stdout_path,
                        stderr_path, detail)
             WHERE o.state IN ('succeeded', 'failed')
        )
        , flipped AS (
        UPDATE jobs j
           SET state = CASE WHEN o.state = 'failed' AND j.state = 'pending'
                                 AND retries(false, j.failures, (NOT j.count_lost)::int, j.max_attempts)
                            THEN 'pending' ELSE o.state END,
               failures = j.failures + CASE WHEN o.state = 'failed' AND NOT j.count_lost THEN 1 ELSE 0 END,
               exit_code = o.exit_code,
               reason = CASE WHEN o.state = 'failed' AND j.state = 'pending'
                                  AND retries(false, j.failures, (NOT j.count_lost)::int, j.max_attempts)
                             THEN j.reason ELSE '' END,
               -- dated within the lost assignment: it ended before the leader ended it (strictly,
               -- so the job's history tells the requeue in between: queries.JOB_EVENTS)
               started_at = run_started_at(a.created_at, f.finished_at, o.run_ms),
               finished_at = CASE WHEN o.state = 'failed' AND j.state = 'pending'
                                       AND retries(false, j.failures, (NOT j.count_lost)::int, j.max_attempts)
                                  THEN j.finished_at
                                  ELSE f.finished_at END,
               stdout_path = o.stdout_path, stderr_path = o.stderr_path, detail = o.detail
          FROM o JOIN assignments a ON a.id = o.assignment_id
         CROSS JOIN LATERAL (
             SELECT run_finished_at(a.created_at, a.ended_at - interval '1 microsecond', o.ended_ago_ms)
                    AS finished_at
         ) f
         WHERE a.id = ANY(late_ids) AND a.worker_id = p_worker_id AND a.state = 'lost'
           AND a.outcome = o.state
           AND j.id = a.job_id
           AND (j.state = 'pending'
                -- ended cancelled by the sweep of its dead worker (a cancel was asked, but its
                -- worker never answered it), or failed by that sweep because the loss spent the
                -- last attempt (count_lost): the run had succeeded or failed, which stands.
                OR (j.state IN ('cancelled', 'failed')
                    AND NOT EXISTS (SELECT 1 FROM assignments b WHERE b.job_id = j.id AND b.id > a.id)))
     RETURNING j.id, j.state
        )
        SELECT coalesce(array_agg(id) FILTER (WHERE state = 'succeeded'), '{}') INTO revived FROM flipped;

        -- A late failure of a job already placed again (assigned, running) spends an attempt too
        -- (none when count_lost: the loss spent it). Its run now goes on; should it fail with the
        -- attempts spent, the job fails: a late report can thus add at most the one run that had
        -- started before it arrived.
        UPDATE jobs j SET failures = j.failures + 1
          FROM assignments a
         WHERE a.id = ANY(late_ids) AND a.outcome = 'failed' AND j.id = a.job_id
           AND j.state IN ('assigned', 'running') AND NOT j.count_lost;

        -- A job the loss of its worker had ended (failed, count_lost) or cancelled, whose run
        -- now turns out to have succeeded, no longer fails its dependants: those cancelled
        -- with dependency_failed naming it, and theirs in turn, wait again (the leader's next
        -- reconcile pass settles them). Rare (a late success after such an end): a scan of
        -- the cancelled jobs per level is fine.
        IF cardinality(revived) > 0 THEN
            WITH RECURSIVE chain(id) AS (
                SELECT d.id FROM jobs d
                 WHERE d.state = 'cancelled'
                   AND d.detail IN (SELECT 'dependency_failed: job ' || r FROM unnest(revived) r)
                UNION
                SELECT d.id FROM jobs d JOIN chain c ON d.detail = 'dependency_failed: job ' || c.id
                 WHERE d.state = 'cancelled'
            )
            UPDATE jobs j
               SET state = 'waiting', finished_at = NULL, detail = '',
                   reason = 'waiting for job ' || array_to_string(j.after_ids, ', ')
              FROM chain WHERE j.id = chain.id;
        END IF;
    END IF;
    RETURN late;
END $$;

-- Which run of the agent process registered the current incarnation, and the number of that
-- registration within the run (actors/ingest.py, queries.REGISTER_WORKER): a late or hedged
-- copy of a registration already applied must not start another incarnation.
ALTER TABLE workers ADD COLUMN IF NOT EXISTS agent_run_id text NOT NULL DEFAULT '';
ALTER TABLE workers ADD COLUMN IF NOT EXISTS registration_seq bigint NOT NULL DEFAULT 0;

-- Idempotency keys of the mutating calls (actors/ingest.py, queries.once): SubmitJob, SubmitJobs,
-- CancelJob. One row per call carried out: its client's key (unique: the primary key), the call,
-- the sha256 of its checked request (actors/idempotency.py), and its answer (the rows its
-- effect returned, as JSON). The row is written by the statement that carries out the effect,
-- so the key and the effect commit together or not at all; a copy of the call finds the row and
-- gets the answer back without any effect, and a copy that runs at the same moment breaks the
-- primary key and rolls back whole. A row is kept idempotency_key_retention_s (24 h) after
-- created_at, then deleted by every replica's sweep (oldest first, a bounded number per
-- statement; index idempotency_keys_by_age): the table holds at most the calls of that window.
-- RegisterWorker keeps its key in its workers row instead (agent_run_id, registration_seq,
-- registration_sha256 below).
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key             text        PRIMARY KEY,
    rpc             text        NOT NULL,
    request_sha256  bytea       NOT NULL,
    answer          jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS idempotency_keys_by_age ON idempotency_keys (created_at);

-- The sha256 of the registration that created the current incarnation (address, capacity,
-- labels: actors/idempotency.py), so a copy of that registration (same agent_run_id and
-- registration_seq) with another body is refused. NULL for rows registered before it existed:
-- not compared.
ALTER TABLE workers ADD COLUMN IF NOT EXISTS registration_sha256 bytea;

-- Clean stops (actors/ingest.py, queries.LEAVE_WORKER): an agent that has stopped every job it
-- ran says it leaves, naming its incarnation and agent run. Its row becomes 'left': the
-- reconciler never judges it (only 'alive' rows are), the placer never places on it, and the
-- leader ends its assignments of that incarnation as 'stopped' (end_reason 'worker_left') and
-- requeues their jobs at once, with no backoff and no loss counted
-- (queries.END_ORPHANED_ASSIGNMENTS, a fenced write). A registration makes it alive again.
-- The CHECK constraints are replaced only when they lack the new state, so a database that has
-- them already is not scanned again.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                    WHERE conrelid = 'workers'::regclass AND conname = 'workers_state_check'
                      AND pg_get_constraintdef(oid) LIKE '%''left''%') THEN
        ALTER TABLE workers DROP CONSTRAINT IF EXISTS workers_state_check;
        ALTER TABLE workers ADD CONSTRAINT workers_state_check
            CHECK (state IN ('alive', 'dead', 'left'));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                    WHERE conrelid = 'assignments'::regclass AND conname = 'assignments_state_check'
                      AND pg_get_constraintdef(oid) LIKE '%''stopped''%') THEN
        ALTER TABLE assignments DROP CONSTRAINT IF EXISTS assignments_state_check;
        ALTER TABLE assignments ADD CONSTRAINT assignments_state_check
            CHECK (state IN ('active', 'finished', 'cancelled', 'lost', 'stopped'));
    END IF;
END $$;
ALTER TABLE workers ADD COLUMN IF NOT EXISTS left_at timestamptz;

-- Clean stops, one row each (the checker counts them), written with the row's change to 'left'.
CREATE TABLE IF NOT EXISTS worker_leaves (
    id           bigserial PRIMARY KEY,
    worker_id    text        NOT NULL,
    incarnation  bigint      NOT NULL,
    left_at      timestamptz NOT NULL DEFAULT now()
);

-- Dependencies and arrays (the job lifecycle; actors/dependencies.py decides, the leader's
-- reconcile pass writes it: queries.SETTLE_WAITING_JOBS, a fenced write). A job submitted
-- with dependencies (after_ids) that have not all succeeded, or an array's task beyond its
-- limit (array_max_running), is 'waiting' until the leader makes it pending, or cancels it when
-- a dependency failed or was cancelled. The CHECK is replaced only when it lacks the state.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                    WHERE conrelid = 'jobs'::regclass AND conname = 'jobs_state_check'
                      AND pg_get_constraintdef(oid) LIKE '%''waiting''%') THEN
        ALTER TABLE jobs DROP CONSTRAINT IF EXISTS jobs_state_check;
        ALTER TABLE jobs ADD CONSTRAINT jobs_state_check
            CHECK (state IN ('waiting', 'pending', 'assigned', 'running',
                             'succeeded', 'failed', 'cancelled'));
    END IF;
    -- A job depends only on jobs older than itself: a submission may name only jobs that
    -- exist already (queries.SUBMIT_JOB), whose ids were drawn before its own, so the
    -- dependencies never form a cycle. Checked here too.
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                    WHERE conrelid = 'jobs'::regclass AND conname = 'jobs_after_older_check') THEN
        ALTER TABLE jobs ADD CONSTRAINT jobs_after_older_check CHECK (id > ALL (after_ids));
    END IF;
END $$;
CREATE INDEX IF NOT EXISTS jobs_waiting ON jobs (id) WHERE state = 'waiting';
CREATE INDEX IF NOT EXISTS jobs_by_array ON jobs (array_id, array_index) WHERE array_id IS NOT NULL;

-- Drain and cordon (issue 15; actors/ingest.py: cordon_worker, uncordon_worker, drain_worker,
-- unfenced requests any replica records; the leader acts on them). All three columns belong to
-- the worker id, not to an incarnation: a registration (the agent restarted) leaves them as
-- they are, so a cordon or a drain survives the agent's restart; only an uncordon clears them.
--   cordoned_at        set: no new placement on the worker (the placer's reads and its claim,
--                      queries.COMMIT_PLACEMENTS, skip it); a drain sets it too.
--   drain_requested_at set: a drain was asked; the worker is 'draining' while it has active
--                      assignments and 'drained' once it has none (status).
--   drain_deadline_at  set: from then on (database time) the leader stops the worker's active
--                      assignments and requeues their jobs at once, with no loss counted and no
--                      backoff (end_reason 'drained', state 'stopped', as a clean leave's
--                      'worker_left'), once the worker acknowledged the stop: a fenced write
--                      (queries.END_DRAINED_ASSIGNMENTS). NULL: the drain waits for the jobs.
ALTER TABLE workers ADD COLUMN IF NOT EXISTS cordoned_at timestamptz;
ALTER TABLE workers ADD COLUMN IF NOT EXISTS drain_requested_at timestamptz;
ALTER TABLE workers ADD COLUMN IF NOT EXISTS drain_deadline_at timestamptz;

-- Restarts that keep their jobs (docs/design.md, "Restarts"; actors/ingest.py, register_worker
-- with resume_incarnation, and heartbeats with restart_hold_ms). A planned restart's last
-- heartbeat sets hold_until = now() + the hold it asks for (only while the row is alive in that
-- incarnation); the next registration, continued or new, clears it. While it is ahead the
-- leader counts no silence of the worker (queries.HEARTBEAT_AGES and DECLARE_DEAD_WORKERS take
-- the greatest of it and last_heartbeat_at: greatest() skips a NULL) and the placer places
-- nothing on it (queries.ROUND_READ, LIVE_WORKERS, COMMIT_PLACEMENTS). The assignments a
-- continued incarnation does not hold end as 'stopped' with end_reason 'released' (queries.
-- RELEASE_UNHELD_ASSIGNMENTS): their jobs are placed again at once, spending no attempt.
ALTER TABLE workers ADD COLUMN IF NOT EXISTS hold_until timestamptz;

-- The web console (actors/console/). Why each takeover happened, written by the takeover's own
-- statement (queries.TAKE_OVER_LEASE) from the lease row it replaced: 'first' (no holder
-- before), 'released' (the holder stepped down cleanly: expires_at '-infinity'), 'expired' (the
-- holder stopped renewing), 'session_ended' (the holder's database session ended before its
-- lease expired). NULL for takeovers recorded before this column existed.
ALTER TABLE lease_history ADD COLUMN IF NOT EXISTS cause text;
-- Where each replica's console answers (its origin, e.g. https://127.0.0.1:7301; NULL: none),
-- written with its presence row by the ingest (queries.RECORD_PRESENCE), so an open page can
-- move to another replica's console when its own stops answering.
ALTER TABLE control_planes ADD COLUMN IF NOT EXISTS console_url text;
-- When a cancel of the job was first asked (actors/queries/ingest.py, CANCEL_JOB): set with
-- cancel_requested, and for a waiting or pending job cancelled at once; kept by a later cancel.
-- Read by a job's history (queries.JOB_EVENTS). NULL: never asked, or asked before the column
-- existed.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS cancel_requested_at timestamptz;

-- Worker health (actors/health.py decides, the leader's reconciler writes it in a fenced write:
-- queries.RECORD_WORKER_HEALTH). A worker whose recent runs fail where the same jobs do not fail
-- elsewhere is marked unhealthy: the placer places nothing new on it (queries.ROUND_READ,
-- LIVE_WORKERS, COMMIT_PLACEMENTS), but a probe once unhealthy_probe_at has passed. All six
-- columns belong to the worker id, as a cordon does: a registration (the agent restarted) keeps
-- them.
--   unhealthy_at        set: marked at this time (kept while it is marked again); NULL: healthy.
--   unhealthy_marked_at the last mark, or the last renewal of it (a run failed there after the
--                       mark before: a probe, or a run already there): runs that end after it
--                       decide whether the mark is cleared or renewed again.
--   unhealthy_reason    why, as status shows it ('unhealthy: 8 of the last 10 runs failed ...').
--   unhealthy_probe_at  from then on one job at a time may be placed on it as a probe (NULL:
--                       never; the leader's health_probe_after_s is 0).
--   health_since        runs that ended before it are not judged (set when a mark is cleared,
--                       by a run succeeding there or by an operator's uncordon; NULL: all are).
--   health_version      bumped at every change of the above: the leader's write applies only
--                       to the version it judged, so an operator's uncordon meanwhile wins.
ALTER TABLE workers ADD COLUMN IF NOT EXISTS unhealthy_at timestamptz,
                    ADD COLUMN IF NOT EXISTS unhealthy_marked_at timestamptz,
                    ADD COLUMN IF NOT EXISTS unhealthy_reason text NOT NULL DEFAULT '',
                    ADD COLUMN IF NOT EXISTS unhealthy_probe_at timestamptz,
                    ADD COLUMN IF NOT EXISTS health_since timestamptz,
                    ADD COLUMN IF NOT EXISTS health_version bigint NOT NULL DEFAULT 0;
-- A worker's last runs, newest first (queries.WORKER_RUNS reads at most health_window_runs per
-- alive worker).
CREATE INDEX IF NOT EXISTS assignments_finished_by_worker
    ON assignments (worker_id, ended_at) WHERE state = 'finished';
-- A worker's cancelled runs since (the placer's trial: queries.LIVE_WORKERS, ROUND_READ).
CREATE INDEX IF NOT EXISTS assignments_cancelled_by_worker
    ON assignments (worker_id, ended_at) WHERE state = 'cancelled';

-- The heartbeat interval (docs/design.md, "Heartbeat interval"; actors/heartbeat_policy.py). The
-- leader chooses the interval the workers heartbeat at and the dead_after that goes with it, from
-- the cluster's size and the measured cost of a heartbeat, and writes them here in a fenced write
-- (queries.SET_HEARTBEAT_POLICY); every replica tells them to the workers in the replies to
-- registrations and heartbeats, read by the statement that records them (heartbeat_told). One row
-- (id 1), none before the first choice.
CREATE TABLE IF NOT EXISTS heartbeat_policy (
    id             integer     PRIMARY KEY CHECK (id = 1),
    interval_ms    integer     NOT NULL CHECK (interval_ms > 0),
    dead_after_ms  integer     NOT NULL CHECK (dead_after_ms > interval_ms),
    workers        integer     NOT NULL,
    cpu_per_heartbeat_us float8,
    reason         text        NOT NULL DEFAULT '',
    epoch          bigint      NOT NULL,
    decided_at     timestamptz NOT NULL DEFAULT now()
);

-- What to tell a worker: the policy row, or (before the leader chose one) the caller's defaults.
CREATE OR REPLACE FUNCTION heartbeat_told(p_interval_ms integer, p_dead_after_ms integer,
                                          OUT interval_ms integer, OUT dead_after_ms integer)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(p.interval_ms, p_interval_ms), coalesce(p.dead_after_ms, p_dead_after_ms)
      FROM (SELECT 1) one LEFT JOIN heartbeat_policy p ON p.id = 1
$$;

-- The dead_after (ms) the leader judges the worker by (queries.HEARTBEAT_AGES and
-- DECLARE_DEAD_WORKERS take the larger of it and their own dead_after_s): the larger of the one
-- told and the one the worker's fence is derived from, set by the registration and by every
-- heartbeat (record_heartbeat; NULL: none told, an older control plane), and the send time
-- (the worker's monotonic clock, µs) of the newest heartbeat recorded, which orders them.
-- Neither is indexed, so a heartbeat's update stays a HOT update.
ALTER TABLE workers ADD COLUMN IF NOT EXISTS dead_after_ms integer,
                    ADD COLUMN IF NOT EXISTS heartbeat_sent_us bigint NOT NULL DEFAULT 0;
-- What one heartbeat costs this replica (CPU µs, measured by its ingest; NULL: not measured):
-- what the leader's choice of the interval reads.
ALTER TABLE control_planes ADD COLUMN IF NOT EXISTS cpu_per_heartbeat_us float8;
-- The 99th percentile, over the workers this replica heard from lately, of how long each one's
-- heartbeats waited for an answer at most, as the workers report it (ms;
-- HeartbeatRequest.waited_ms; NULL: too few workers reported): the other input of the interval.
ALTER TABLE control_planes ADD COLUMN IF NOT EXISTS heartbeat_wait_p99_ms float8;

-- Heartbeats recorded in groups (docs/design.md, "Grouped heartbeats"; actors/heartbeat_group.py
-- gathers them for a few milliseconds, actors/ingest.py records them): the liveness-only
-- heartbeats of several workers in ONE statement, each member as record_heartbeat records one.
-- Members are given as parallel arrays, member i (1-based) being p_worker_ids[i] at
-- p_incarnations[i], sent at p_sent_us[i] and fencing from p_in_use_ms[i]; the assignments they
-- run are flattened into p_running_ids, with p_running_members naming each one's member.
-- p_interval_ms, p_dead_after_ms: as record_heartbeat's. A worker id appears once per group.
-- Returns one row per member: whether its incarnation is alive (false: re-register, with the
-- registration that replaced it, if any: newer_*), whether it was skipped (its worker's row
-- was locked by another transaction: nothing was recorded for it, the caller records it alone,
-- waiting for the lock as a heartbeat always did), which of its running assignments to stop,
-- and what record_heartbeat returns beside (the same for every member).
--
-- Why each rule of record_heartbeat still holds for every member:
-- - The rows are locked first, in one fixed order (sorted ids, as the ORDER BY below sorts
--   before it locks; the stamping UPDATE in the same statement touches only rows that locking
--   scan returned, ours already), so two groups, or a group and a registration (one row),
--   never wait for each other in a cycle. SKIP LOCKED: a row another transaction holds (a registration, a
--   leave, a cordon, the leader's dead-worker declaration, a heartbeat of the same worker on
--   another replica) never makes the whole group wait nor fail on lock_timeout; only that
--   member waits, alone, as it did before.
-- - Each member's stamp is clock_timestamp() computed for its own row inside the statement,
--   so after its request was received; no stamp waits for a lock (held already). A member
--   still stamped more than 50 ms before the statement's end is stamped again at the end, so
--   every worker's silence counts from the answer, as it counts it itself.
-- - Liveness only: no outcomes (a heartbeat that carries outcomes is recorded alone, by
--   record_heartbeat, committed durably; see actors/ingest.py), so the WAL flush is skipped
--   as record_heartbeat skips it for liveness (a lost stamp makes a worker look a little
--   older; a lost confirmation is sent again).
-- - One statement: no row lock is held across a round trip.
-- - A running assignment's confirmation locks its row in id order and skips one another
--   transaction holds (the leader ending it): the worker lists it again in its next heartbeat,
--   which confirms it then, or names it to stop. Its job becomes running as in record_heartbeat.
--   The locking statement runs only when one of the listed assignments is still unconfirmed
--   (the look that finds the ones to stop tells): in the steady state none is.
--
-- Its cost (docs/design.md, "Grouped heartbeats", measured): in a tight loop about 0.2 ms of
-- database CPU per call plus about 12 µs per member (in a real run about 0.9 ms plus 28 µs),
-- linear up to heartbeat_group_max: in the steady state,
-- beside the checks, three statements (lock and stamp; the running assignments; the answer),
-- all on generic plans.
CREATE OR REPLACE FUNCTION record_heartbeats(
    p_worker_ids text[], p_incarnations bigint[], p_sent_us bigint[], p_in_use_ms integer[],
    p_running_ids bigint[], p_running_members integer[], p_interval_ms integer, p_dead_after_ms integer
) RETURNS TABLE (
    member integer, alive boolean, skipped boolean, stop_assignment_ids bigint[],
    newer_agent_run_id text, newer_address text, newer_incarnation bigint,
    current_epoch bigint, database_unix_s float8, told_interval_ms integer, told_dead_after_ms integer
) LANGUAGE plpgsql
-- Generic plans: a custom plan (PostgreSQL's default for the first executions, and whenever it
-- estimates one cheaper) re-plans every statement below at every call, which cost more than
-- running them. Every join below is linear in the members whatever the row estimates say
-- (members are matched by their number, as subscripts of arrays, never by a join between two
-- unnests, which a generic plan's estimate of 10 rows each turns into a nested loop).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_members integer := cardinality(p_worker_ids);
    v_unix_s float8 := extract(epoch FROM now());
    v_interval_ms integer;
    v_dead_after_ms integer;
    v_locked boolean[] := array_fill(false, ARRAY[v_members]);  -- member n's row was locked
    v_alive boolean[] := array_fill(false, ARRAY[v_members]);   -- ... and its incarnation stamped
    v_first_heard timestamptz;
    v_stop_ids bigint[];     -- running assignments not active on their member's worker
    v_stop_members integer[];
    v_unconfirmed boolean;
    v_confirm bigint[];
    v_jobs bigint[];
    r record;
BEGIN
    IF cardinality(p_incarnations) <> v_members OR cardinality(p_sent_us) <> v_members
       OR cardinality(p_in_use_ms) <> v_members
       OR cardinality(p_running_ids) <> cardinality(p_running_members) THEN
        RAISE EXCEPTION 'record_heartbeats: the member arrays must be as long as p_worker_ids (%)'
                        ' and p_running_members as p_running_ids (%)', v_members,
                        cardinality(p_running_ids) USING ERRCODE = '22023';
    END IF;
    IF (SELECT count(DISTINCT w) FROM unnest(p_worker_ids) w) <> v_members THEN
        RAISE EXCEPTION 'record_heartbeats: a worker id appears more than once in %', p_worker_ids
              USING ERRCODE = '22023';
    END IF;
    SELECT t.interval_ms, t.dead_after_ms INTO v_interval_ms, v_dead_after_ms
      FROM heartbeat_told(p_interval_ms, p_dead_after_ms) t;
    PERFORM set_config('synchronous_commit', 'off', true);

    -- Lock the members' rows (sorted ids, SKIP LOCKED) and stamp the alive incarnations, in
    -- one statement: the UPDATE touches only rows the locking scan returned, so it waits for
    -- no lock. One row per locked member (stamp NULL) and one per stamped member.
    FOR r IN
        WITH locked AS (
            SELECT w.id, m.n, m.incarnation, m.sent_us, m.in_use_ms
              FROM unnest(p_worker_ids, p_incarnations, p_sent_us, p_in_use_ms)
                   WITH ORDINALITY AS m(worker_id, incarnation, sent_us, in_use_ms, n)
              JOIN workers w ON w.id = m.worker_id
             ORDER BY w.id FOR NO KEY UPDATE OF w SKIP LOCKED
        ), heard AS (
            UPDATE workers w SET last_heartbeat_at = clock_timestamp(),
                   dead_after_ms = CASE WHEN l.sent_us > w.heartbeat_sent_us
                                        THEN greatest(v_dead_after_ms, nullif(l.in_use_ms, 0))
                                        ELSE greatest(w.dead_after_ms, v_dead_after_ms, nullif(l.in_use_ms, 0))
                                   END,
                   heartbeat_sent_us = greatest(w.heartbeat_sent_us, l.sent_us)
              FROM locked l
             WHERE w.id = l.id AND w.incarnation = l.incarnation AND w.state = 'alive'
            RETURNING l.n AS n, w.last_heartbeat_at AS heard_at
        )
        SELECT l.n, NULL::timestamptz AS heard_at FROM locked l
        UNION ALL
        SELECT h.n, h.heard_at FROM heard h
    LOOP
        IF r.heard_at IS NULL THEN
            v_locked[r.n] := true;
        ELSE
            v_alive[r.n] := true;
            v_first_heard := least(v_first_heard, r.heard_at);
        END IF;
    END LOOP;

    IF v_first_heard IS NOT NULL AND cardinality(p_running_ids) > 0 THEN
        -- One look at the alive members' running assignments: those not active on their
        -- worker (to stop), and whether any is still unconfirmed.
        SELECT array_agg(r.id) FILTER (WHERE a.id IS NULL), array_agg(r.n) FILTER (WHERE a.id IS NULL),
               coalesce(bool_or(a.confirmed_at IS NULL), false)
          INTO v_stop_ids, v_stop_members, v_unconfirmed
          FROM unnest(p_running_ids, p_running_members) AS r(id, n)
          LEFT JOIN LATERAL (SELECT a.id, a.confirmed_at FROM assignments a
                              WHERE a.id = r.id AND a.worker_id = p_worker_ids[r.n] AND a.state = 'active'
                             LIMIT 1) a
                 ON true
         WHERE v_alive[r.n];
        IF v_unconfirmed THEN
            -- The first heartbeat that lists an assignment confirms it.
            SELECT coalesce(array_agg(c.id), '{}'), coalesce(array_agg(c.job_id), '{}')
              INTO v_confirm, v_jobs
              FROM (SELECT a.id, a.job_id
                      FROM unnest(p_running_ids, p_running_members) AS r(id, n)
                      JOIN assignments a ON a.id = r.id AND a.worker_id = p_worker_ids[r.n]
                     WHERE v_alive[r.n] AND a.state = 'active' AND a.confirmed_at IS NULL
                     ORDER BY a.id FOR NO KEY UPDATE OF a SKIP LOCKED) c;
            IF cardinality(v_confirm) > 0 THEN
                UPDATE assignments SET confirmed_at = now()
                 WHERE id = ANY(v_confirm) AND state = 'active' AND confirmed_at IS NULL;
                PERFORM 1 FROM jobs j WHERE j.id = ANY(v_jobs) AND j.state = 'assigned'
                  ORDER BY j.id FOR NO KEY UPDATE;
                UPDATE jobs j SET state = 'running', started_at = coalesce(j.started_at, now())
                 WHERE j.id = ANY(v_jobs) AND j.state = 'assigned';
            END IF;
        END IF;
    END IF;

    -- The answer leaves when the statement ends (record_heartbeat says why).
    IF v_first_heard IS NOT NULL AND clock_timestamp() > v_first_heard + interval '50 milliseconds' THEN
        UPDATE workers w SET last_heartbeat_at = clock_timestamp()
          FROM unnest(p_worker_ids, p_incarnations, v_alive) AS m(worker_id, incarnation, alive)
         WHERE m.alive AND w.id = m.worker_id AND w.incarnation = m.incarnation
           AND w.last_heartbeat_at < clock_timestamp() - interval '50 milliseconds';
    END IF;

    RETURN QUERY
    SELECT g.n,
           v_alive[g.n],
           NOT v_alive[g.n] AND NOT v_locked[g.n] AND x.id IS NOT NULL,
           coalesce(s.ids, '{}'::bigint[]),
           CASE WHEN newer THEN x.agent_run_id END,
           CASE WHEN newer THEN x.address END,
           CASE WHEN newer THEN x.incarnation END,
           (SELECT l.epoch FROM lease l WHERE l.id = 1), v_unix_s, v_interval_ms, v_dead_after_ms
      FROM generate_series(1, v_members) AS g(n)
      LEFT JOIN (SELECT u.n, array_agg(u.id) AS ids FROM unnest(v_stop_ids, v_stop_members) AS u(id, n)
                  GROUP BY u.n) s ON s.n = g.n
      -- Only a member not stamped needs its row again (skipped, or told to re-register).
      LEFT JOIN LATERAL (SELECT w.id, w.state, w.incarnation, w.agent_run_id, w.address FROM workers w
                          WHERE NOT v_alive[g.n] AND w.id = p_worker_ids[g.n] LIMIT 1) x ON true
      CROSS JOIN LATERAL (SELECT NOT v_alive[g.n] AND x.state = 'alive'
                                 AND x.incarnation > p_incarnations[g.n]) AS t(newer)
     ORDER BY g.n;
END $$;
