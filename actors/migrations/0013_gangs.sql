-- Version 13: gang jobs (docs/gangs.md). A gang's tasks are jobs with gang_id (the gang's id, its
-- rank 0 task's) and gang_rank; the gangs table holds its size, spread and attempts; each
-- assignment of a task records the gang's attempt it belongs to and the port its worker gives it.
-- schema.sql's routines, applied with this migration, add the gang columns to placeable_jobs, the
-- trigger gang_runs_ended and the view partial_gangs. (Numbered 13 after the periodic jobs,
-- failure policies and devices migrations 10-12 being written beside it.)
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS gang_id bigint;
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS gang_rank integer;
CREATE INDEX IF NOT EXISTS jobs_by_gang ON jobs (gang_id, gang_rank) WHERE gang_id IS NOT NULL;
ALTER TABLE assignments ADD COLUMN IF NOT EXISTS gang_attempt integer;
ALTER TABLE assignments ADD COLUMN IF NOT EXISTS gang_port integer;
CREATE UNIQUE INDEX IF NOT EXISTS assignments_gang_port_per_worker
    ON assignments (worker_id, gang_port) WHERE state = 'active' AND gang_port IS NOT NULL;
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
