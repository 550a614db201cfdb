-- Version 11: failure policies (docs/jobs.md, "Failure policies"). A job's retry_on_exit (the
-- exit codes a failed run may be retried on; empty: any) and no_retry_on (the reasons that fail
-- it at once), and an array task's array_max_failed (how many of its array's tasks may fail
-- before the rest are cancelled). schema.sql's routines, applied with this migration, add
-- retry_refusal and array_task_failed (with its trigger jobs_array_task_failed) and replace
-- after_run (which takes the run's exit code and detail, and returns the job's detail) and
-- record_outcomes; the old after_run is dropped, its callers being replaced with it.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS retry_on_exit integer[] NOT NULL DEFAULT '{}';
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS no_retry_on text[] NOT NULL DEFAULT '{}';
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS array_max_failed integer CHECK (array_max_failed > 0);
DROP FUNCTION IF EXISTS after_run(jobs, text, text, timestamptz, timestamptz);
