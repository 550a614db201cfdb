"""The reconciler's reads (:mod:`actors.reconciler`): heartbeat ages, unconfirmed and
cancel-requested assignments, and those of drains whose deadline has passed.
"""

from __future__ import annotations

from actors.queries.ledger import JUDGED_WORKERS

# The database's time, and every judged worker with the time (database time) since its last
# recorded heartbeat or, when later, since the server started (pg_postmaster_start_time(): a
# restart is an outage, and no worker could heartbeat through it); one row with a NULL id when
# there is no worker.
HEARTBEAT_AGES = f"""
SELECT n.now_unix_s, w.id, w.incarnation,
       extract(epoch FROM n.now - greatest(w.last_heartbeat_at, pg_postmaster_start_time()))::float8
           AS age_s
  FROM (SELECT now() AS now, extract(epoch FROM now())::float8 AS now_unix_s) n
  LEFT JOIN workers w ON {JUDGED_WORKERS}
"""

_ASSIGNMENT_PAYLOAD = """
SELECT a.id AS assignment_id, a.job_id, a.worker_id, a.worker_incarnation AS incarnation,
       a.epoch, w.address, j.name, j.cpu_millis, j.memory_mb, j.priority, j.runtime, j.sleep_ms, j.argv,
       j.image,
       extract(epoch FROM now() - a.created_at)::float8 AS age_s
  FROM assignments a
  JOIN workers w ON w.id = a.worker_id
  JOIN jobs j ON j.id = a.job_id
"""

# Active assignments no heartbeat has confirmed, on live workers of the right incarnation.
UNCONFIRMED_ASSIGNMENTS = (
    _ASSIGNMENT_PAYLOAD
    + """
 WHERE a.state = 'active' AND a.confirmed_at IS NULL
   AND w.state = 'alive' AND w.incarnation = a.worker_incarnation
 ORDER BY a.id
"""
)

# Active assignments of jobs a user asked to cancel.
CANCEL_REQUESTED_ASSIGNMENTS = (
    _ASSIGNMENT_PAYLOAD
    + """
 WHERE a.state = 'active' AND j.cancel_requested
   AND w.state = 'alive' AND w.incarnation = a.worker_incarnation
 ORDER BY a.id
"""
)

# Active assignments on live workers of the right incarnation whose drain deadline has passed
# (database time; schema.sql, workers.drain_deadline_at): stopped on their worker, then ended
# and requeued (queries.END_DRAINED_ASSIGNMENTS). Jobs a user asked to cancel are left to
# CANCEL_REQUESTED_ASSIGNMENTS.
DRAIN_DUE_ASSIGNMENTS = (
    _ASSIGNMENT_PAYLOAD
    + """
 WHERE a.state = 'active' AND NOT j.cancel_requested
   AND w.state = 'alive' AND w.incarnation = a.worker_incarnation
   AND w.drain_deadline_at <= now()
 ORDER BY a.id
"""
)
