"""The reconciler's reads (:mod:`actors.reconciler`): heartbeat ages, unconfirmed and
cancel-requested assignments.
"""

from __future__ import annotations

from actors.queries.ledger import JUDGED_WORKERS

# Alive workers and how long ago (database time) their last heartbeat was recorded.
HEARTBEAT_AGES = f"""
SELECT w.id, w.incarnation, extract(epoch FROM now() - w.last_heartbeat_at)::float8 AS age_s
  FROM workers w WHERE {JUDGED_WORKERS}
"""

_ASSIGNMENT_PAYLOAD = """
SELECT a.id AS assignment_id, a.job_id, a.worker_id, a.worker_incarnation AS incarnation,
       a.epoch, w.address, j.name, j.cpu_millis, j.memory_mb, j.priority, j.runtime, j.sleep_ms, j.argv,
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
