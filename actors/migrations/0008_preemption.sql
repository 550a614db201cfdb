-- Version 8: preemption (docs/preemption.md). An assignment the leader decided to preempt
-- records the preempting job and when the preemption was decided (the reconciler then stops it
-- on its worker with the preemption's grace, and ends it as stopped, 'preempted', once the
-- worker acknowledged); a job records when it was last preempted (the cooldown).
ALTER TABLE assignments ADD COLUMN IF NOT EXISTS preempted_by bigint;
ALTER TABLE assignments ADD COLUMN IF NOT EXISTS preempt_requested_at timestamptz;
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS preempted_at timestamptz;
CREATE INDEX IF NOT EXISTS assignments_preempt_requested
    ON assignments (id) WHERE state = 'active' AND preempt_requested_at IS NOT NULL;
