"""The scheduler's reads (:mod:`actors.scheduler`); its writes are the ledger's
(``FIRE_SCHEDULE_SLOTS``)."""

from __future__ import annotations

# The database's time, and every schedule that is not paused, by id, with its cursor and, for
# the policies forbid and replace, which of the last 10 (actors.scheduler.OPEN_JOBS_LOOKED_AT) jobs it fired
# have not ended (those policies keep at most one open, and a replaced one until its worker
# acknowledges the cancel).
ACTIVE_SCHEDULES = """
SELECT now() AS now, s.id, s.name, s.cron, s.tz, s.concurrency_policy, s.starting_deadline_s,
       s.slots_through,
       CASE WHEN s.concurrency_policy = 'allow' THEN '{}'::bigint[] ELSE
       coalesce((SELECT array_agg(j.id ORDER BY j.id)
                   FROM (SELECT job_id FROM schedule_slots
                          WHERE schedule_id = s.id AND job_id IS NOT NULL
                          ORDER BY slot_at DESC LIMIT 10) o
                   JOIN jobs j ON j.id = o.job_id
                  WHERE j.state IN ('waiting', 'pending', 'assigned', 'running')), '{}') END AS open_job_ids
  FROM schedules s
 WHERE NOT s.paused
 ORDER BY s.id
"""

# The database's time alone (no schedule yet).
DATABASE_NOW = "SELECT now()"
