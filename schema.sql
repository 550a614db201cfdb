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
);

CREATE TABLE IF NOT EXISTS jobs (
    id                bigserial PRIMARY KEY,
    name              text        NOT NULL,
    cpu_millis        integer     NOT NULL CHECK (cpu_millis > 0),
    memory_mb         integer     NOT NULL CHECK (memory_mb > 0),
    priority          integer     NOT NULL DEFAULT 0,
    runtime           text        NOT NULL CHECK (runtime IN ('sleep', 'command')),
    sleep_ms          bigint,
    argv              text[],
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
CREATE INDEX IF NOT EXISTS jobs_pending_order
    ON jobs (priority DESC, id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS jobs_cancel_requested
    ON jobs (id) WHERE cancel_requested AND state IN ('assigned', 'running');

-- The committed record of a placement. epoch is the leader's epoch at commit
-- (checked under FOR SHARE in the same transaction); ended_epoch likewise for
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
-- instead of summing every active assignment. Added with a backfill for older databases.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                    WHERE table_name = 'workers' AND column_name = 'cpu_allocated_millis') THEN
        ALTER TABLE workers ADD COLUMN cpu_allocated_millis bigint NOT NULL DEFAULT 0,
                            ADD COLUMN memory_allocated_mb bigint NOT NULL DEFAULT 0;
        UPDATE workers w
           SET cpu_allocated_millis = a.cpu, memory_allocated_mb = a.mem
          FROM (SELECT worker_id, sum(cpu_millis) AS cpu, sum(memory_mb) AS mem
                  FROM assignments WHERE state = 'active' GROUP BY worker_id) a
         WHERE w.id = a.worker_id;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION assignments_allocate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE workers w
       SET cpu_allocated_millis = w.cpu_allocated_millis + n.cpu,
           memory_allocated_mb = w.memory_allocated_mb + n.mem
      FROM (SELECT worker_id, sum(cpu_millis) AS cpu, sum(memory_mb) AS mem
              FROM created WHERE state = 'active' GROUP BY worker_id) n
     WHERE w.id = n.worker_id;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION assignments_release() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE workers w
       SET cpu_allocated_millis = w.cpu_allocated_millis - n.cpu,
           memory_allocated_mb = w.memory_allocated_mb - n.mem
      FROM (SELECT o.worker_id, sum(o.cpu_millis) AS cpu, sum(o.memory_mb) AS mem
              FROM before_rows o JOIN after_rows a ON a.id = o.id
             WHERE o.state = 'active' AND a.state <> 'active' GROUP BY o.worker_id) n
     WHERE w.id = n.worker_id;
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
CREATE INDEX IF NOT EXISTS jobs_pending_by_seq ON jobs (pending_seq) WHERE state = 'pending';

-- What a worker reported for an assignment that ended on its own: succeeded or failed, and
-- its exit code. Set with the end of an active assignment, and also on an assignment the
-- leader had already ended as lost when the report came in late (the worker fenced itself,
-- or was declared dead, just after its job ended); such an assignment stays lost.
ALTER TABLE assignments ADD COLUMN IF NOT EXISTS outcome text
    CHECK (outcome IN ('succeeded', 'failed'));
ALTER TABLE assignments ADD COLUMN IF NOT EXISTS exit_code integer;
