-- Version 2, from release 0.1.0's (version 1: it recorded only its schema.sql's sha256): versions
-- by number. Its routines (judged_workers, placeable_jobs, live_workers, dependency_states and
-- one full-jitter backoff, full_jitter_s, behind the retry delay) are schema.sql's, applied with
-- the newest migration (actors/schema.py, routines).
DROP TABLE IF EXISTS schema_version;
CREATE TABLE IF NOT EXISTS schema_version (
    version     integer     PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);
