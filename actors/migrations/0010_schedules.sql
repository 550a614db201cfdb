-- Version 10: periodic jobs (docs/schedules.md). A schedule names a cron expression, a time zone
-- and a job template; the leader records each of its slots once in schedule_slots (fired, with
-- its job, or skipped, with why) in the fenced transaction that inserts the job.
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
ALTER TABLE audit_log DROP CONSTRAINT IF EXISTS audit_log_action_check;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_action_check
    CHECK (action IN ('submit', 'cancel', 'drain', 'cordon', 'uncordon', 'account_set',
                      'schedule_add', 'schedule_pause', 'schedule_resume', 'schedule_remove'));
