"""The ingest's unfenced statements of operators' calls on workers (cordon, uncordon, drain) and on
schedules (docs/schedules.md), each answered once per idempotency key.
"""

from __future__ import annotations

from actors.queries.idempotent import once

# ---------------------------------------------------------------- drain and cordon (unfenced)

# What a cordon, uncordon or drain answers (the rows stored as its idempotent answer): the
# worker's schedule columns after the request, and the jobs active on it then.
_WORKER_SCHEDULE = """
RETURNING id, cordoned_at IS NOT NULL AS cordoned, drain_requested_at IS NOT NULL AS drain_requested,
          extract(epoch FROM drain_deadline_at)::float8 AS drain_deadline_unix_s,
          unhealthy_at IS NOT NULL AS unhealthy, unhealthy_reason,
          (SELECT coalesce(array_agg(a.job_id ORDER BY a.job_id), '{}') FROM assignments a
            WHERE a.worker_id = workers.id AND a.state = 'active') AS job_ids
"""

# The worker $1 as the call found it, for a cordon's and an uncordon's ``changed`` (see once):
# locked (a concurrent call's change is seen, not missed) before the update, which names it so
# that it runs first (run after, FOR UPDATE would pass over the row this statement changed).
_WORKER_BEFORE = """before AS (
    SELECT cordoned_at, drain_requested_at, unhealthy_at FROM workers
     WHERE id = $1::text AND EXISTS (SELECT FROM fresh)
       FOR UPDATE
),"""

# $1 worker id; then the audit's, the idempotency key and the request's sha256 (see once). No new
# placement on the worker from now on (schema.sql, workers.cordoned_at); a cordon already there is
# kept with its time. Answer rows: _WORKER_SCHEDULE (none: no such worker).
CORDON_WORKER = once(
    "cordon_worker",
    """
UPDATE workers SET cordoned_at = coalesce(cordoned_at, now())
 WHERE id = $1::text AND EXISTS (SELECT FROM before)
"""
    + _WORKER_SCHEDULE,
    params=1,
    action="cordon",
    steps=_WORKER_BEFORE,
    changed="EXISTS (SELECT FROM before WHERE cordoned_at IS NULL)",
)

# $1 worker id; then the audit's, the key and the sha256. Ends the cordon and any drain (jobs a
# drain already stopped stay requeued), and clears a mark of the worker as unhealthy (schema.sql,
# worker health): its runs until now are not judged again, and the leader's judgement of the
# version before is not written (health_version). Answer rows: _WORKER_SCHEDULE (none: no such
# worker).
UNCORDON_WORKER = once(
    "uncordon_worker",
    """
UPDATE workers SET cordoned_at = NULL, drain_requested_at = NULL, drain_deadline_at = NULL,
                   health_since = CASE WHEN unhealthy_at IS NULL THEN health_since ELSE now() END,
                   health_version = health_version + (unhealthy_at IS NOT NULL)::int,
                   unhealthy_at = NULL, unhealthy_marked_at = NULL, unhealthy_reason = '',
                   unhealthy_probe_at = NULL
 WHERE id = $1::text AND EXISTS (SELECT FROM before)
"""
    + _WORKER_SCHEDULE,
    params=1,
    action="uncordon",
    steps=_WORKER_BEFORE,
    changed="""EXISTS (SELECT FROM before WHERE cordoned_at IS NOT NULL
                                        OR drain_requested_at IS NOT NULL OR unhealthy_at IS NOT NULL)""",
)

# $1 worker id, $2 deadline (seconds from now, database time; NULL: none); then the audit's, the
# key and the sha256. Cordons the worker and asks for its drain; a new drain replaces the deadline
# of one in progress. Answer rows: _WORKER_SCHEDULE (none: no such worker).
DRAIN_WORKER = once(
    "drain_worker",
    """
UPDATE workers
   SET cordoned_at = coalesce(cordoned_at, now()),
       drain_requested_at = coalesce(drain_requested_at, now()),
       drain_deadline_at = now() + make_interval(secs => $2::float8)
 WHERE id = $1::text AND EXISTS (SELECT FROM fresh)
"""
    + _WORKER_SCHEDULE,
    params=2,
    action="drain",
)

# ---------------------------------------------------------------- schedules (docs/schedules.md)

# $1 name, $2 cron, $3 tz, $4 the job template (JSON: actors/queries/jobs.py, job_template), $5
# concurrency policy, $6 starting_deadline_s, $7 its owner (the caller's account), $8 the job's
# priority when held to the owner's max_priority (NULL: an operator; as SUBMIT_JOB's $22); then
# the audit's, the idempotency key and the request's sha256 (see once). The schedule's cursor
# starts at now(): its first slot is the first after it was added. Answer: one row, id; none
# when a schedule of that name exists (nothing stored). Refused over the owner's max_priority
# (SK002, check_submission).
ADD_SCHEDULE = once(
    "add_schedule",
    """
INSERT INTO schedules (name, cron, tz, job, concurrency_policy, starting_deadline_s, owner)
SELECT $1::text, $2::text, $3::text, $4::jsonb, $5::text, $6::int, $7::text FROM fresh, capped
 WHERE capped.ok
    ON CONFLICT (name) DO NOTHING
RETURNING id
""",
    params=8,
    action="schedule_add",
    steps="""capped AS (SELECT check_submission($7::text, 0, $8::bigint) AS ok FROM fresh),""",
)

# The schedule a pause or resume changes (see PAUSE_SCHEDULE's parameters), locked, and whether
# it was paused before.
_SCHEDULE_TARGET = """target AS (
    SELECT id, paused AS was_paused FROM schedules
     WHERE name = $1::text AND ($2::text IS NULL OR owner = $2::text) AND EXISTS (SELECT FROM fresh)
       FOR NO KEY UPDATE
),"""

# $1 name, $2 the only owner whose schedule it may change (NULL: any; another's is as none);
# then the audit's, the idempotency key and the request's sha256 (see once). Answer: one row,
# id (none: no such schedule). Audited only when it was not paused already.
PAUSE_SCHEDULE = once(
    "pause_schedule",
    """
UPDATE schedules s SET paused = true FROM target t WHERE s.id = t.id RETURNING s.id
""",
    params=2,
    action="schedule_pause",
    changed="EXISTS (SELECT FROM target WHERE NOT was_paused)",
    steps=_SCHEDULE_TARGET,
)

# As PAUSE_SCHEDULE, resuming: a paused schedule's cursor moves to now(), so the slots of its
# pause are none of its slots (none fires late, none is recorded). Audited only when it was paused.
RESUME_SCHEDULE = once(
    "resume_schedule",
    """
UPDATE schedules s
   SET paused = false,
       slots_through = CASE WHEN t.was_paused THEN greatest(s.slots_through, now()) ELSE s.slots_through END
  FROM target t WHERE s.id = t.id RETURNING s.id
""",
    params=2,
    action="schedule_resume",
    changed="EXISTS (SELECT FROM target WHERE was_paused)",
    steps=_SCHEDULE_TARGET,
)

# As PAUSE_SCHEDULE, removing the schedule and its slots' records (the jobs it fired stay).
# Answer: one row, the schedule as it was (id, name, cron, tz, job, concurrency_policy,
# starting_deadline_s, paused, owner, and its slots fired and skipped, read in the statement's
# snapshot, before the records go with it).
REMOVE_SCHEDULE = once(
    "remove_schedule",
    """
DELETE FROM schedules s
 WHERE name = $1::text AND ($2::text IS NULL OR owner = $2::text) AND EXISTS (SELECT FROM fresh)
RETURNING id, name, cron, tz, job, concurrency_policy, starting_deadline_s, paused, owner,
          (SELECT count(*) FROM schedule_slots WHERE schedule_id = s.id AND outcome = 'fired') AS fired,
          (SELECT count(*) FROM schedule_slots WHERE schedule_id = s.id AND outcome = 'skipped') AS skipped
""",
    params=2,
    action="schedule_remove",
)
