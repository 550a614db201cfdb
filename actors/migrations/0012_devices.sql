-- Version 12: countable devices (docs/devices.md). A worker offers named resources with unit
-- ids (workers.resources), a job asks a count of each (jobs.resources), and every assignment
-- records the units it holds (assignment_units), one active holder per unit of a worker.
-- schema.sql's routines, applied with this migration, add the trigger assignments_free_units and
-- the function held_units, add the columns resources and units_in_use to live_workers (its
-- result changes, so it is dropped here first) and the column resources to placeable_jobs.
ALTER TABLE workers ADD COLUMN IF NOT EXISTS resources jsonb NOT NULL DEFAULT '{}';
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS resources jsonb NOT NULL DEFAULT '{}';
CREATE TABLE IF NOT EXISTS assignment_units (
    assignment_id  bigint  NOT NULL REFERENCES assignments (id),
    worker_id      text    NOT NULL,
    resource       text    NOT NULL,
    unit           text    NOT NULL,
    active         boolean NOT NULL DEFAULT true,
    PRIMARY KEY (assignment_id, resource, unit)
);
CREATE UNIQUE INDEX IF NOT EXISTS assignment_units_one_active_holder
    ON assignment_units (worker_id, resource, unit) WHERE active;
DROP FUNCTION IF EXISTS live_workers(float8, float8);
