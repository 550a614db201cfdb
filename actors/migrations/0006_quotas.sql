-- Version 6: quotas (docs/quotas.md). Each account's caps on the cpu_millis and memory_mb its
-- assigned and running jobs hold and on its queued jobs, and its fair-share weight; setting them
-- is audited (account_set). check_max_pending, the view quota_usage and placeable_jobs' owner
-- column are schema.sql's, applied with this migration.
CREATE TABLE IF NOT EXISTS accounts (
    name         text             PRIMARY KEY,
    cpu_millis   bigint           CHECK (cpu_millis >= 0),
    memory_mb    bigint           CHECK (memory_mb >= 0),
    max_pending  bigint           CHECK (max_pending >= 0),
    weight       double precision NOT NULL DEFAULT 1
                 CHECK (weight > 0 AND weight < 'infinity'::double precision),
    updated_at   timestamptz      NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS jobs_queued_by_owner ON jobs (owner) WHERE state IN ('pending', 'waiting');
CREATE INDEX IF NOT EXISTS jobs_in_use_by_owner ON jobs (owner) INCLUDE (cpu_millis, memory_mb)
    WHERE state IN ('assigned', 'running');
ALTER TABLE audit_log DROP CONSTRAINT IF EXISTS audit_log_action_check;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_action_check
    CHECK (action IN ('submit', 'cancel', 'drain', 'cordon', 'uncordon', 'account_set'));
