"""The fenced writes the ledger runs (:mod:`actors.ledger`): the fence, placements, dead
workers, the ends of assignments and the requeues that follow.
"""

from __future__ import annotations

# The fence: same transaction as the writes. A takeover's UPDATE of this row (it changes the
# epoch, a key: schema.sql, lease_epoch_key) waits until the transaction holding the key-share
# lock commits or aborts; the leader's renewal (it changes only expires_at) does not.
FENCE_EPOCH = "SELECT epoch FROM lease WHERE id = 1 FOR KEY SHARE"

GANG_PORT_FIRST = 42000
"""The first port of the range the leader gives gang tasks on every host (docs/gangs.md)."""
GANG_PORT_COUNT = 1000
"""How many ports the range holds: most gang tasks active on one host at once."""

# A gang task's seat in its gang (docs/gangs.md), for a LATERAL join on its job ``j``: the gang's
# id, size, the task's rank and its active assignment's port, and every task's host:port by rank
# (the host of its worker's address) for the gang's newest attempt.
HOST_OF = r"regexp_replace({address}, ':[0-9]+$', '')"
"""A worker's host from its address (``host:port``, ``[v6]:port``), in SQL: a gang's peers are
named by it, and its ports are chosen per host, not per worker, so that tasks on workers sharing a
host (a fleet, a local cluster) get different ports and can all listen (docs/gangs.md)."""

GANG_SEAT = f"""
SELECT j.gang_id, j.gang_rank, g.size AS gang_size,
       (SELECT a.gang_port FROM assignments a WHERE a.job_id = j.id AND a.state = 'active') AS gang_port,
       (SELECT array_agg({HOST_OF.format(address="w.address")} || ':' || a.gang_port
                         ORDER BY t.gang_rank)
          FROM jobs t
          JOIN assignments a ON a.job_id = t.id AND a.gang_attempt = g.attempts
          JOIN workers w ON w.id = a.worker_id
         WHERE t.gang_id = g.id AND a.state = 'active') AS gang_peers
  FROM gangs g WHERE g.id = j.gang_id
"""

# One round's placements as one fenced statement: the fence, the claim, the assignments and
# the pending reasons commit together in one round trip (the statement is its own transaction).
# $1 job ids, $2 worker ids, $3 incarnations, $4 epoch, $5 fenced (always true but in the
# test-only negative control), $6 job ids and $7 reasons to store on jobs left pending, and the
# device units the placements hold (docs/devices.md), one row per unit: $8 job ids, $9 resource
# names, $10 unit ids. A unit goes in only with its job's assignment (``claimed``); the unique
# index assignment_units_one_active_holder refuses, and rolls the whole statement back, a unit
# another active assignment holds (the placer chose free ones: a backstop, as
# assignments_one_active_per_job).
#
# A gang's tasks (docs/gangs.md) are claimed all or none: ``gang_rows`` locks their live gangs and
# then ``gang_tasks`` their tasks (FOR UPDATE, in that order, as schema.sql's gang_runs_ended
# takes them), so that what ``gang_whole`` finds (every task of the gang among the placements,
# pending, on an open worker, with a free port) still holds when ``claimed`` claims them. Each
# task gets the lowest port of the gang port range (GANG_PORT_FIRST, GANG_PORT_COUNT) free on its
# worker's host (no active assignment on a worker of that host holds it: HOST_OF; ports of one
# statement by task id), and every assignment of the gang the gang's new attempt. The ports in use
# are gathered per host once (``ports_in_use``, only when the statement places a gang): per task,
# joined to every worker, they took 290 of a 331 ms statement with 128 gang tasks running on 100
# workers, past the ledger's statement timeout. A task's port is the k-th free one among the
# first (ports in use + k) of the range, which hold at least k free ones (a sort of the whole
# range took 1.1 ms a task). ``gang_whole``, which modifies data, runs in every commit, gangs
# placed or not: ``gang_rows`` therefore starts from the placements' jobs, not from the gangs
# (a semi join from every live gang cost each round's commit about 1 ms per 100 gangs waiting).
#
# The share lock on the lease row is taken before any row is written: every written row comes
# from ``p`` or ``r``, which read ``allowed``, which reads ``fence``. Under READ COMMITTED a
# FOR KEY SHARE read of a row a takeover changed after this statement's snapshot returns the newest
# version, so a replaced leader sees the newer epoch and writes nothing; a takeover that comes
# later waits for the share lock until this statement commits. Claims only jobs still pending
# (invariant 3) on workers still alive in that incarnation, not cordoned (drain and cordon:
# a cordon recorded after the round's read), not marked unhealthy unless their probe is due
# (schema.sql, worker health: a mark the leader wrote after the round's read) and not held for
# a planned restart (schema.sql, workers.hold_until).
#
# A worker's future is ordered against placements by its row (docs/design.md, "How decisions
# are fenced"): ``open_workers`` locks the placements' workers FOR KEY SHARE, in id order (no
# deadlock between two statements that each lock several), against the FOR UPDATE every promise
# about a worker takes first (queries.ingest_workers.LOCK_WORKER), and never waits for a heartbeat.
# Returns one row with ``epoch_seen`` and no assignment when nothing was placed, else one row per
# assignment created: small rows only (a command's argv, up to 64 KiB, is read by JOB_ARGVS after
# the commit), so the server never holds the share lock while it waits to hand a large result to
# a client that froze.
#
# Linear in the placements, as every fenced write must be (it holds the share lock throughout):
# ``claimed`` draws each assignment's id itself, so the result needs no join of ``created`` with
# ``claimed``. A CTE has no index and, planned generically, such a join is a nested loop: with
# 2,000 placements it took 350 of the statement's 384 ms. The reasons skip placed jobs with a
# hashed ``NOT IN`` (``<> ALL`` compared every reason with every placement).
COMMIT_PLACEMENTS = f"""
WITH fence AS (
    SELECT epoch FROM lease WHERE id = 1 FOR KEY SHARE
),
allowed AS (
    SELECT epoch FROM fence WHERE epoch = $4 OR NOT $5::boolean
),
p AS (
    SELECT p.*
      FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS p(job_id, worker_id, incarnation), allowed
),
open_workers AS (
    SELECT w.id, w.incarnation FROM workers w
     WHERE w.id IN (SELECT worker_id FROM p)
       AND w.state = 'alive' AND w.cordoned_at IS NULL
       AND (w.unhealthy_at IS NULL OR w.unhealthy_probe_at <= now())
       AND (w.hold_until IS NULL OR w.hold_until <= now())
     ORDER BY w.id
       FOR KEY SHARE OF w
),
gang_rows AS (
    SELECT g.id, g.size
      FROM (SELECT DISTINCT j.gang_id FROM p JOIN jobs j ON j.id = p.job_id
             WHERE j.gang_id IS NOT NULL) placed
      JOIN gangs g ON g.id = placed.gang_id
     WHERE g.state = 'live'
     ORDER BY g.id
       FOR UPDATE OF g
),
gang_tasks AS (
    SELECT j.id, j.gang_id, j.state FROM jobs j
     WHERE j.gang_id IN (SELECT id FROM gang_rows) AND j.id IN (SELECT job_id FROM p)
     ORDER BY j.id
       FOR UPDATE OF j
),
gang_hosts AS (
    SELECT t.id, t.gang_id, t.state, p.worker_id, p.incarnation, {HOST_OF.format(address="w.address")} AS host
      FROM gang_tasks t JOIN p ON p.job_id = t.id
      JOIN workers w ON w.id = p.worker_id
),
ports_in_use AS (
    SELECT {HOST_OF.format(address="o.address")} AS host, array_agg(a.gang_port) AS used
      FROM assignments a JOIN workers o ON o.id = a.worker_id
     WHERE a.state = 'active' AND a.gang_port IS NOT NULL
       AND EXISTS (SELECT FROM gang_tasks)
     GROUP BY 1
),
gang_ported AS (
    SELECT r.*,
           (SELECT port
              FROM generate_series({GANG_PORT_FIRST},
                                   least({GANG_PORT_FIRST + GANG_PORT_COUNT - 1},
                                         {GANG_PORT_FIRST} + cardinality(r.used) + r.k - 1)) AS port
             WHERE port <> ALL (r.used)
             ORDER BY port OFFSET r.k - 1 LIMIT 1) AS port
      FROM (SELECT g.*, row_number() OVER (PARTITION BY g.host ORDER BY g.id) AS k,
                   coalesce(u.used, '{{}}') AS used
              FROM gang_hosts g LEFT JOIN ports_in_use u ON u.host = g.host) r
),
gang_whole AS (
    UPDATE gangs g SET attempts = g.attempts + 1
      FROM (SELECT r.gang_id FROM gang_ported r
              JOIN gang_rows gr ON gr.id = r.gang_id
              LEFT JOIN open_workers w ON w.id = r.worker_id AND w.incarnation = r.incarnation
             GROUP BY r.gang_id, gr.size
            HAVING count(*) = gr.size
               AND bool_and(r.state = 'pending' AND w.id IS NOT NULL AND r.port IS NOT NULL)) whole
     WHERE g.id = whole.gang_id AND g.state = 'live'
 RETURNING g.id, g.attempts
),
claimed AS (
    UPDATE jobs j
       SET state = 'assigned', reason = '', attempts = j.attempts + 1
      FROM p JOIN open_workers w ON w.id = p.worker_id AND w.incarnation = p.incarnation
     WHERE j.id = p.job_id AND (j.state = 'pending' OR NOT $5::boolean)
       AND (j.gang_id IS NULL OR j.gang_id IN (SELECT id FROM gang_whole))
 RETURNING nextval('assignments_id_seq') AS assignment_id, j.id, p.worker_id, p.incarnation,
           j.cpu_millis, j.memory_mb, j.name, j.priority, j.runtime, j.sleep_ms,
           j.attempts > 1 AS placed_before,
           (j.argv IS NOT NULL OR j.timeout_ms IS NOT NULL OR j.env <> '{{}}'::jsonb OR j.workdir <> ''
            OR j.array_index IS NOT NULL OR j.gang_id IS NOT NULL) AS has_payload,
           j.gang_id
),
created AS (
    INSERT INTO assignments (id, job_id, worker_id, worker_incarnation, cpu_millis, memory_mb, epoch,
                             gang_attempt, gang_port)
    SELECT c.assignment_id, c.id, c.worker_id, c.incarnation, c.cpu_millis, c.memory_mb, $4,
           CASE WHEN c.gang_id IS NOT NULL
                THEN (SELECT g.attempts FROM gang_whole g WHERE g.id = c.gang_id) END,
           CASE WHEN c.gang_id IS NOT NULL THEN (SELECT r.port FROM gang_ported r WHERE r.id = c.id) END
      FROM claimed c
),
held AS (
    INSERT INTO assignment_units (assignment_id, worker_id, resource, unit)
    SELECT c.assignment_id, c.worker_id, u.resource, u.unit
      FROM unnest($8::bigint[], $9::text[], $10::text[]) AS u(job_id, resource, unit)
      JOIN claimed c ON c.id = u.job_id
),
reasons AS (
    -- Only pending jobs carry a reason; never a job this statement places.
    UPDATE jobs j SET reason = r.reason
      FROM unnest($6::bigint[], $7::text[]) AS r(id, reason), allowed
     WHERE j.id = r.id AND j.state = 'pending' AND j.reason IS DISTINCT FROM r.reason
       AND j.id NOT IN (SELECT unnest($1::bigint[]))
)
SELECT fence.epoch AS epoch_seen, claimed.*
  FROM fence LEFT JOIN claimed ON true
"""

# $1 job ids. What a worker needs of a job beyond its size and runtime kind: the commands of
# command and container jobs (and a container's image), the timeout, the environment, the
# working directory, the array task's index and a gang task's seat (GANG_SEAT); read after their
# placement committed.
JOB_ARGVS = (
    """
SELECT j.id, j.argv, j.image, j.timeout_ms, j.env::text AS env, j.workdir, j.array_index, j.array_id,
       s.*
  FROM jobs j
  LEFT JOIN LATERAL ("""
    + GANG_SEAT
    + """) s ON j.gang_id IS NOT NULL
 WHERE j.id = ANY($1::bigint[])
"""
)

# $1 epoch, $2 dead_after_s, $3 worker ids, $4 incarnations, $5 the leader's silence floor
# (unix seconds, database time; NULL for none). Re-judged by database time on heartbeats any
# replica recorded, so a heartbeat that landed after the reconciler's read wins; silence counts
# only from the server's start and from the floor on (DESIGN.md, "Outages"), and not before a
# planned restart's hold ends (schema.sql, workers.hold_until; greatest() skips its NULL).
# The silence allowed is the largest of $2, the dead_after the worker's row records (what it
# was last told and uses) and the dead_after the leader chose since (heartbeat_policy): a worker
# whose heartbeats are not getting through while the cluster stretches its interval is judged
# by the new, longer one (declaring later is always safe; earlier than what it uses never is).
# A death is a promise about the worker's future: ``promised`` locks the rows FOR UPDATE first
# (see COMMIT_PLACEMENTS), so a placement onto one of them commits before it or not at all, and
# END_ORPHANED_ASSIGNMENTS, the transaction's next statement, ends what such a placement made.
# Only workers judged by their silence are declared (the rule of the view judged_workers in
# schema.sql, written out here so that it is re-checked on the row as the UPDATE finds it).
DECLARE_DEAD_WORKERS = """
WITH promised AS (
    SELECT w.id FROM workers w WHERE w.id = ANY($3::text[]) ORDER BY w.id FOR UPDATE OF w
),
dead AS (
    UPDATE workers w SET state = 'dead', dead_at = now(), dead_epoch = $1
      FROM unnest($3::text[], $4::bigint[]) AS c(id, incarnation) JOIN promised USING (id)
           LEFT JOIN heartbeat_policy p ON p.id = 1
     WHERE w.id = c.id AND w.incarnation = c.incarnation
       AND (w.state = 'alive'
            OR (w.state = 'left'
                AND EXISTS (SELECT 1 FROM assignments a
                             WHERE a.worker_id = w.id AND a.state = 'active'
                               AND a.worker_incarnation <> w.incarnation)))
       AND greatest(w.last_heartbeat_at, pg_postmaster_start_time(), to_timestamp($5::float8),
                    w.hold_until)
           < now() - make_interval(secs => greatest($2, coalesce(w.dead_after_ms, 0) / 1000.0,
                                                    coalesce(p.dead_after_ms, 0) / 1000.0))
 RETURNING w.id, w.incarnation, w.last_heartbeat_at
),
logged AS (
    INSERT INTO worker_deaths (worker_id, incarnation, epoch, last_heartbeat_at)
    SELECT id, incarnation, $1, last_heartbeat_at FROM dead
)
SELECT id FROM dead
"""

# Requeues: a job pending again gets a new pending_seq and this transaction's id in pending_xid
# (actors/placer_store.py, PendingMark). After a loss it also waits a backoff (jobs.not_before,
# by database time, so a new leader honours it; its reason says until when, UTC), with the caps
# parameter's first entry as base and last as cap (actors.reconciler.backoff_caps_s; empty: no
# backoff); none after a clean stop. The rule is schema.sql's after_loss.

# $1 epoch, $2 requeue backoff caps (seconds; see Requeues above), $3 most assignments to
# end. Ends active assignments whose worker is dead, has left or has registered again, the $3
# oldest of them, and requeues their jobs (or finishes the cancellation of jobs whose cancel
# was requested). Those of a dead or re-registered worker end as lost, and the job counts one
# more loss and waits a backoff; those of the incarnation that left (its agent stopped every job
# before it said so: queries.LEAVE_WORKER) end as stopped ('worker_left'), and the job is placed
# again at once, not counted as lost. ``more`` is true when $3 were
# found: some may be left for the next batch. The bound keeps the fenced transaction short (see
# actors/ledger.py). An assignment that a heartbeat ended meanwhile is skipped: the UPDATE
# re-checks ``state`` on the row's newest version.
# A registration alone does not end the previous incarnation's assignments: only once the new
# incarnation has heartbeated (docs/design.md, "Orphaned assignments").
END_ORPHANED_ASSIGNMENTS = """
WITH orphaned AS (
    SELECT a.id, CASE WHEN w.state = 'dead' THEN 'worker_dead'
                      WHEN w.state = 'left' AND w.incarnation = a.worker_incarnation THEN 'worker_left'
                      ELSE 'worker_restarted' END AS reason
      FROM assignments a JOIN workers w ON w.id = a.worker_id
     WHERE a.state = 'active'
       AND (w.state = 'dead'
            OR (w.state = 'left' AND w.incarnation = a.worker_incarnation)
            OR (w.incarnation <> a.worker_incarnation AND w.last_heartbeat_at > w.registered_at))
     ORDER BY a.id
     LIMIT $3
),
ended AS (
    UPDATE assignments a
       SET state = CASE WHEN o.reason = 'worker_left' THEN 'stopped' ELSE 'lost' END,
           ended_at = now(), ended_epoch = $1, end_reason = o.reason,
           counted = o.reason <> 'worker_left'
                     AND (SELECT count_lost FROM jobs WHERE jobs.id = a.job_id)
      FROM orphaned o
     WHERE a.id = o.id AND a.state = 'active'
 RETURNING a.id, a.job_id, a.worker_id, a.end_reason, a.counted
),
requeued AS (
    UPDATE jobs j
       SET (state, losses, failures, started_at, finished_at, pending_seq, pending_xid, not_before, reason,
            detail)
             = (SELECT * FROM after_loss(j, e.end_reason, e.end_reason <> 'worker_left', e.counted,
                                         $2::float8[]))
      FROM ended e
     WHERE j.id = e.job_id AND j.state IN ('assigned', 'running')
 RETURNING j.id, j.state
)
SELECT (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM ended) AS ended_ids,
       (SELECT coalesce(array_agg(job_id ORDER BY id), '{}') FROM ended) AS ended_job_ids,
       (SELECT coalesce(array_agg(worker_id ORDER BY id), '{}') FROM ended) AS ended_worker_ids,
       (SELECT coalesce(array_agg(id), '{}') FROM requeued WHERE state = 'pending') AS requeued_ids,
       (SELECT count(*) FROM orphaned) = $3 AS more
"""

# $1 epoch, $2 assignment ids. The leader's backing of timeouts (actors/reconciler.py): ends
# active assignments whose worker acknowledged a stop the leader sent because the job outlived its
# timeout_s by the margin (their worker did not stop it: an agent of an older version, a reaper
# that failed). As a run that timed out on its worker: the assignment ends (state 'cancelled',
# end_reason 'timeout', counted), the job spends an attempt and is placed again after its
# retry delay, or, with none left (or a cancel asked meanwhile), ends failed (cancelled).
END_TIMED_OUT_ASSIGNMENTS = """
WITH ended AS (
    UPDATE assignments
       SET state = 'cancelled', ended_at = now(), ended_epoch = $1, end_reason = 'timeout',
           counted = true, detail = 'timeout: the leader stopped it, past its timeout_s'
     WHERE id = ANY($2::bigint[]) AND state = 'active'
 RETURNING id, job_id
),
jobs_ended AS (
    UPDATE jobs j
       SET (state, failures, started_at, finished_at, pending_seq, pending_xid, not_before, reason,
            detail)
             = (SELECT * FROM after_run(j, CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'failed' END,
                                        'timeout', NULL,
                                        'timeout: the leader stopped it, past its timeout_s of '
                                        || (j.timeout_ms / 1000.0)::float8 || ' s',
                                        j.started_at, now()))
      FROM ended e
     WHERE j.id = e.job_id AND j.state IN ('assigned', 'running')
)
SELECT id FROM ended
"""

# $1 epoch, $2 assignment ids, $3 end reason, $4 requeue, $5 requeue backoff caps (seconds; see
# Requeues above). Only for assignments whose worker acknowledged the cancel: the job runs
# nowhere now. A requeue (an unconfirmed assignment withdrawn) counts as a loss of the job.
END_CANCELLED_ASSIGNMENTS = """
WITH ended AS (
    UPDATE assignments
       SET state = 'cancelled', ended_at = now(), ended_epoch = $1, end_reason = $3
     WHERE id = ANY($2::bigint[]) AND state = 'active'
 RETURNING id, job_id, end_reason
),
jobs_ended AS (
    UPDATE jobs j
       SET (state, losses, failures, started_at, finished_at, pending_seq, pending_xid, not_before, reason,
            detail)
             = (SELECT * FROM after_loss(j, e.end_reason, $4, false, $5::float8[]))
      FROM ended e
     WHERE j.id = e.job_id AND j.state IN ('assigned', 'running')
)
SELECT id FROM ended
"""

# $1 epoch, $2 assignment ids. The end of a drain's deadline (actors/reconciler.py): only for
# assignments whose worker acknowledged the stop (invariant 6). They end as stopped ('drained'), as
# a clean leave's do, and their jobs go to schema.sql's requeue_unspent.
END_DRAINED_ASSIGNMENTS = """
WITH ended AS (
    UPDATE assignments
       SET state = 'stopped', ended_at = now(), ended_epoch = $1, end_reason = 'drained'
     WHERE id = ANY($2::bigint[]) AND state = 'active'
 RETURNING id, job_id
),
requeued AS (SELECT requeue_unspent(array_agg(job_id)) FROM ended)
SELECT e.id FROM ended e, requeued
"""

# $1 assignment ids, $2 the preempting job of each, $3 preempt_cooldown_s. The leader's
# preemptions (actors/placer.py, actors/preemption.py; docs/preemption.md), each rule re-checked
# on the rows as this transaction finds them: only an assignment still active and not marked
# already (or whose mark lapsed: its preempting job is no longer pending), whose job has no
# cancel asked and was not preempted within the cooldown (database time). Marks it (the
# reconciler stops it: queries.PREEMPT_DUE_ASSIGNMENTS) and dates its job's preemption. Returns
# the ids marked.
PREEMPT_ASSIGNMENTS = """
WITH marked AS (
    UPDATE assignments a
       SET preempted_by = p.by, preempt_requested_at = now()
      FROM unnest($1::bigint[], $2::bigint[]) AS p(id, by), jobs j
     WHERE a.id = p.id AND a.state = 'active'
       AND (a.preempt_requested_at IS NULL
            OR NOT EXISTS (SELECT 1 FROM jobs q WHERE q.id = a.preempted_by AND q.state = 'pending'))
       AND j.id = a.job_id AND NOT j.cancel_requested
       AND (j.preempted_at IS NULL OR j.preempted_at <= now() - make_interval(secs => $3::float8))
 RETURNING a.id, a.job_id
),
dated AS (
    UPDATE jobs j SET preempted_at = now() FROM marked m WHERE j.id = m.job_id
)
SELECT id FROM marked
"""

# $1 epoch, $2 assignment ids. The end of a preemption (actors/reconciler.py): only for
# assignments marked to be preempted whose worker acknowledged the stop (invariant 6); one that
# ended on its own during the grace is no longer active, and its outcome stands. They end as
# stopped ('preempted', its detail naming the preempting job, which the job's events show after
# the placer cleared the job's pending reason; a gang's stop, preempted_by NULL, as 'gang_stopped':
# schema.sql, gang_runs_ended), and their jobs go to schema.sql's
# requeue_unspent: no attempt spent, no loss, no backoff. Returns each one ended, its job, the
# preempting job and whether the job was requeued (PREEMPTED_REASONS then says why, in a
# statement of its own: requeue_unspent's update is a later command than this statement's
# snapshot).
END_PREEMPTED_ASSIGNMENTS = """
WITH ended AS (
    UPDATE assignments
       SET state = 'stopped', ended_at = now(), ended_epoch = $1,
           end_reason = CASE WHEN preempted_by IS NULL THEN 'gang_stopped' ELSE 'preempted' END,
           detail = CASE WHEN preempted_by IS NULL
                         THEN 'gang_stopped: another task of its gang attempt ended'
                         ELSE 'preempted by job ' || preempted_by END
     WHERE id = ANY($2::bigint[]) AND state = 'active' AND preempt_requested_at IS NOT NULL
 RETURNING id, job_id, preempted_by
),
requeued AS (SELECT requeue_unspent(array_agg(job_id)) AS ids FROM ended)
SELECT e.id, e.job_id, e.preempted_by, e.job_id = ANY(r.ids) AS requeued
  FROM ended e, requeued r
 ORDER BY e.id
"""

# $1 job ids, $2 their pending reasons. The reason of jobs a preemption put back to pending
# (END_PREEMPTED_ASSIGNMENTS), in the same fenced transaction.
PREEMPTED_REASONS = """
UPDATE jobs j SET reason = r.reason
  FROM unnest($1::bigint[], $2::text[]) AS r(id, reason)
 WHERE j.id = r.id AND j.state = 'pending'
"""

# $1 worker ids, $2 the health_version each was judged at, $3 whether to mark it unhealthy (true)
# or clear its mark (false), $4 the reasons of marks, $5 health_probe_after_s (0: no probe).
# The leader's judgement of worker health (actors/health.py), each change applied only if the
# worker's health_version is still the one judged (an operator's uncordon meanwhile bumped it:
# the operator wins, and the next judgement starts from the runs after it). A mark sets when
# (a renewal keeps when it was first marked) and why, and when a probe may be placed; a clear
# forgets the runs judged so far (health_since). Returns the ids changed and, in parallel,
# whether each is now unhealthy.
RECORD_WORKER_HEALTH = """
UPDATE workers w
   SET unhealthy_at = CASE WHEN c.unhealthy THEN coalesce(w.unhealthy_at, now()) END,
       unhealthy_marked_at = CASE WHEN c.unhealthy THEN now() END,
       unhealthy_reason = CASE WHEN c.unhealthy THEN c.reason ELSE '' END,
       unhealthy_probe_at = CASE WHEN c.unhealthy AND $5::float8 > 0
                                 THEN now() + make_interval(secs => $5::float8) END,
       health_since = CASE WHEN c.unhealthy THEN w.health_since ELSE now() END,
       health_version = w.health_version + 1
  FROM unnest($1::text[], $2::bigint[], $3::boolean[], $4::text[]) AS c(id, version, unhealthy, reason)
 WHERE w.id = c.id AND w.health_version = c.version
RETURNING w.id, c.unhealthy
"""

# $1 holder, $2 epoch, $3 epoch_seen, $4 what. Written after a refused fenced write.
RECORD_STALE_WRITE = """
INSERT INTO stale_writes (holder, epoch, epoch_seen, what) VALUES ($1, $2, $3, $4)
"""

# $1 job ids to make pending, $2 job ids to cancel, $3 the failed dependency of each of $2.
# Waiting jobs settled by the leader (actors/dependencies.py), each rule re-checked on the rows
# as this transaction finds them (a waiting job cancelled by its user meanwhile is left alone:
# the UPDATE re-checks its state on the newest row version): a job is made pending only if
# every dependency succeeded and, for a task of an array with a limit, the array's tasks
# pending, assigned or running, with those released before it here, stay within the limit; a
# job is cancelled only if the dependency named failed or was cancelled. A released job gets a
# new pending_seq and this transaction's id, as every requeue, so the placer's incremental read
# sees it. Returns one row: the ids released and the ids cancelled.
SETTLE_WAITING_JOBS = """
WITH ready AS (
    SELECT j.id, j.array_id, coalesce(j.array_max_running, 0) AS limit_,
           row_number() OVER (PARTITION BY j.array_id ORDER BY j.array_index, j.id) AS k
      FROM jobs j
     WHERE j.id = ANY($1::bigint[]) AND j.state = 'waiting'
       AND NOT EXISTS (SELECT 1 FROM dependency_states(j.after_ids) s WHERE s.state <> 'succeeded')
),
room AS (
    SELECT r.id
      FROM ready r
     WHERE r.limit_ = 0 OR r.array_id IS NULL
        OR r.k + (SELECT count(*) FROM jobs t
                   WHERE t.array_id = r.array_id AND t.state IN ('pending', 'assigned', 'running'))
           <= r.limit_
),
released AS (
    UPDATE jobs j
       SET state = 'pending', reason = '', pending_seq = nextval('pending_seq'),
           pending_xid = pg_current_xact_id()::text::bigint
      FROM room
     WHERE j.id = room.id AND j.state = 'waiting'
 RETURNING j.id
),
cancelled AS (
    UPDATE jobs j
       SET state = 'cancelled', finished_at = now(),
           reason = 'dependency_failed: job ' || c.dep, detail = 'dependency_failed: job ' || c.dep
      FROM unnest($2::bigint[], $3::bigint[]) AS c(id, dep)
     WHERE j.id = c.id AND j.state = 'waiting' AND c.dep = ANY(j.after_ids)
       AND EXISTS (SELECT 1 FROM dependency_states(j.after_ids) s
                    WHERE s.dep = c.dep AND s.state IN ('failed', 'cancelled'))
 RETURNING j.id
)
SELECT (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM released) AS released_ids,
       (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM cancelled) AS cancelled_ids
"""

# $1 epoch, $2 interval_ms, $3 dead_after_ms, $4 workers, $5 cpu per heartbeat (µs, NULL: not
# measured), $6 reason. The leader's choice of the heartbeat interval (actors/heartbeat_policy.py),
# told to the workers from the next registration or heartbeat on.
SET_HEARTBEAT_POLICY = """
INSERT INTO heartbeat_policy (id, interval_ms, dead_after_ms, workers, cpu_per_heartbeat_us, reason, epoch)
VALUES (1, $2, $3, $4, $5, $6, $1)
ON CONFLICT (id) DO UPDATE
   SET interval_ms = EXCLUDED.interval_ms, dead_after_ms = EXCLUDED.dead_after_ms,
       workers = EXCLUDED.workers, cpu_per_heartbeat_us = EXCLUDED.cpu_per_heartbeat_us,
       reason = EXCLUDED.reason, epoch = EXCLUDED.epoch, decided_at = now()
"""

# $1 schedule id, $2 its slots_through as the scheduler read it, $3 the slots decided (oldest
# first), $4 whether each fires, $5 each skipped one's reason, $6 the epoch, $7 jobs to cancel
# (concurrency policy replace). One schedule's slots (docs/schedules.md), each recorded once in
# schedule_slots (its primary key the backstop, the fence the rule): a fired one with the job
# inserted for it from the schedule's template, owned by the schedule's owner, in this same
# statement. Nothing when the schedule is gone, paused or its cursor moved since the read (a
# resume); else the cursor moves to the last slot. The cancel marks a job as queries.CANCEL_JOB
# does (pending or waiting: cancelled now; assigned or running: cancel_requested, which the
# reconciler carries out on its worker). Answer: one row per slot recorded, slot_at and job_id
# (NULL: skipped). A replaced job's detail (and, cancelled at once, its reason) says so:
# ``replaced by schedule NAME's slot 2026-12-05T22:00:00Z``.
FIRE_SCHEDULE_SLOTS = """
WITH s AS (
    SELECT id, name, job, owner FROM schedules
     WHERE id = $1::bigint AND slots_through = $2::timestamptz AND NOT paused
       FOR NO KEY UPDATE
),
slots AS (
    SELECT t.slot_at, t.fire, t.reason
      FROM unnest($3::timestamptz[], $4::boolean[], $5::text[]) AS t(slot_at, fire, reason)
     WHERE EXISTS (SELECT FROM s)
),
fired AS MATERIALIZED (
    SELECT slot_at, nextval('jobs_id_seq') AS job_id FROM slots WHERE fire
),
inserted AS (
    INSERT INTO jobs (id, name, cpu_millis, memory_mb, priority, runtime, sleep_ms, argv, image,
                      max_attempts, retry_backoff_ms, count_lost, timeout_ms, constraints, env,
                      workdir, retry_on_exit, no_retry_on, resources, owner)
    SELECT f.job_id, j.name, j.cpu_millis, j.memory_mb, j.priority, j.runtime, j.sleep_ms, j.argv,
           j.image, j.max_attempts, j.retry_backoff_ms, j.count_lost, j.timeout_ms,
           coalesce(j.constraints, '[]'), coalesce(j.env, '{}'), coalesce(j.workdir, ''),
           coalesce(j.retry_on_exit, '{}'), coalesce(j.no_retry_on, '{}'),
           coalesce(j.resources, '{}'), s.owner
      FROM fired f, s,
           jsonb_to_record(s.job) AS j(name text, cpu_millis integer, memory_mb integer,
                                       priority integer, runtime text, sleep_ms bigint,
                                       argv text[], image text, max_attempts integer,
                                       retry_backoff_ms bigint, count_lost boolean,
                                       timeout_ms bigint, constraints jsonb, env jsonb,
                                       workdir text, retry_on_exit integer[], no_retry_on text[],
                                       resources jsonb)
     ORDER BY f.slot_at
 RETURNING id
),
recorded AS (
    INSERT INTO schedule_slots (schedule_id, slot_at, outcome, reason, job_id, epoch)
    SELECT $1::bigint, t.slot_at, CASE WHEN t.fire THEN 'fired' ELSE 'skipped' END, t.reason,
           f.job_id, $6::bigint
      FROM slots t LEFT JOIN fired f ON f.slot_at = t.slot_at
 RETURNING slot_at, job_id
),
moved AS (
    UPDATE schedules SET slots_through = (SELECT max(slot_at) FROM slots)
     WHERE id = $1::bigint AND EXISTS (SELECT FROM slots)
),
replaced_by AS (
    -- what the replace cancel says: the schedule and its newest slot fired (else recorded)
    SELECT 'replaced by schedule ' || s.name || '''s slot '
           || to_char(coalesce((SELECT max(slot_at) FROM fired), (SELECT max(slot_at) FROM slots))
                      AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS words
      FROM s
),
cancelled AS (
    UPDATE jobs j
       SET cancel_requested = j.state IN ('assigned', 'running'),
           cancel_requested_at = coalesce(j.cancel_requested_at, now()),
           reason = CASE WHEN j.state IN ('pending', 'waiting') THEN b.words ELSE j.reason END,
           detail = b.words,
           state = CASE WHEN j.state IN ('pending', 'waiting') THEN 'cancelled' ELSE j.state END,
           finished_at = CASE WHEN j.state IN ('pending', 'waiting') THEN now() ELSE j.finished_at END
      FROM replaced_by b
     WHERE j.id = ANY($7::bigint[]) AND EXISTS (SELECT FROM slots)
       AND j.state IN ('waiting', 'pending', 'assigned', 'running')
)
SELECT r.slot_at, r.job_id, (SELECT count(*) FROM inserted) AS inserted FROM recorded r ORDER BY r.slot_at
"""
