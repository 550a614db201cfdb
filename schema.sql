-- Stockade: the database schema as it is today, applied whole to a new database (actors/schema.py;
-- a database of an earlier release is brought here by the numbered files of migrations/ instead,
-- and the version at the end of this file is the newest of them). docs/design.md, "The database
-- schema", says why the tables are shaped as they are.
--
-- Units: cpu_millis (1000 = one core), memory_mb (MiB), times are timestamptz judged by the
-- database clock (now()), durations are interval or milliseconds (*_ms).

-- ---------------------------------------------------------------- the lease

-- One row. holder leads until expires_at (database time); epoch is the fencing token, bumped at
-- every takeover.
CREATE TABLE IF NOT EXISTS lease (
    id          integer PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    holder      text,
    epoch       bigint      NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    expires_at  timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO lease (id) VALUES (1) ON CONFLICT (id) DO NOTHING;
-- The epoch is a key, so a takeover (it bumps the epoch) waits for every fenced write holding
-- FOR KEY SHARE, while the leader's renewal and release do not (docs/design.md, "The database
-- schema").
CREATE UNIQUE INDEX IF NOT EXISTS lease_epoch_key ON lease (epoch);

-- Every takeover appends its reign here, in the takeover's statement (queries.TAKE_OVER_LEASE).
CREATE TABLE IF NOT EXISTS lease_history (
    epoch        bigint PRIMARY KEY,
    holder       text        NOT NULL,
    acquired_at  timestamptz NOT NULL DEFAULT now(),
    previous     text,        -- the holder just before this takeover (NULL for the first)
    cause        text         -- 'first', 'released', 'expired' or 'session_ended'
);

-- Fenced writes the database refused because their epoch was no longer current, written by the
-- refused leader after its rollback (the checker and `just chaos` count them).
CREATE TABLE IF NOT EXISTS stale_writes (
    id           bigserial PRIMARY KEY,
    holder       text        NOT NULL,
    epoch        bigint      NOT NULL,
    epoch_seen   bigint      NOT NULL,
    what         text        NOT NULL,
    refused_at   timestamptz NOT NULL DEFAULT now()
);

-- ---------------------------------------------------------------- control planes

-- Each replica's presence, written by its ingest (queries.RECORD_PRESENCE).
CREATE TABLE IF NOT EXISTS control_planes (
    id                    text PRIMARY KEY,
    address               text        NOT NULL,
    pid                   integer,
    started_at            timestamptz NOT NULL DEFAULT now(),
    seen_at               timestamptz NOT NULL DEFAULT now(),
    console_url           text,       -- its console's origin (https://127.0.0.1:7301); NULL: none
    cpu_per_heartbeat_us  float8,     -- CPU one heartbeat costs it (µs); NULL: not measured
    -- the 99th percentile over the workers heard lately of their heartbeats' longest wait for an
    -- answer (ms, HeartbeatRequest.waited_ms); NULL: too few reported
    heartbeat_wait_p99_ms float8
);

-- ---------------------------------------------------------------- workers

CREATE SEQUENCE IF NOT EXISTS worker_incarnation_seq;

-- fillfactor 70 keeps every heartbeat's update a HOT one: no index may name last_heartbeat_at,
-- heartbeat_sent_us or dead_after_ms (docs/design.md, "The database schema").
CREATE TABLE IF NOT EXISTS workers (
    id                   text PRIMARY KEY,
    address              text        NOT NULL,
    cpu_millis           integer     NOT NULL CHECK (cpu_millis > 0),
    memory_mb            integer     NOT NULL CHECK (memory_mb > 0),
    labels               jsonb       NOT NULL DEFAULT '{}',
    -- fresh at every registration; assignments are addressed to one incarnation
    incarnation          bigint      NOT NULL,
    -- 'left': a clean stop (queries.LEAVE_WORKER); a registration makes it alive again
    state                text        NOT NULL DEFAULT 'alive' CHECK (state IN ('alive', 'dead', 'left')),
    registered_at        timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at    timestamptz NOT NULL DEFAULT now(),
    dead_at              timestamptz,  -- set by the fenced dead-worker declaration
    dead_epoch           bigint,
    -- the registration that made the current incarnation: its agent run, its number within the
    -- run and its sha256 (actors/idempotency.py), so a copy of it starts no other incarnation
    -- and a copy with another body is refused (NULL sha256: not compared)
    agent_run_id         text        NOT NULL DEFAULT '',
    registration_seq     bigint      NOT NULL DEFAULT 0,
    registration_sha256  bytea,
    left_at              timestamptz,
    -- drain and cordon (issue 15), kept across registrations; only an uncordon clears them:
    cordoned_at          timestamptz,  -- no new placement on it
    drain_requested_at   timestamptz,  -- 'draining' while it has active assignments, then 'drained'
    -- from then on the leader stops its assignments and requeues their jobs at once
    -- (queries.END_DRAINED_ASSIGNMENTS); NULL: the drain waits for the jobs
    drain_deadline_at    timestamptz,
    -- a planned restart's hold (docs/design.md, "Restarts"): no silence counted and no placement
    -- on it until then; cleared by the next registration
    hold_until           timestamptz,
    -- worker health (actors/health.py; queries.RECORD_WORKER_HEALTH), kept across registrations:
    unhealthy_at         timestamptz,  -- marked at this time; NULL: healthy
    unhealthy_marked_at  timestamptz,  -- the last mark or renewal: runs after it decide the next
    unhealthy_reason     text        NOT NULL DEFAULT '',
    unhealthy_probe_at   timestamptz,  -- from then on one job at a time as a probe; NULL: never
    health_since         timestamptz,  -- runs that ended before it are not judged; NULL: all are
    health_version       bigint      NOT NULL DEFAULT 0,  -- bumped at every change of the above
    -- the dead_after (ms) it is judged by: the larger of the one told and the one its fence is
    -- derived from (NULL: none told), and the send time (its monotonic clock, µs) of the newest
    -- heartbeat recorded, which orders them (docs/design.md, "Heartbeat interval")
    dead_after_ms        integer,
    heartbeat_sent_us    bigint      NOT NULL DEFAULT 0,
    -- the countable devices it offers (docs/devices.md): {name: [unit id, ...]}, as its latest
    -- registration said (runtime/resources.py checked them: each unit once)
    resources            jsonb       NOT NULL DEFAULT '{}'
) WITH (fillfactor = 70);

-- Allocation per worker and the send window's counters, kept exact by the triggers below, in a
-- row of its own so that a placement's lock never makes a heartbeat wait (docs/design.md, "The
-- database schema"):
--   unconfirmed_assignments = its active assignments no heartbeat has listed yet;
--   confirmed_assignments   = its assignments a heartbeat has listed, as running or finished;
-- both for the worker's current incarnation only.
CREATE TABLE IF NOT EXISTS worker_allocations (
    worker_id               text    PRIMARY KEY REFERENCES workers (id),
    incarnation             bigint  NOT NULL,
    cpu_allocated_millis    bigint  NOT NULL DEFAULT 0,
    memory_allocated_mb     bigint  NOT NULL DEFAULT 0,
    unconfirmed_assignments integer NOT NULL DEFAULT 0,
    confirmed_assignments   integer NOT NULL DEFAULT 0
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

-- Clean stops, one row each (the checker counts them), written with the row's change to 'left'.
CREATE TABLE IF NOT EXISTS worker_leaves (
    id           bigserial PRIMARY KEY,
    worker_id    text        NOT NULL,
    incarnation  bigint      NOT NULL,
    left_at      timestamptz NOT NULL DEFAULT now()
);

-- The heartbeat interval and dead_after the leader chose (docs/design.md, "Heartbeat interval";
-- queries.SET_HEARTBEAT_POLICY, fenced), told to the workers by every replica. One row, none
-- before the first choice.
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

-- ---------------------------------------------------------------- jobs

-- The order in which jobs became pending (submitted or requeued).
CREATE SEQUENCE IF NOT EXISTS pending_seq;

CREATE TABLE IF NOT EXISTS jobs (
    id                   bigserial PRIMARY KEY,
    name                 text        NOT NULL,
    cpu_millis           integer     NOT NULL CHECK (cpu_millis > 0),
    memory_mb            integer     NOT NULL CHECK (memory_mb > 0),
    priority             integer     NOT NULL DEFAULT 0,
    -- the runtime's columns: sleep_ms (sleep), argv (command; container: empty for the image's
    -- own command), image (container); NULL where they do not belong
    runtime              text        NOT NULL CHECK (runtime IN ('sleep', 'command', 'container')),
    sleep_ms             bigint,
    argv                 text[],
    image                text,
    -- 'waiting': for its dependencies or room in its array (actors/dependencies.py)
    state                text        NOT NULL DEFAULT 'pending'
                         CHECK (state IN ('waiting', 'pending', 'assigned', 'running',
                                          'succeeded', 'failed', 'cancelled')),
    reason               text        NOT NULL DEFAULT '',  -- why a pending job waits ('' : it may be placed)
    cancel_requested     boolean     NOT NULL DEFAULT false,
    cancel_requested_at  timestamptz,  -- when a cancel was first asked (queries.CANCEL_JOB)
    attempts             integer     NOT NULL DEFAULT 0,
    submitted_at         timestamptz NOT NULL DEFAULT now(),
    started_at           timestamptz,
    finished_at          timestamptz,
    exit_code            integer,
    stdout_path          text,
    stderr_path          text,
    detail               text        NOT NULL DEFAULT '',
    -- the sequence number and the transaction (pg_current_xact_id() as a bigint) of its latest
    -- becoming pending, set by every requeue: the placer's incremental read is keyed by both
    -- (actors/placer_store.py, PendingMark)
    pending_seq          bigint      DEFAULT nextval('pending_seq'),
    pending_xid          bigint      DEFAULT pg_current_xact_id()::text::bigint,
    -- requeue backoff: how often it was lost with its worker, and the database time before which
    -- it must not be placed again (a loss's backoff or a retry's delay), written with the requeue
    losses               integer     NOT NULL DEFAULT 0,
    not_before           timestamptz,
    -- the job lifecycle (runtime/jobs.py, JobSpec): most runs; the base of the retry delay
    -- (retry_delay_s); whether a run lost with its worker spends an attempt; longest run (NULL:
    -- none); [{key, op, values}] on the workers' labels; {name: value}; '' for the job's own
    -- folder; jobs that must succeed first; an array's task (array_id: the array's id, its
    -- first task's); the attempts spent (failed runs, and lost ones when count_lost)
    max_attempts         integer     NOT NULL DEFAULT 1,
    retry_backoff_ms     bigint      NOT NULL DEFAULT 1000,
    count_lost           boolean     NOT NULL DEFAULT false,
    timeout_ms           bigint,
    constraints          jsonb       NOT NULL DEFAULT '[]',
    env                  jsonb       NOT NULL DEFAULT '{}',
    workdir              text        NOT NULL DEFAULT '',
    after_ids            bigint[]    NOT NULL DEFAULT '{}',
    array_id             bigint,
    array_index          integer,
    array_max_running    integer,
    failures             integer     NOT NULL DEFAULT 0,
    -- the account that submitted it (docs/accounts.md): a user's id, an operator's own id,
    -- 'anonymous' on a server run with --insecure and for jobs stored before accounts existed
    owner                text        NOT NULL DEFAULT 'anonymous',
    -- when a run of it was last preempted (database time): not again within preempt_cooldown_s
    preempted_at         timestamptz,
    -- the failure policy (runtime/jobs.py, JobSpec; retry_refusal): the exit codes a failed run
    -- may be retried on ('{}': any), the reasons that fail it at once; an array's task: how many
    -- of its array's tasks may fail before the rest are cancelled (NULL: no limit;
    -- array_task_failed)
    retry_on_exit        integer[]   NOT NULL DEFAULT '{}',
    no_retry_on          text[]      NOT NULL DEFAULT '{}',
    array_max_failed     integer     CHECK (array_max_failed > 0),
    -- the countable devices each run holds (docs/devices.md): {name: count}, '{}' for none
    resources            jsonb       NOT NULL DEFAULT '{}',
    -- a gang's task (docs/gangs.md): the gang's id (its rank 0 task's) and this task's rank
    gang_id              bigint,
    gang_rank            integer,
    -- a job depends only on jobs older than itself (queries.SUBMIT_JOB names only jobs that
    -- exist; queries.SUBMIT_JOBS gives a batch's jobs ids above those of the jobs of the batch
    -- they name), so its dependencies never form a cycle
    CONSTRAINT jobs_after_older_check CHECK (id > ALL (after_ids))
);
CREATE INDEX IF NOT EXISTS jobs_pending_order ON jobs (priority DESC, id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS jobs_pending_by_xid ON jobs (pending_xid, pending_seq) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS jobs_cancel_requested
    ON jobs (id) WHERE cancel_requested AND state IN ('assigned', 'running');
CREATE INDEX IF NOT EXISTS jobs_waiting ON jobs (id) WHERE state = 'waiting';
CREATE INDEX IF NOT EXISTS jobs_by_array ON jobs (array_id, array_index) WHERE array_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_by_gang ON jobs (gang_id, gang_rank) WHERE gang_id IS NOT NULL;
-- An account's jobs, newest first (queries.LIST_JOBS for a user or a scoped viewer).
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs (owner, id);
-- An account's queued (pending and waiting) jobs, counted against its max_pending
-- (check_submission) and shown by ListAccounts.
CREATE INDEX IF NOT EXISTS jobs_queued_by_owner ON jobs (owner) WHERE state IN ('pending', 'waiting');
-- What an account's assigned and running jobs hold, for its usage caps (view quota_usage).
CREATE INDEX IF NOT EXISTS jobs_in_use_by_owner ON jobs (owner) INCLUDE (cpu_millis, memory_mb)
    WHERE state IN ('assigned', 'running');

-- ---------------------------------------------------------------- assignments

-- The committed record of a placement. epoch is the leader's epoch at commit (checked under FOR
-- KEY SHARE in the same transaction); ended_epoch likewise for fenced endings (NULL when the
-- worker reported the end itself).
CREATE TABLE IF NOT EXISTS assignments (
    id                  bigserial PRIMARY KEY,
    job_id              bigint      NOT NULL REFERENCES jobs (id),
    worker_id           text        NOT NULL REFERENCES workers (id),
    worker_incarnation  bigint      NOT NULL,
    cpu_millis          integer     NOT NULL,
    memory_mb           integer     NOT NULL,
    epoch               bigint      NOT NULL,
    -- 'stopped': ended with no attempt spent (a clean leave, a drain, a release, never started,
    -- a preemption: end_reason 'preempted')
    state               text        NOT NULL DEFAULT 'active'
                        CHECK (state IN ('active', 'finished', 'cancelled', 'lost', 'stopped')),
    created_at          timestamptz NOT NULL DEFAULT now(),
    confirmed_at        timestamptz,  -- the first heartbeat that listed it as running
    ended_at            timestamptz,
    ended_epoch         bigint,
    end_reason          text,
    detail              text,         -- its end as the worker told it ("exit code 1", "timeout: ...")
    counted             boolean     NOT NULL DEFAULT false,  -- the run spent one of its job's attempts
    -- what its worker reported: set with the end of an active assignment, and on one the leader
    -- had ended as lost when the report came late (it stays lost)
    outcome             text        CHECK (outcome IN ('succeeded', 'failed')),
    exit_code           integer,
    -- a preemption the leader decided (docs/preemption.md): the preempting job, and when it
    -- was decided; the reconciler stops the run and ends it as stopped ('preempted')
    preempted_by        bigint,
    preempt_requested_at timestamptz,
    -- a gang task's run (docs/gangs.md): the gang's attempt this placement is (gangs.attempts
    -- when committed: every task of one attempt commits in one statement), and the port the
    -- leader gave the task on its worker (STOCKADE_GANG_PORT), unique among the worker's active
    -- assignments
    gang_attempt        integer,
    gang_port           integer
);
-- Invariant 1: at most one active assignment per job.
CREATE UNIQUE INDEX IF NOT EXISTS assignments_one_active_per_job
    ON assignments (job_id) WHERE state = 'active';
CREATE INDEX IF NOT EXISTS assignments_active_by_worker
    ON assignments (worker_id) WHERE state = 'active';
CREATE INDEX IF NOT EXISTS assignments_by_job ON assignments (job_id);
-- A worker's last runs, newest first (queries.WORKER_RUNS), and its cancelled runs since (the
-- placer's trial: queries.LIVE_WORKERS, ROUND_READ).
CREATE INDEX IF NOT EXISTS assignments_finished_by_worker
    ON assignments (worker_id, ended_at) WHERE state = 'finished';
CREATE INDEX IF NOT EXISTS assignments_cancelled_by_worker
    ON assignments (worker_id, ended_at) WHERE state = 'cancelled';
-- Two active gang tasks on one worker never share a port.
CREATE UNIQUE INDEX IF NOT EXISTS assignments_gang_port_per_worker
    ON assignments (worker_id, gang_port) WHERE state = 'active' AND gang_port IS NOT NULL;
-- The preemptions to carry out (queries.PREEMPT_DUE_ASSIGNMENTS).
CREATE INDEX IF NOT EXISTS assignments_preempt_requested
    ON assignments (id) WHERE state = 'active' AND preempt_requested_at IS NOT NULL;

-- The device units each assignment holds (docs/devices.md), written with it by the placement's
-- fenced statement (queries.COMMIT_PLACEMENTS). active mirrors the assignment's state: the
-- trigger assignments_free_units clears it in the statement that ends the assignment, however
-- it ends (finished, cancelled, lost, stopped), as assignments_release frees its allocation.
CREATE TABLE IF NOT EXISTS assignment_units (
    assignment_id  bigint  NOT NULL REFERENCES assignments (id),
    worker_id      text    NOT NULL,
    resource       text    NOT NULL,
    unit           text    NOT NULL,
    active         boolean NOT NULL DEFAULT true,
    PRIMARY KEY (assignment_id, resource, unit)
);
-- No unit of a worker is held by two active assignments, of any incarnation (a restarted agent
-- may still run its previous life's jobs): the database's backstop under the placer's choice,
-- as assignments_one_active_per_job is for invariant 1. Also what the placer reads as in use.
CREATE UNIQUE INDEX IF NOT EXISTS assignment_units_one_active_holder
    ON assignment_units (worker_id, resource, unit) WHERE active;

-- ---------------------------------------------------------------- gangs

-- A gang (docs/gangs.md): ``size`` task jobs (jobs.gang_id = id, gang_rank 0 .. size - 1, one
-- spec) placed all or nothing in one fenced commit; id is its rank 0 task's job id. spread: its
-- tasks go to distinct workers. attempts: how many times it was placed whole (the newest is its
-- assignments' gang_attempt); broken: the newest attempt a task of which ended other than
-- succeeded (its other tasks are stopped, and all of them placed again once every one ended);
-- spent: the newest attempt that spent one of its attempts (each attempt spends at most one);
-- failures: the attempts spent (a task failed, timed out, or was lost with count_lost), against
-- max_attempts (its tasks' spec's); state: 'live' until the gang succeeded (every task did), failed (detail: why) or was
-- cancelled. Written by the submission and by the routine gang_runs_ended, never by Python.
CREATE TABLE IF NOT EXISTS gangs (
    id            bigint      PRIMARY KEY,
    size          integer     NOT NULL CHECK (size >= 1),
    spread        boolean     NOT NULL DEFAULT false,
    max_attempts  integer     NOT NULL DEFAULT 1,
    attempts      integer     NOT NULL DEFAULT 0,
    broken        integer     NOT NULL DEFAULT 0,
    spent         integer     NOT NULL DEFAULT 0,
    failures      integer     NOT NULL DEFAULT 0,
    state         text        NOT NULL DEFAULT 'live'
                  CHECK (state IN ('live', 'succeeded', 'failed', 'cancelled')),
    detail        text        NOT NULL DEFAULT ''
);

-- ---------------------------------------------------------------- idempotency keys

-- One row per mutating call carried out (SubmitJob, SubmitJobs, CancelJob, the cordons and
-- drains: queries.once): its client's key, the call, the sha256 of its checked request and its
-- answer, written by the statement of the effect; deleted idempotency_key_retention_s after
-- created_at by every replica's sweep (docs/design.md, "The database schema").
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key             text        PRIMARY KEY,
    rpc             text        NOT NULL,
    request_sha256  bytea       NOT NULL,
    answer          jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS idempotency_keys_by_age ON idempotency_keys (created_at);

-- ---------------------------------------------------------------- the audit trail

-- One row per change a caller made through the ControlPlane service (docs/accounts.md), written
-- by the change's own statement (queries.once), so in its transaction: none for a refused call,
-- a replayed copy or a call that changed nothing. Who: the caller's certificate role and id
-- ('plaintext' and 'anonymous' on a server run with --insecure) and the account it acted as;
-- what: the action, the ids it changed (jobs, an array, a worker) and its key arguments; when:
-- the database's now(); from where: the peer address gRPC saw. Kept until deleted by hand.
CREATE TABLE IF NOT EXISTS audit_log (
    id          bigserial   PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    role        text        NOT NULL,
    actor_id    text        NOT NULL,
    account     text        NOT NULL,
    address     text        NOT NULL,
    -- a new kind of change adds its action here, in a migration
    action      text        NOT NULL
                CHECK (action IN ('submit', 'cancel', 'drain', 'cordon', 'uncordon', 'account_set',
                                  'schedule_add', 'schedule_pause', 'schedule_resume', 'schedule_remove')),
    target_ids  jsonb       NOT NULL DEFAULT '[]',
    arguments   jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS audit_log_by_account ON audit_log (account, id);
CREATE INDEX IF NOT EXISTS audit_log_by_time ON audit_log (at);

-- ---------------------------------------------------------------- accounts

-- An account's quotas, priority cap and fair-share weight (docs/quotas.md), set by an operator
-- (SetAccount). An account without a row has no caps, the default priority cap and weight 1; a
-- NULL cap is no cap. cpu_millis and memory_mb cap what its assigned and running jobs hold (the
-- placer leaves a job pending past them); max_pending caps its pending and waiting jobs, and
-- max_priority the priority of the jobs its users submit (NULL: 0; a submission past either is
-- refused: check_submission). The limits are runtime/accounts.py's AccountChange.check.
CREATE TABLE IF NOT EXISTS accounts (
    name         text             PRIMARY KEY,
    cpu_millis   bigint           CHECK (cpu_millis >= 0),
    memory_mb    bigint           CHECK (memory_mb >= 0),
    max_pending  bigint           CHECK (max_pending >= 0),
    max_priority bigint           CHECK (max_priority BETWEEN -1000000 AND 1000000),
    weight       double precision NOT NULL DEFAULT 1
                 CHECK (weight > 0 AND weight < 'infinity'::double precision),
    updated_at   timestamptz      NOT NULL DEFAULT now()
);

-- ---------------------------------------------------------------- schedules

-- A periodic job (docs/schedules.md), added by a caller (AddSchedule) and owned by its account:
-- a cron expression (5 fields, or 6 with seconds first) read in the IANA time zone tz, and the
-- job each slot fires, as the columns of jobs it is inserted in (actors/queries/jobs.py,
-- JobColumns; constraints and env as JSON values). concurrency_policy as Kubernetes CronJob's;
-- a slot fires only within starting_deadline_s of its time, else it is recorded missed.
-- slots_through: every slot at or before it is recorded in schedule_slots, or came before the
-- schedule was added or while it was paused (a resume moves it to now()); written by the
-- leader's fenced firing (actors/queries/ledger.py, FIRE_SCHEDULE_SLOTS).
CREATE TABLE IF NOT EXISTS schedules (
    id                   bigserial   PRIMARY KEY,
    name                 text        NOT NULL UNIQUE,
    cron                 text        NOT NULL,
    tz                   text        NOT NULL,
    job                  jsonb       NOT NULL,
    concurrency_policy   text        NOT NULL DEFAULT 'allow'
                         CHECK (concurrency_policy IN ('allow', 'forbid', 'replace')),
    starting_deadline_s  integer     NOT NULL CHECK (starting_deadline_s > 0),
    paused               boolean     NOT NULL DEFAULT false,
    owner                text        NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    slots_through        timestamptz NOT NULL DEFAULT now()
);

-- Each slot of a schedule, recorded once (the primary key is the backstop; the fence is the
-- rule): fired, with the one job it inserted in the same fenced transaction, or skipped, with
-- why ('missed: ...' past starting_deadline_s, 'forbid: ...', 'superseded: ...'); epoch: the
-- leader's reign it was recorded in.
CREATE TABLE IF NOT EXISTS schedule_slots (
    schedule_id  bigint      NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    slot_at      timestamptz NOT NULL,
    outcome      text        NOT NULL CHECK (outcome IN ('fired', 'skipped')),
    reason       text        NOT NULL DEFAULT '',
    job_id       bigint      UNIQUE,
    epoch        bigint      NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule_id, slot_at),
    CONSTRAINT schedule_slots_job_check CHECK ((outcome = 'fired') = (job_id IS NOT NULL))
);

-- ---------------------------------------------------------------- usage

-- What running command jobs used, as their workers measured it from the jobs' cgroups every
-- usage_interval_s and their heartbeats carried it (docs/console.md, "Usage"): one row per job
-- sample (job_id, assignment_id set) and per sample of all a worker's jobs together (both NULL).
-- cpu_millis: the CPU used on average over the span_ms before the measure; memory_mb: what it
-- held then. Written by ingest beside the heartbeat (unfenced, no foreign keys: the hottest
-- write stays cheap); rows older than usage_retention_s are deleted by every replica's sweep
-- (usage_samples_by_age, a BRIN index: the rows come in time order).
CREATE TABLE IF NOT EXISTS usage_samples (
    at             timestamptz NOT NULL DEFAULT now(),
    worker_id      text        NOT NULL,
    job_id         bigint,
    assignment_id  bigint,
    cpu_millis     integer     NOT NULL CHECK (cpu_millis >= 0),
    memory_mb      integer     NOT NULL CHECK (memory_mb >= 0),
    span_ms        integer     NOT NULL CHECK (span_ms >= 0)
);
CREATE INDEX IF NOT EXISTS usage_samples_by_job ON usage_samples (job_id, at) WHERE job_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS usage_samples_by_worker ON usage_samples (worker_id, at) WHERE job_id IS NULL;
CREATE INDEX IF NOT EXISTS usage_samples_by_age ON usage_samples USING brin (at);

-- ---------------------------------------------------------------- the schema's version

-- The versions applied (actors/schema.py): this file records the newest; each migration adds its own.
CREATE TABLE IF NOT EXISTS schema_version (
    version     integer     PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);
-- This file's version: the newest migration's (actors/migrations/).
INSERT INTO schema_version (version) VALUES (16) ON CONFLICT (version) DO NOTHING;

-- ================================================================ routines
-- Everything below is functions, triggers and views, each CREATE OR REPLACE: applied with the
-- rest to a new database, and again, whole, with the newest migration to an older one
-- (actors/schema.py), so each routine is written here once and a migration never copies one.

-- ---------------------------------------------------------------- allocations (triggers)

-- A worker's allocation row is created with it, and a new incarnation sets both counters to 0.
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

-- An assignment that ends frees its device units (assignment_units.active), in the statement
-- that ends it.
CREATE OR REPLACE FUNCTION assignments_free_units() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE assignment_units u SET active = false
      FROM before_rows o JOIN after_rows a ON a.id = o.id
     WHERE u.assignment_id = a.id AND u.active AND o.state = 'active' AND a.state <> 'active';
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER assignments_allocate AFTER INSERT ON assignments
    REFERENCING NEW TABLE AS created FOR EACH STATEMENT EXECUTE FUNCTION assignments_allocate();
CREATE OR REPLACE TRIGGER assignments_release AFTER UPDATE ON assignments
    REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION assignments_release();
CREATE OR REPLACE TRIGGER assignments_free_units AFTER UPDATE ON assignments
    REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION assignments_free_units();
-- ---------------------------------------------------------------- rules the statements share

-- The workers judged by their silence (queries.HEARTBEAT_AGES, DECLARE_DEAD_WORKERS): every
-- 'alive' row, and a 'left' row that still has active assignments (of another incarnation: only a
-- registration its agent did not send, then a leave, makes such a row; silence judges it).
CREATE OR REPLACE VIEW judged_workers AS
SELECT w.id, w.incarnation, w.last_heartbeat_at, w.hold_until, w.dead_after_ms
  FROM workers w
 WHERE w.state = 'alive'
    OR (w.state = 'left'
        AND EXISTS (SELECT 1 FROM assignments a
                     WHERE a.worker_id = w.id AND a.state = 'active'
                       AND a.worker_incarnation <> w.incarnation));

-- The workers the placer may place on (queries.LIVE_WORKERS, ROUND_READ): alive, heard within
-- p_fresh_s and not held for a planned restart, with their allocation and their send window's
-- counters (worker_allocations), whether each runs container jobs (its label container=docker,
-- actors/placement.py), whether it is cordoned (read so that an unschedulable reason can name the
-- cordoned workers it did not count; never placed on), marked unhealthy and, if so, whether its
-- probe is due, and whether it is on trial (actors/placer.py, probe_limit: one job at a time):
-- with p_trial_run_s > 0, no run of its incarnation that ended (or is still going) after its
-- registration and its health_since has succeeded or run for p_trial_run_s since a heartbeat first
-- listed it, a run cancelled after that long included (a user's cancel, or a drain, does not put a
-- worker back on trial). Indexes assignments_finished_by_worker, assignments_cancelled_by_worker and
-- assignments_active_by_worker: one worker's runs since. With the devices it offers (resources,
-- JSON {name: [unit, ...]}; NULL for none) and those its active assignments hold (units_in_use,
-- JSON [[name, unit], ...]; NULL for none; every worker's gathered in one pass over the active
-- units, index assignment_units_one_active_holder), read only for a worker that offers some. A plain SQL function: the planner inlines it into the statement
-- that calls it.
CREATE OR REPLACE FUNCTION live_workers(p_fresh_s float8, p_trial_run_s float8)
RETURNS TABLE (
    id text, address text, incarnation bigint, cpu_millis integer, memory_mb integer,
    cpu_allocated_millis bigint, memory_allocated_mb bigint, unconfirmed_assignments integer,
    confirmed_assignments integer, runs_containers boolean, labels text, cordoned boolean,
    unhealthy boolean, probe_due boolean, trial boolean, resources text, units_in_use text
) LANGUAGE sql STABLE AS $$
    SELECT w.id, w.address, w.incarnation, w.cpu_millis, w.memory_mb, a.cpu_allocated_millis,
           a.memory_allocated_mb, a.unconfirmed_assignments, a.confirmed_assignments,
           coalesce(w.labels->>'container' = 'docker', false), w.labels::text,
           w.cordoned_at IS NOT NULL, w.unhealthy_at IS NOT NULL,
           coalesce(w.unhealthy_probe_at <= now(), false),
           p_trial_run_s > 0
           AND NOT EXISTS (SELECT 1 FROM assignments t
                            WHERE t.worker_id = w.id AND t.state = 'finished'
                              AND t.ended_at > greatest(w.registered_at, coalesce(w.health_since, '-infinity'))
                              AND t.worker_incarnation = w.incarnation
                              AND (t.outcome = 'succeeded'
                                   OR t.confirmed_at + make_interval(secs => p_trial_run_s) <= t.ended_at))
           AND NOT EXISTS (SELECT 1 FROM assignments t
                            WHERE t.worker_id = w.id AND t.state = 'cancelled'
                              AND t.ended_at > greatest(w.registered_at, coalesce(w.health_since, '-infinity'))
                              AND t.worker_incarnation = w.incarnation
                              AND t.confirmed_at + make_interval(secs => p_trial_run_s) <= t.ended_at)
           AND NOT EXISTS (SELECT 1 FROM assignments t
                            WHERE t.worker_id = w.id AND t.state = 'active'
                              AND t.worker_incarnation = w.incarnation
                              AND t.confirmed_at + make_interval(secs => p_trial_run_s) <= now()),
           CASE WHEN w.resources <> '{}'::jsonb THEN w.resources::text END,
           CASE WHEN w.resources <> '{}'::jsonb THEN u.units END
      FROM workers w JOIN worker_allocations a ON a.worker_id = w.id
      -- every worker's units in use in one pass over the active ones, not a subquery per worker
      LEFT JOIN (SELECT h.worker_id, json_agg(json_build_array(h.resource, h.unit))::text AS units
                   FROM assignment_units h WHERE h.active GROUP BY h.worker_id) u ON u.worker_id = w.id
     WHERE w.state = 'alive' AND w.last_heartbeat_at > now() - make_interval(secs => p_fresh_s)
       AND (w.hold_until IS NULL OR w.hold_until <= now())
$$;

-- The pending jobs as the placer reads them (queries.PENDING_JOBS, ROUND_READ): with how long
-- (s, database time) each must still wait for its requeue backoff, whether it runs in a
-- container, its constraints (NULL: none), and the workers where a run of it failed before
-- (failed_on: their ids separated by spaces, ids hold none; NULL for none; looked up only for a
-- job that spent an attempt, index assignments_by_job), which a retry avoids (actors/placement.py),
-- and the devices it asks (JSON {name: count}; NULL for none; docs/devices.md).
CREATE OR REPLACE VIEW placeable_jobs AS
SELECT id, cpu_millis, memory_mb, priority, reason, pending_xid, pending_seq,
       greatest(extract(epoch FROM not_before - now()), 0)::float8 AS wait_s,
       runtime = 'container' AS container,
       CASE WHEN constraints = '[]'::jsonb THEN NULL ELSE constraints::text END AS constraints,
       CASE WHEN failures > 0 THEN
           (SELECT string_agg(DISTINCT a.worker_id, ' ') FROM assignments a
             WHERE a.job_id = jobs.id AND a.outcome = 'failed') END AS failed_on,
       owner,
       CASE WHEN resources = '{}'::jsonb THEN NULL ELSE resources::text END AS resources,
       -- a gang's task (docs/gangs.md): its gang, rank, the gang's size and spread
       gang_id, gang_rank,
       CASE WHEN gang_id IS NOT NULL THEN (SELECT g.size FROM gangs g WHERE g.id = jobs.gang_id) END
           AS gang_size,
       CASE WHEN gang_id IS NOT NULL THEN (SELECT g.spread FROM gangs g WHERE g.id = jobs.gang_id) END
           AS gang_spread
  FROM jobs WHERE state = 'pending';

-- The device units assignment p_assignment_id holds (docs/devices.md), as JSON [[name, unit],
-- ...] sorted; NULL for none. What a dispatch of it sends (queries.UNCONFIRMED_ASSIGNMENTS).
CREATE OR REPLACE FUNCTION held_units(p_assignment_id bigint) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT json_agg(json_build_array(u.resource, u.unit) ORDER BY u.resource, u.unit)::text
      FROM assignment_units u WHERE u.assignment_id = p_assignment_id
$$;

-- The accounts with a cpu_millis or memory_mb cap, their caps (NULL: none) and what their
-- assigned and running jobs hold (index jobs_in_use_by_owner): what the placer holds a job's
-- account to (actors/quotas.py).
CREATE OR REPLACE VIEW quota_usage AS
SELECT a.name, a.cpu_millis, a.memory_mb,
       coalesce(u.cpu_millis, 0)::bigint AS used_cpu_millis,
       coalesce(u.memory_mb, 0)::bigint AS used_memory_mb
  FROM accounts a
  LEFT JOIN LATERAL (SELECT sum(j.cpu_millis) AS cpu_millis, sum(j.memory_mb) AS memory_mb FROM jobs j
                      WHERE j.owner = a.name AND j.state IN ('assigned', 'running')) u ON true
 WHERE a.cpu_millis IS NOT NULL OR a.memory_mb IS NOT NULL;

-- One row (dep, state) per job id in p_after that exists (actors/dependencies.py). A job stands
-- for itself; an array's id (its first task's) for the whole array, as Slurm's
-- afterok:<array job id>: 'failed' when a task failed, else 'cancelled' when one was,
-- 'succeeded' when every task did, else 'unfinished'; a gang's id (its rank 0 task's) likewise
-- for the whole gang (docs/gangs.md). Indexes jobs_by_array, jobs_by_gang and the primary key.
CREATE OR REPLACE FUNCTION dependency_states(p_after bigint[])
RETURNS TABLE (dep bigint, state text) LANGUAGE sql STABLE AS $$
    SELECT m.dep, CASE WHEN bool_or(m.state = 'failed') THEN 'failed'
                       WHEN bool_or(m.state = 'cancelled') THEN 'cancelled'
                       WHEN bool_and(m.state = 'succeeded') THEN 'succeeded'
                       WHEN count(*) = 1 THEN min(m.state)
                       ELSE 'unfinished' END AS state
      FROM (SELECT d.id AS dep, d.state FROM jobs d
             WHERE d.id = ANY(p_after) AND d.array_id IS DISTINCT FROM d.id
               AND d.gang_id IS DISTINCT FROM d.id
            UNION ALL
            SELECT t.array_id, t.state FROM jobs t WHERE t.array_id = ANY(p_after)
            UNION ALL
            SELECT t.gang_id, t.state FROM jobs t WHERE t.gang_id = ANY(p_after)) m
     GROUP BY m.dep
$$;

-- Refuse a submission of p_owner's (p_adding jobs, the highest of priority p_priority) that breaks
-- one of its account's rules (accounts, one read of its row), so the submitting statement rolls
-- back whole. p_priority NULL: the caller is not capped (an operator's). Returns true.
-- - p_priority above the account's max_priority (NULL: the default, 0, runtime/accounts.py's
--   DEFAULT_MAX_PRIORITY): SQLSTATE SK002 (runtime/aio/pg.py: InvalidArgument), the field in
--   COLUMN, the value in DETAIL, the rule in the message, what to do in HINT. Checked first,
--   without a lock: bad input is refused whatever the queue holds.
-- - the account's queued (pending and waiting) jobs plus p_adding over its max_pending: SQLSTATE
--   SK001 (FailedPrecondition) with a message naming the account, its count and the cap. It holds
--   a transaction-scoped advisory lock on the account first, and counts in a fresh snapshot after
--   it (a VOLATILE function's statement, under READ COMMITTED), so two concurrent submissions of
--   one account count each other: the second waits for the first's commit. An account with no
--   max_pending takes no lock (a cap an operator sets meanwhile holds from the next submission).
CREATE OR REPLACE FUNCTION check_submission(p_owner text, p_adding bigint, p_priority bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_cap bigint;
    v_max_priority bigint;
    v_queued bigint;
BEGIN
    SELECT max_pending, max_priority INTO v_cap, v_max_priority FROM accounts WHERE name = p_owner;
    IF p_priority > coalesce(v_max_priority, 0) THEN
        RAISE EXCEPTION 'must be at most account %''s max_priority %', p_owner, coalesce(v_max_priority, 0)
              USING ERRCODE = 'SK002', COLUMN = 'priority', DETAIL = p_priority::text,
                    HINT = format('an operator may raise it: stockade account set %s --max-priority N', p_owner);
    END IF;
    IF v_cap IS NULL THEN
        RETURN true;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('stockade.max_pending.' || p_owner, 0));
    SELECT count(*) INTO v_queued FROM jobs WHERE owner = p_owner AND state IN ('pending', 'waiting');
    IF v_queued + p_adding > v_cap THEN
        RAISE EXCEPTION 'quota: account % has % pending and waiting jobs of max_pending %; % more refused',
                        p_owner, v_queued, v_cap, p_adding USING ERRCODE = 'SK001';
    END IF;
    RETURN true;
END $$;

-- Capped exponential backoff with full jitter (M. Brooker, "Exponential Backoff And Jitter", AWS
-- Architecture Blog, 2015): uniform in [0, min(p_cap_s, p_base_s * 2^p_attempt)] seconds,
-- p_attempt counting from 0. The database's copy of runtime/backoff.py's FullJitterBackoff: the
-- database draws the waits of job requeues (a retry's delay, a loss's backoff) so they are written
-- with the requeue and a new leader honours them; Python draws those of network retries.
CREATE OR REPLACE FUNCTION full_jitter_s(p_base_s float8, p_cap_s float8, p_attempt integer)
RETURNS float8 LANGUAGE sql VOLATILE STRICT AS $$
    SELECT random() * least(p_cap_s, p_base_s * power(2.0::float8, least(p_attempt, 1023)))
$$;

-- The delay before a job's next run after p_failures spent attempts, in seconds: full_jitter_s
-- from retry_backoff_ms, capped at 600 s (runtime/jobs.py's MAX_RETRY_BACKOFF_S; a test holds
-- them equal).
CREATE OR REPLACE FUNCTION retry_delay_s(p_backoff_ms bigint, p_failures integer)
RETURNS float8 LANGUAGE sql VOLATILE AS $$
    SELECT full_jitter_s(p_backoff_ms / 1000.0, 600.0, greatest(p_failures, 1) - 1)
$$;

-- Whether a job is placed again after a run that spends p_spent more of its attempts: attempts
-- are left after it (p_failures spent before) and no cancel was asked. The one rule of every
-- retry (after_run, and record_outcomes' late reports).
CREATE OR REPLACE FUNCTION retries(
    p_cancel_requested boolean, p_failures integer, p_spent integer, p_max_attempts integer
) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT NOT p_cancel_requested AND p_failures + p_spent < p_max_attempts
$$;

-- Whether a failed run may be retried by its job's failure policy (runtime/jobs.py, JobSpec:
-- retry_on_exit, no_retry_on): NULL when it may, else the detail the job ends failed with, saying
-- why. The one rule of failure policies (after_run, and record_outcomes' late reports).
-- p_detail: the run's detail; the reason it names is the word before its colon (``oom_killed:
-- ...``, or a bare ``timeout``), as record_outcomes reads an end reason. A run that names a
-- reason is refused when no_retry_on holds it (the detail: the run's, then ``(not retried:
-- oom_killed is in no_retry_on [oom_killed])``); one that names none failed by its exit code
-- (p_exit_code, NULL: none), refused when retry_on_exit is not empty and does not hold it (the
-- detail: ``exit code 2 is not in retry_on_exit [1, 75]``). Kubernetes' podFailurePolicy
-- (onExitCodes, action FailJob) is the model.
CREATE OR REPLACE FUNCTION retry_refusal(
    p_retry_on_exit integer[], p_no_retry_on text[], p_detail text, p_exit_code integer
) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN r.reason IS NOT NULL
        THEN CASE WHEN r.reason = ANY(p_no_retry_on)
                  THEN left(p_detail, 800) || ' (not retried: ' || r.reason || ' is in no_retry_on ['
                       || array_to_string(p_no_retry_on, ', ') || '])' END
        WHEN cardinality(p_retry_on_exit) = 0 THEN NULL
        WHEN p_exit_code IS NULL
        THEN 'it ended with no exit code, and retry_on_exit is ['
             || array_to_string(p_retry_on_exit, ', ') || ']: ' || left(p_detail, 800)
        WHEN p_exit_code <> ALL(p_retry_on_exit)
        THEN 'exit code ' || p_exit_code || ' is not in retry_on_exit ['
             || array_to_string(p_retry_on_exit, ', ') || ']'
    END
      FROM (SELECT substring(p_detail FROM '^([a-z_]+)(?::|$)') AS reason) r
$$;

-- What the end of a run makes of its job, the one rule of retries (record_outcomes and
-- queries.END_TIMED_OUT_ASSIGNMENTS), returning the columns its caller sets in this order. j: the
-- job's row as the caller's UPDATE finds it (READ COMMITTED re-reads the newest version, so a
-- cancel that committed first is seen). p_outcome 'succeeded' ends the job; 'failed' spends one
-- of its max_attempts and, while attempts are left, no cancel was asked and its failure policy
-- allows it (retry_refusal of p_detail and p_exit_code), makes it pending again (not started, not
-- placed before now() plus retry_delay_s, its reason naming the attempt and p_why), else ends it
-- failed, its detail p_detail, or, when only the policy refused the retry, retry_refusal's
-- (``exit code 2 is not in retry_on_exit [1, 75]``); 'cancelled' (a run the leader stopped, its
-- cancel asked) spends one and ends it. An ended job keeps p_started_at and p_finished_at, its
-- run's.
CREATE OR REPLACE FUNCTION after_run(
    j jobs, p_outcome text, p_why text, p_exit_code integer, p_detail text,
    p_started_at timestamptz, p_finished_at timestamptz,
    OUT state text, OUT failures integer, OUT started_at timestamptz, OUT finished_at timestamptz,
    OUT pending_seq bigint, OUT pending_xid bigint, OUT not_before timestamptz, OUT reason text,
    OUT detail text
) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    refusal text;
BEGIN
    failures := j.failures + CASE WHEN p_outcome = 'succeeded' THEN 0 ELSE 1 END;
    detail := p_detail;
    IF p_outcome = 'failed' AND retries(j.cancel_requested, j.failures, 1, j.max_attempts) THEN
        refusal := retry_refusal(j.retry_on_exit, j.no_retry_on, p_detail, p_exit_code);
    END IF;
    IF p_outcome = 'failed' AND retries(j.cancel_requested, j.failures, 1, j.max_attempts)
       AND refusal IS NULL THEN
        state := 'pending';
        pending_seq := nextval('pending_seq');
        pending_xid := pg_current_xact_id()::text::bigint;
        not_before := now() + make_interval(secs => retry_delay_s(j.retry_backoff_ms, failures));
        reason := 'retrying: attempt ' || failures || ' of ' || j.max_attempts || ' failed (' || p_why || ')';
    ELSE
        state := p_outcome;
        started_at := p_started_at;
        finished_at := p_finished_at;
        pending_seq := j.pending_seq;
        pending_xid := j.pending_xid;
        not_before := j.not_before;
        reason := '';
        detail := coalesce(refusal, p_detail);
    END IF;
END $$;

-- When a task of an array with a max_failed_tasks (array_max_failed) has failed for good, in the
-- transaction that ends it (whichever statement does: an outcome, a late one, a timeout, a loss
-- that spent the last attempt): once that many of the array's tasks have failed, its tasks that
-- have not ended are cancelled, detail ``max_failed_tasks: ...`` (waiting and pending ones at
-- once, assigned and running ones by a cancel the leader carries out, as CancelJob's), so the
-- array has failed (dependency_states). The count is taken under a transaction-scoped advisory
-- lock on the array, in a fresh snapshot, so two tasks failing in concurrent transactions count
-- each other (the second waits for the first's commit). Kubernetes' maxFailedIndexes is the
-- model (there: more than the limit; here: at least, as the field's name says).
CREATE OR REPLACE FUNCTION array_task_failed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_failed bigint;
    v_why text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('stockade.array_failed.' || NEW.array_id, 0));
    SELECT count(*) INTO v_failed FROM jobs WHERE array_id = NEW.array_id AND state = 'failed';
    IF v_failed < NEW.array_max_failed THEN
        RETURN NULL;
    END IF;
    v_why := 'max_failed_tasks: cancelled because ' || v_failed || ' of the array''s tasks failed '
             || '(max_failed_tasks ' || NEW.array_max_failed || ', array ' || NEW.array_id || ')';
    UPDATE jobs
       SET state = 'cancelled', finished_at = now(), reason = '', detail = v_why,
           cancel_requested_at = coalesce(cancel_requested_at, now())
     WHERE array_id = NEW.array_id AND state IN ('waiting', 'pending');
    UPDATE jobs
       SET cancel_requested = true, cancel_requested_at = coalesce(cancel_requested_at, now()),
           detail = v_why
     WHERE array_id = NEW.array_id AND state IN ('assigned', 'running') AND NOT cancel_requested;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER jobs_array_task_failed AFTER UPDATE OF state ON jobs
    FOR EACH ROW WHEN (NEW.state = 'failed' AND OLD.state <> 'failed' AND NEW.array_max_failed IS NOT NULL)
    EXECUTE FUNCTION array_task_failed();

-- What losing a run makes of its job, the one rule of the leader's requeues
-- (queries.END_ORPHANED_ASSIGNMENTS, END_CANCELLED_ASSIGNMENTS), returning the columns its
-- caller sets in this order. j: the job's row as the caller's UPDATE finds it. p_lost: a loss
-- (counted in losses, waited out by a backoff), not a clean stop; p_counted: the loss spends
-- an attempt (count_lost); p_why: the assignment's end reason. A job whose cancel was asked
-- ends cancelled, keeping its last run's start and its reason (as requeue_unspent's); one whose
-- counted loss spent its last attempt ends failed, its detail saying so; any other is pending
-- again: at once with no reason, or after a loss not before a backoff of full_jitter_s counted by
-- its losses (p_caps: the first entry its base, the last its cap; empty: none), its reason saying
-- until when (UTC).
CREATE OR REPLACE FUNCTION after_loss(
    j jobs, p_why text, p_lost boolean, p_counted boolean, p_caps float8[],
    OUT state text, OUT losses integer, OUT failures integer, OUT started_at timestamptz,
    OUT finished_at timestamptz, OUT pending_seq bigint, OUT pending_xid bigint,
    OUT not_before timestamptz, OUT reason text, OUT detail text
) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    losses := j.losses + CASE WHEN p_lost THEN 1 ELSE 0 END;
    failures := j.failures + CASE WHEN p_counted THEN 1 ELSE 0 END;
    started_at := j.started_at;
    finished_at := now();
    pending_seq := j.pending_seq;
    pending_xid := j.pending_xid;
    not_before := j.not_before;
    reason := j.reason;
    detail := j.detail;
    IF j.cancel_requested THEN
        state := 'cancelled';
    ELSIF p_counted AND failures >= j.max_attempts THEN
        state := 'failed';
        reason := '';
        detail := p_why || ': the run was lost with its worker, the last of ' || j.max_attempts
                  || ' attempts (count_lost)';
    ELSE
        state := 'pending';
        started_at := NULL;
        finished_at := NULL;
        pending_seq := nextval('pending_seq');
        pending_xid := pg_current_xact_id()::text::bigint;
        not_before := NULL;
        reason := '';
        IF p_lost THEN
            not_before := now() + make_interval(
                secs => full_jitter_s(p_caps[1], p_caps[cardinality(p_caps)], j.losses));
        END IF;
        IF not_before IS NOT NULL THEN
            reason := 'backoff: placed again after '
                      || to_char(not_before AT TIME ZONE 'UTC', 'HH24:MI:SS.MS') || ' UTC';
        END IF;
    END IF;
END $$;

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
-- The jobs of assignments that ended with no attempt spent (not started, released by a
-- restarted agent, drained: queries.RELEASE_UNHELD_ASSIGNMENTS, END_DRAINED_ASSIGNMENTS,
-- record_outcomes), called in the transaction that ends them: each still assigned or running
-- goes as after a clean stop (after_loss: pending again at once, or cancelled if its cancel was
-- asked). Returns the ids changed.
CREATE OR REPLACE FUNCTION requeue_unspent(p_job_ids bigint[]) RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    requeued bigint[];
BEGIN
    -- Most calls (every report of outcomes) have none: no statement, and plpgsql keeps the
    -- UPDATE's plan for the session.
    IF coalesce(cardinality(p_job_ids), 0) = 0 THEN
        RETURN '{}';
    END IF;
    WITH r AS (
        UPDATE jobs j
           SET (state, losses, failures, started_at, finished_at, pending_seq, pending_xid, not_before,
                reason, detail) = (SELECT * FROM after_loss(j, '', false, false, '{}'))
         WHERE j.id = ANY(p_job_ids) AND j.state IN ('assigned', 'running')
     RETURNING j.id
    )
    SELECT coalesce(array_agg(id), '{}') INTO requeued FROM r;
    RETURN requeued;
END $$;

-- ---------------------------------------------------------------- gangs (routines)

-- The one rule of a gang's runs (docs/gangs.md, "Failure"), run after every statement that ends
-- assignments (trigger assignments_gang_runs_ended), so every path that ends a run (a worker's
-- report, a dead worker, a timeout, a cancel, a preemption, a drain) keeps it, in the
-- transaction of the end. The task's own job went as every job goes (after_run, after_loss,
-- requeue_unspent) in the same statement; then, per gang:
-- - the first end of a task of the gang's newest attempt other than a success breaks that
--   attempt; the attempt spends one of the gang's attempts (once) when a run of it spent its
--   job's (counted: failed, timed out, or lost with count_lost, as a single job's), then or later;
--   the gang's other active tasks of that attempt are asked to stop (the preemption's stop,
--   preempted_by NULL: queries.PREEMPT_DUE_ASSIGNMENTS), and its tasks that succeeded in it
--   (before the break, or after it: a stop too late) are pending again (the gang runs again
--   whole); the gang fails once its attempts are spent, and is cancelled when a task's cancel was
--   asked;
-- - a task that ended failed or cancelled on its own ends its live gang so;
-- - a gang that failed or was cancelled takes its pending and waiting tasks with it (each task
--   that still runs becomes pending when its stop ends it, and is ended then);
-- - a gang all of whose tasks succeeded has succeeded.
-- Tasks become pending one by one as their runs end; the placer places a gang only when all of
-- them are (actors/gangs.py), so a task is placed again only after every run of its attempt ended.
CREATE OR REPLACE FUNCTION gang_runs_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    touched bigint[];
BEGIN
    -- Most statements end no gang task: one pass over the changed rows, nothing else.
    IF NOT EXISTS (SELECT 1 FROM gang_after_rows WHERE gang_attempt IS NOT NULL AND state <> 'active') THEN
        RETURN NULL;
    END IF;
    -- One end of a gang's runs at a time: two transactions each ending one task (two workers'
    -- reports) would else each see the other's task still running, and neither would find the
    -- gang succeeded. Locked in id order; each statement below reads after the lock (a fresh
    -- snapshot per statement), so the second sees what the first committed.
    PERFORM 1 FROM gangs g
     WHERE g.id IN (SELECT j.gang_id FROM gang_after_rows a JOIN jobs j ON j.id = a.job_id
                     WHERE a.gang_attempt IS NOT NULL AND a.state <> 'active')
     ORDER BY g.id
       FOR UPDATE OF g;
    WITH ended AS (
        SELECT j.gang_id, a.gang_attempt AS attempt,
               bool_or(a.counted) AS spends,
               bool_or(NOT (a.state = 'finished' AND a.outcome IS NOT DISTINCT FROM 'succeeded')) AS breaks,
               bool_or(j.cancel_requested) AS cancelled,
               string_agg(DISTINCT 'task ' || j.gang_rank || ' ' || coalesce(a.end_reason, a.state), ', ')
                   FILTER (WHERE NOT (a.state = 'finished' AND a.outcome IS NOT DISTINCT FROM 'succeeded'))
                   AS why
          FROM gang_before_rows o
          JOIN gang_after_rows a ON a.id = o.id
          JOIN jobs j ON j.id = a.job_id
         WHERE o.state = 'active' AND a.state <> 'active' AND a.gang_attempt IS NOT NULL
         GROUP BY j.gang_id, a.gang_attempt
    ),
    broke AS (
        UPDATE gangs g
           SET broken = e.attempt,
               spent = CASE WHEN e.spends THEN e.attempt ELSE g.spent END,
               failures = g.failures + (e.spends AND g.spent < e.attempt)::int,
               state = CASE WHEN e.cancelled THEN 'cancelled'
                            WHEN g.failures + (e.spends AND g.spent < e.attempt)::int >= g.max_attempts
                            THEN 'failed'
                            ELSE g.state END,
               detail = CASE WHEN e.cancelled THEN 'cancelled'
                             WHEN g.failures + (e.spends AND g.spent < e.attempt)::int >= g.max_attempts
                             THEN 'gang_failed: attempt ' || e.attempt || ' broke (' || e.why
                                  || '), the last of ' || g.max_attempts || ' attempts'
                             ELSE 'gang attempt ' || e.attempt || ' broke (' || e.why || ')' END
          FROM ended e
         WHERE g.id = e.gang_id AND e.breaks AND g.state = 'live' AND e.attempt = g.attempts
           -- the first end that breaks the attempt, or a later one that spends it, or a cancel
           AND (g.broken < e.attempt OR (e.spends AND g.spent < e.attempt) OR e.cancelled)
     RETURNING g.id, e.attempt, g.state
    ),
    stopping AS (
        UPDATE assignments a
           SET preempt_requested_at = now(), preempted_by = NULL
          FROM broke b JOIN jobs j ON j.gang_id = b.id
         WHERE a.job_id = j.id AND a.state = 'active' AND a.gang_attempt = b.attempt
           AND a.preempt_requested_at IS NULL
    )
    SELECT coalesce(array_agg(DISTINCT gang_id), '{}') INTO touched FROM ended;

    -- A task that ended failed or cancelled on its own (its own attempts spent, a cancel that
    -- raced) ends its live gang with it.
    UPDATE gangs g
       SET state = CASE WHEN bad.failed THEN 'failed' ELSE 'cancelled' END,
           detail = CASE WHEN bad.failed THEN 'gang_failed: task ' || bad.rank || ' failed'
                         ELSE 'cancelled' END
      FROM (SELECT j.gang_id, bool_or(j.state = 'failed') AS failed, min(j.gang_rank) AS rank
              FROM jobs j WHERE j.gang_id = ANY(touched) AND j.state IN ('failed', 'cancelled')
             GROUP BY j.gang_id) bad
     WHERE g.id = bad.gang_id AND g.state = 'live';

    -- A live gang whose newest attempt broke runs again whole: its tasks that succeeded in it
    -- (before the break, or after it, their stop too late) are pending again.
    UPDATE jobs j
       SET state = 'pending', started_at = NULL, finished_at = NULL, exit_code = NULL,
           pending_seq = nextval('pending_seq'), pending_xid = pg_current_xact_id()::text::bigint,
           not_before = NULL, reason = ''
      FROM gangs g
     WHERE g.id = ANY(touched) AND g.state = 'live' AND g.broken = g.attempts
       AND j.gang_id = g.id AND j.state = 'succeeded';

    UPDATE jobs j
       SET state = g.state, reason = '', finished_at = now(),
           detail = CASE WHEN j.detail = '' THEN g.detail ELSE j.detail END
      FROM gangs g
     WHERE g.id = ANY(touched) AND g.state IN ('failed', 'cancelled')
       AND j.gang_id = g.id AND j.state IN ('pending', 'waiting');

    UPDATE gangs g SET state = 'succeeded', detail = ''
     WHERE g.id = ANY(touched) AND g.state = 'live'
       AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.gang_id = g.id AND j.state <> 'succeeded');
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER assignments_gang_runs_ended AFTER UPDATE ON assignments
    REFERENCING OLD TABLE AS gang_before_rows NEW TABLE AS gang_after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION gang_runs_ended();

-- A late outcome (record_outcomes: a run's report that came after the leader had ended it as
-- lost) never ends a task of a live gang on its own: the gang's attempt broke with that loss and
-- its tasks run again together, so the task stays pending (a report of success or failure of a
-- run of an attempt that broke changes nothing but the assignment's recorded outcome). A gang
-- that failed or was cancelled ends its tasks itself (gang_runs_ended, CANCEL_JOB), after it is
-- no longer live.
CREATE OR REPLACE FUNCTION gang_task_stays_pending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM gangs g WHERE g.id = NEW.gang_id AND g.state = 'live') THEN
        NEW.state := OLD.state;
        NEW.failures := OLD.failures;
        NEW.started_at := OLD.started_at;
        NEW.finished_at := OLD.finished_at;
        NEW.reason := OLD.reason;
        NEW.exit_code := OLD.exit_code;
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER jobs_gang_task_stays_pending BEFORE UPDATE OF state ON jobs
    FOR EACH ROW WHEN (OLD.gang_id IS NOT NULL AND OLD.state = 'pending'
                       AND NEW.state IN ('succeeded', 'failed'))
    EXECUTE FUNCTION gang_task_stays_pending();

-- The gangs holding resources partially (docs/gangs.md, "No partial gang"): a live gang whose
-- newest attempt has tasks with an active assignment not asked to stop while another of its
-- tasks has neither such an assignment nor a success in that attempt. Empty in every committed
-- state: a commit places a gang whole, and the end that breaks an attempt asks the rest to stop
-- in its own transaction (gang_runs_ended). Read by the checker and chaos sampling.
CREATE OR REPLACE VIEW partial_gangs AS
SELECT g.id AS gang_id, g.attempts AS attempt, g.size,
       count(*) FILTER (WHERE t.holding)::int AS holding,
       count(*) FILTER (WHERE t.succeeded)::int AS succeeded
  FROM gangs g
  JOIN LATERAL (
      SELECT EXISTS (SELECT 1 FROM assignments a
                      WHERE a.job_id = j.id AND a.state = 'active' AND a.preempt_requested_at IS NULL
                        AND a.gang_attempt = g.attempts) AS holding,
             j.state = 'succeeded' AS succeeded
        FROM jobs j WHERE j.gang_id = g.id
  ) t ON true
 WHERE g.state = 'live' AND g.attempts > 0
 GROUP BY g.id
HAVING count(*) FILTER (WHERE t.holding) > 0
   AND count(*) FILTER (WHERE t.holding OR t.succeeded) < g.size;

-- ---------------------------------------------------------------- heartbeats and outcomes

-- What to tell a worker: the policy row, or (before the leader chose one) the caller's defaults.
CREATE OR REPLACE FUNCTION heartbeat_told(p_interval_ms integer, p_dead_after_ms integer,
                                          OUT interval_ms integer, OUT dead_after_ms integer)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(p.interval_ms, p_interval_ms), coalesce(p.dead_after_ms, p_dead_after_ms)
      FROM (SELECT 1) one LEFT JOIN heartbeat_policy p ON p.id = 1
$$;
-- A worker's reported outcomes, from a heartbeat or a registration (actors/ingest.py), inside
-- the caller's transaction. p_worker_id: who reports; the arrays, in parallel: assignment ids,
-- states, exit codes (NULL for none), run lengths (ms), how long before the report was sent
-- each run ended (ms), stdout paths, stderr paths, details; the run's start and end are dated
-- by run_started_at and run_finished_at above. Only succeeded/failed outcomes end a run, and
-- not_started ones an assignment that never ran (below): anything else the worker reports (a
-- stop the control plane ordered, a fence) was or will be ended by the leader. Returns how
-- many outcomes were recorded late.
-- What becomes of an outcome on time and of one that arrives after the leader ended its
-- assignment as lost, and why a late one never runs its job twice: docs/design.md, "Outcomes on
-- time and late".
CREATE OR REPLACE FUNCTION record_outcomes(
    p_worker_id text, p_assignment_ids bigint[], p_states text[], p_exit_codes int[],
    p_run_ms bigint[], p_ended_ago_ms bigint[], p_stdout_paths text[], p_stderr_paths text[],
    p_details text[]
) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    late integer;
    late_ids bigint[];
    revived bigint[];
    requeued bigint[];  -- not started: the jobs placed again (requeue_unspent)
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
           SET (state, failures, started_at, finished_at, pending_seq, pending_xid, not_before, reason,
                detail)
                 = (SELECT * FROM after_run(j, o.state, left(o.detail, 200), o.exit_code, o.detail,
                                            timed.started_at, timed.finished_at)),
               exit_code = o.exit_code, stdout_path = o.stdout_path, stderr_path = o.stderr_path
          FROM timed JOIN o ON o.assignment_id = timed.id
         WHERE timed.was_active AND j.id = timed.job_id AND j.state IN ('assigned', 'running')
    )
    SELECT count(*) FILTER (WHERE NOT was_active),
           coalesce(array_agg(id) FILTER (WHERE NOT was_active), '{}')
      INTO late, late_ids FROM recorded;

    -- Ended by the worker's fence on its own, while its incarnation may live on: the only
    -- report that ends such an assignment. Not started (agent/messages.py,
    -- JobState.NOT_STARTED): accepted, never started (its reaper found the fence deadline
    -- passed); nothing ran, so the assignment ends 'stopped' (end_reason 'not_started') and the
    -- job is placed again at once, with no attempt spent, no loss counted and no backoff (as
    -- after a clean leave); a job whose cancel was asked ends cancelled. Fenced
    -- (JobState.FENCED): started, then killed by its reaper, which found the kill deadline
    -- passed before its agent did; the run is lost as with a dead worker: the assignment ends
    -- 'lost' (end_reason 'self_fence', counted when the job counts losses) and the job goes by
    -- after_loss, placed again at once (no backoff: the leader's caps are its own settings, and
    -- the worker that lost it is alive). Safe unfenced for the reason a retry is
    -- (docs/design.md): the run has ended, by the word of the only worker it was addressed to,
    -- so invariant 6 holds, and the placement that follows is fenced as any. Only an active
    -- assignment of this worker is ended: a report that comes after the leader ended it
    -- (worker declared dead, or registered again) changes nothing, the leader's requeue stands.
    WITH o AS (
        SELECT o.assignment_id, o.state, o.detail
          FROM unnest(p_assignment_ids, p_states, p_details) AS o(assignment_id, state, detail)
         WHERE o.state IN ('not_started', 'fenced')
    ),
    ended AS (
        UPDATE assignments a
           SET state = CASE WHEN o.state = 'fenced' THEN 'lost' ELSE 'stopped' END,
               ended_at = now(),
               end_reason = CASE WHEN o.state = 'fenced' THEN 'self_fence' ELSE 'not_started' END,
               detail = o.detail,
               counted = o.state = 'fenced' AND (SELECT count_lost FROM jobs WHERE jobs.id = a.job_id)
          FROM o
         WHERE a.id = o.assignment_id AND a.worker_id = p_worker_id AND a.state = 'active'
     RETURNING a.job_id, a.end_reason, a.counted
    ),
    lost AS (
        UPDATE jobs j
           SET (state, losses, failures, started_at, finished_at, pending_seq, pending_xid, not_before,
                reason, detail) = (SELECT * FROM after_loss(j, 'self_fence', true, e.counted, '{}'))
          FROM ended e
         WHERE e.end_reason = 'self_fence' AND j.id = e.job_id AND j.state IN ('assigned', 'running')
    )
    SELECT requeue_unspent(array_agg(job_id) FILTER (WHERE end_reason = 'not_started'))
      INTO requeued FROM ended;

    IF late > 0 THEN
        -- A late outcome ends the job (step 3 above), but a late failure of a job with
        -- attempts left only spends one (none when count_lost: the loss spent it already),
        -- and the job stays pending, placed again as its requeue said, unless its failure
        -- policy refuses a retry (retry_refusal): then it ends failed, its detail saying why. A
        -- job that count_lost made failed when this loss spent its last attempt takes the
        -- run's true outcome.
        WITH o AS (
            SELECT * FROM unnest(p_assignment_ids, p_states, p_exit_codes, p_run_ms,
                                 p_ended_ago_ms, p_stdout_paths, p_stderr_paths, p_details)
                   AS o(assignment_id, state, exit_code, run_ms, ended_ago_ms, stdout_path,
                        stderr_path, detail)
             WHERE o.state IN ('succeeded', 'failed')
        )
        , flipped AS (
        UPDATE jobs j
           SET (state, reason, finished_at, detail) = (
                   SELECT CASE WHEN k.kept THEN 'pending' ELSE o.state END,
                          CASE WHEN k.kept THEN j.reason ELSE '' END,
                          CASE WHEN k.kept THEN j.finished_at ELSE f.finished_at END,
                          coalesce(k.refusal, o.detail)
                     FROM (SELECT r.retrying AND r.refusal IS NULL AS kept, r.refusal
                             FROM (SELECT p.retrying,
                                          CASE WHEN p.retrying
                                               THEN retry_refusal(j.retry_on_exit, j.no_retry_on,
                                                                  o.detail, o.exit_code)
                                          END AS refusal
                                     FROM (SELECT o.state = 'failed' AND j.state = 'pending'
                                                  AND retries(false, j.failures, (NOT j.count_lost)::int,
                                                              j.max_attempts) AS retrying) p) r) k),
               failures = j.failures + CASE WHEN o.state = 'failed' AND NOT j.count_lost THEN 1 ELSE 0 END,
               exit_code = o.exit_code,
               -- dated within the lost assignment: it ended before the leader ended it (strictly,
               -- so the job's history tells the requeue in between: queries.JOB_EVENTS)
               started_at = run_started_at(a.created_at, f.finished_at, o.run_ms),
               stdout_path = o.stdout_path, stderr_path = o.stderr_path
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
-- One heartbeat in one statement (actors/ingest.py, queries.HEARTBEAT), one round trip: the
-- worker's row is locked only while it runs. Each statement inside sees what the ones before it
-- wrote (a VOLATILE function under READ COMMITTED takes a snapshot per statement); all commit
-- together, with the calling statement.
-- p_worker_id, p_incarnation: who reports. p_running: the assignment ids it runs.
-- p_assignment_ids .. p_details: its finished outcomes, as parallel arrays: assignment ids,
-- states, exit codes (NULL for none), run lengths (ms), how long before the heartbeat was sent
-- each ended (ms), stdout paths, stderr paths, details (see record_outcomes).
-- Returns the current epoch, whether this incarnation is alive (false: re-register), which of
-- p_running are not active on this worker (stop them), and the database's clock (now(), unix
-- s), by which the agent times its log (agent/dbclock.py).
-- p_sent_us, p_in_use_ms: when the worker sent it (its monotonic clock, µs: orders one
-- incarnation's heartbeats) and the dead_after its self-fence is derived from (ms; 0: none);
-- p_interval_ms, p_dead_after_ms: what to tell while the leader chose no heartbeat policy (see
-- heartbeat_told). Also returns the heartbeat interval and the dead_after to tell the worker,
-- and records the dead_after the worker is judged by (workers.dead_after_ms, below).
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
-- Why every rule of record_heartbeat still holds for each member, and what a group costs:
-- docs/design.md, "Grouped heartbeats".
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

-- The usage samples of heartbeats recorded alive (docs/console.md, "Usage"), one per element of
-- the parallel arrays: the worker, the assignment (0: all the worker's jobs together), cpu_millis,
-- memory_mb and span_ms. A job's sample is kept with its job id when the assignment is its
-- worker's; one naming another worker's assignment, or none, is dropped. Returns how many were
-- kept. Called alone after a heartbeat recorded alone, and inside a group's statement
-- (actors/queries/ingest.py, RECORD_USAGE and RECORD_HEARTBEATS_AND_USAGE).
CREATE OR REPLACE FUNCTION record_usage(
    p_worker_ids text[], p_assignment_ids bigint[], p_cpu_millis integer[], p_memory_mb integer[],
    p_span_ms integer[]
) RETURNS integer LANGUAGE sql AS $$
    WITH kept AS (
        INSERT INTO usage_samples (worker_id, job_id, assignment_id, cpu_millis, memory_mb, span_ms)
        SELECT u.worker_id, a.job_id, a.id, u.cpu_millis, u.memory_mb, u.span_ms
          FROM unnest(p_worker_ids, p_assignment_ids, p_cpu_millis, p_memory_mb, p_span_ms)
               AS u (worker_id, assignment_id, cpu_millis, memory_mb, span_ms)
          LEFT JOIN assignments a ON a.id = u.assignment_id AND a.worker_id = u.worker_id
         WHERE u.assignment_id = 0 OR a.id IS NOT NULL
        RETURNING 1
    )
    SELECT count(*)::integer FROM kept
$$;
