-- Version 15: the usage samples workers report with their heartbeats (docs/console.md, "Usage").
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
