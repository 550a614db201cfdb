"""The statements of the workers' own calls to the ingest (unfenced): registration, heartbeats
and their outcomes, restart holds, leaving (actors/ingest_workers.py, actors/ingest_heartbeats.py).
"""

from __future__ import annotations

# ---------------------------------------------------------------- workers (unfenced writes)

# $1 id, $2 address, $3 cpu_millis, $4 memory_mb, $5 labels (json text), $6 agent run id, $7
# registration number within that run, $8 the registration's sha256 (actors/idempotency.py), $9
# the devices it offers (JSON {name: [unit, ...]}; docs/devices.md).
# A registration is a new incarnation, alive, with a fresh heartbeat, and a send window that
# starts again (nothing is addressed to the new incarnation yet: see schema.sql), unless it is
# a copy of one already applied or older than the latest of its agent run (same run id, a
# number not above the stored one): then the row stays as it is and nothing is returned (see
# WORKER_REGISTRATION). Late and hedged copies of one registration thus never start another
# incarnation under an agent that runs jobs under the first. A registration of another run
# (the agent restarted) is always new. (Worker id, run id, number) is the registration's
# idempotency key, kept in the worker's row until the next registration replaces it.
REGISTER_WORKER = """
INSERT INTO workers (id, address, cpu_millis, memory_mb, labels, incarnation, agent_run_id,
                     registration_seq, registration_sha256, resources)
VALUES ($1, $2, $3, $4, $5::jsonb, nextval('worker_incarnation_seq'), $6, $7, $8, $9::jsonb)
ON CONFLICT (id) DO UPDATE
   SET address = EXCLUDED.address, cpu_millis = EXCLUDED.cpu_millis,
       memory_mb = EXCLUDED.memory_mb, labels = EXCLUDED.labels,
       incarnation = EXCLUDED.incarnation, state = 'alive',
       registered_at = now(), last_heartbeat_at = now(), dead_at = NULL, dead_epoch = NULL,
       left_at = NULL, hold_until = NULL,
       agent_run_id = EXCLUDED.agent_run_id, registration_seq = EXCLUDED.registration_seq,
       registration_sha256 = EXCLUDED.registration_sha256, resources = EXCLUDED.resources
 WHERE workers.agent_run_id <> EXCLUDED.agent_run_id
    OR workers.registration_seq < EXCLUDED.registration_seq
RETURNING incarnation
"""

# $1 worker id, $2 the incarnation this transaction registered or continued, $3 true for a new
# registration (REGISTER_WORKER made it), false for a continued one (CONTINUE_WORKER). The last
# statement of the registration's transaction, right before its commit: the worker's silence
# counts from here (clock_timestamp(), the statement's own time), not from the transaction's
# start (now()), which lock waits, outcomes and a busy control plane may put seconds earlier: a
# registration that took longer than dead_after to commit would otherwise be judged silent the
# moment it is seen. A new registration sets registered_at to the same time, so
# last_heartbeat_at stays equal to it until the new incarnation's first heartbeat
# (END_ORPHANED_ASSIGNMENTS counts on that). A copy of the applied registration (same agent
# run and number: a retry whose first answer was lost, a hedged copy) is answered again and
# stamps last_heartbeat_at alone ($3 false): its agent may learn of its incarnation only from
# this answer, and that agent stopped every job before it registered, so the orphan rule may
# count it as heard. A late copy of another run's registration is a new registration (above).
#
# It also sets the dead_after the worker is judged by to the one its reply tells ($4 $5: the
# interval and dead_after, ms, to tell while the leader chose none; schema.sql, heartbeat_told):
# a new incarnation's is that one, and its heartbeats' order starts anew; a continued or copied
# one's is never lowered (its agent may still derive its fence from a larger one). Returns the
# interval and the dead_after to tell (no row: the worker is not alive in that incarnation).
STAMP_REGISTRATION = """
UPDATE workers w
   SET last_heartbeat_at = greatest(w.last_heartbeat_at, c.at),
       registered_at = CASE WHEN $3 THEN c.at ELSE w.registered_at END,
       dead_after_ms = CASE WHEN $3 THEN t.dead_after_ms ELSE greatest(w.dead_after_ms, t.dead_after_ms) END,
       heartbeat_sent_us = CASE WHEN $3 THEN 0 ELSE w.heartbeat_sent_us END
  FROM (SELECT clock_timestamp() AS at) c, heartbeat_told($4, $5) t
 WHERE w.id = $1 AND w.incarnation = $2 AND w.state = 'alive'
RETURNING t.interval_ms, t.dead_after_ms
"""

# $1 worker id, $2 incarnation, $3 $4 the interval and dead_after (ms) to tell while the leader
# chose none. A copy of a continued registration, answered again: what its reply tells is
# recorded as the dead_after the worker is judged by (never lowered; see STAMP_REGISTRATION).
TELL_WORKER = """
UPDATE workers w SET dead_after_ms = greatest(w.dead_after_ms, t.dead_after_ms)
  FROM heartbeat_told($3, $4) t
 WHERE w.id = $1 AND w.incarnation = $2 AND w.state = 'alive'
RETURNING t.interval_ms, t.dead_after_ms
"""

# $1 worker id. The registration a REGISTER_WORKER (or CONTINUE_WORKER) that returned nothing met.
WORKER_REGISTRATION = """
SELECT incarnation, state, agent_run_id, registration_seq, registration_sha256 FROM workers WHERE id = $1
"""

# Restarts that keep their jobs (docs/design.md, "Restarts"): a registration that asks to
# continue incarnation $9. Parameters as REGISTER_WORKER's ($1 id, $2 address, $3 cpu_millis, $4
# memory_mb, $5 labels, $6 agent run id, $7 registration number, $8 sha256), then $9, and $10
# the devices it offers (as REGISTER_WORKER's $9). The row
# takes the new agent run, address, capacity and labels, a fresh heartbeat and no restart
# hold, keeping its incarnation, only if it is still alive in that incarnation (not declared
# dead, not left, not registered again since) and this is not a copy of a registration already
# applied (same run, a number not above the stored one): one statement, so a dead-worker
# declaration or another registration that commits first is seen (the UPDATE re-checks its
# condition on the row's newest version) and one that comes later finds the fresh heartbeat.
# Returns the incarnation; nothing when the row is not continued (WORKER_REGISTRATION says why).
CONTINUE_WORKER = """
UPDATE workers
   SET address = $2, cpu_millis = $3, memory_mb = $4, labels = $5::jsonb,
       last_heartbeat_at = now(), hold_until = NULL,
       agent_run_id = $6, registration_seq = $7, registration_sha256 = $8, resources = $10::jsonb
 WHERE id = $1 AND incarnation = $9 AND state = 'alive'
   AND (agent_run_id <> $6 OR registration_seq < $7)
RETURNING incarnation
"""

# $1 worker id, $2 the continued incarnation, $3 the assignment ids its agent holds. Ends every
# other active assignment of that incarnation on the worker's word (as a not_started outcome
# does, schema.sql record_outcomes): its agent runs none of them (it stopped whatever else of
# that incarnation it found running, and waited until it was gone, before it asked) and refuses
# them from the reply on. They end 'stopped' (end_reason 'released') and their jobs go to
# schema.sql's requeue_unspent. Returns the ended ids.
RELEASE_UNHELD_ASSIGNMENTS = """
WITH released AS (
    UPDATE assignments a
       SET state = 'stopped', ended_at = now(), end_reason = 'released',
           detail = 'released: its worker''s agent restarted and does not run it'
     WHERE a.worker_id = $1 AND a.worker_incarnation = $2 AND a.state = 'active'
       AND NOT (a.id = ANY($3::bigint[]))
 RETURNING a.id, a.job_id
)
SELECT coalesce(array_agg(id ORDER BY id), '{}'), requeue_unspent(array_agg(job_id)) FROM released
"""

# $1 worker id, $2 a continued incarnation. The assignments its continuation released
# (RELEASE_UNHELD_ASSIGNMENTS), for a copy of that continuation, whose reply must name them too
# (its agent refuses them if they are sent). Rare (a reply lost, then a retry), so a scan of the
# worker's assignments is fine.
RELEASED_ASSIGNMENTS = """
SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM assignments
 WHERE worker_id = $1 AND worker_incarnation = $2 AND state = 'stopped' AND end_reason = 'released'
"""

# $1 worker id, $2 the continued incarnation, $3 the assignment ids its agent holds. Confirms
# them as a heartbeat's running list does (the first listing sets confirmed_at, and an assigned
# job becomes running), and returns those that are not active on this worker in that
# incarnation: the agent stops them.
CONFIRM_HELD_ASSIGNMENTS = """
WITH confirmed AS (
    UPDATE assignments SET confirmed_at = now()
     WHERE id = ANY($3::bigint[]) AND worker_id = $1 AND worker_incarnation = $2
       AND state = 'active' AND confirmed_at IS NULL
 RETURNING job_id
),
running AS (
    UPDATE jobs j SET state = 'running', started_at = coalesce(j.started_at, now())
      FROM confirmed WHERE j.id = confirmed.job_id AND j.state = 'assigned'
)
SELECT coalesce(array_agg(h.id ORDER BY h.id), '{}') FROM unnest($3::bigint[]) AS h(id)
 WHERE NOT EXISTS (SELECT 1 FROM assignments a
                    WHERE a.id = h.id AND a.worker_id = $1 AND a.worker_incarnation = $2
                      AND a.state = 'active')
"""

# $1 worker id, $2 incarnation, $3 hold (s). A planned restart's hold, after the heartbeat that
# asks for it (HEARTBEAT, same connection): hold_until = now() + $3, only while the row is alive
# in that incarnation. Returns a row when it was recorded. The agent moves its fence deadline on
# by the hold only on that answer; the hold counts from this statement's now(), which is not
# before the heartbeat was sent (docs/design.md, "Restarts").
SET_RESTART_HOLD = """
WITH promised AS (SELECT id FROM workers WHERE id = $1 FOR UPDATE)
UPDATE workers w SET hold_until = now() + make_interval(secs => $3::float8)
  FROM promised
 WHERE w.id = promised.id AND w.incarnation = $2 AND w.state = 'alive'
RETURNING w.hold_until
"""

# $1 worker id, $2 incarnation, $3 agent run id. A clean stop (actors/ingest.py, leave_worker),
# after LOCK_WORKER in the same transaction: the row becomes 'left' if it is alive in that
# incarnation, registered by that agent run, and the stop is logged in worker_leaves. Returns
# the row as it was (no row: unknown worker) and whether this statement made it left. A late
# leave (an earlier incarnation's) or one from anyone but the agent that registered the
# incarnation changes nothing. The leader's next reconcile pass ends the incarnation's
# assignments (END_ORPHANED_ASSIGNMENTS).
LEAVE_WORKER = """
WITH current AS (
    SELECT id, state, incarnation, agent_run_id FROM workers WHERE id = $1
),
left_now AS (
    UPDATE workers w SET state = 'left', left_at = now()
      FROM current c
     WHERE w.id = c.id AND c.state = 'alive' AND c.incarnation = $2 AND c.agent_run_id = $3
 RETURNING w.id, w.incarnation
),
logged AS (
    INSERT INTO worker_leaves (worker_id, incarnation) SELECT id, incarnation FROM left_now
)
SELECT c.state, c.incarnation, c.agent_run_id = $3 AS same_run, EXISTS (SELECT 1 FROM left_now) AS left_now
  FROM current c
"""

# $1 worker id. Serialises the registrations of one worker id for the rest of the transaction
# (a transaction-level advisory lock, in a namespace of its own), taken first, before
# LOCK_WORKER: a copy of a worker's first registration that arrives while the original has not
# committed finds no row to lock, and without this would run REGISTER_WORKER, whose nextval is
# drawn before its conflict check, using up an incarnation number; with it, the copy waits and
# then finds the original's row. Only registrations take it, always first, so it joins no cycle.
# The namespace is 0x53524547 ("SREG"); two ids with the same hashtext only wait for each other.
LOCK_REGISTRATION = "SELECT pg_advisory_xact_lock(1397900615, hashtext($1))"

# $1 worker id. Locks the worker's row (if any) for the rest of the transaction, first in every
# transaction that takes it (one lock order). Every promise about the worker's future (a cordon,
# a drain, a clean leave, a registration, a restart hold) takes it before it writes or reads
# what it answers: FOR UPDATE conflicts with the FOR KEY SHARE a placement takes on its workers
# (actors/queries/ledger.py, COMMIT_PLACEMENTS), so a placement in progress commits first and
# the promise's next statement sees its assignments, and a placement after it sees the promise.
LOCK_WORKER = "SELECT id FROM workers WHERE id = $1 FOR UPDATE"

# A worker's finished outcomes, from a registration (heartbeats carry theirs through HEARTBEAT):
# the function record_outcomes in schema.sql, its parameters as $1 .. $9. Returns how many were
# recorded late.
RECORD_OUTCOMES = """
SELECT record_outcomes($1, $2::bigint[], $3::text[], $4::int[], $5::bigint[], $6::bigint[],
                       $7::text[], $8::text[], $9::text[])
"""

# One heartbeat, one statement: the function record_heartbeat in schema.sql (liveness, finished
# outcomes, running confirmations, which running assignments to stop), its parameters as
# $1 .. $15 and its row as it returns it.
HEARTBEAT = """
SELECT current_epoch, alive, stop_assignment_ids, database_unix_s, told_interval_ms, told_dead_after_ms
  FROM record_heartbeat($1, $2, $3::bigint[], $4::bigint[], $5::text[], $6::int[], $7::bigint[],
                        $8::bigint[], $9::text[], $10::text[], $11::text[], $12, $13, $14, $15)
"""

# Liveness-only heartbeats of several workers, one statement: the function record_heartbeats in
# schema.sql (actors/heartbeat_group.py gathers them), its parameters as $1 .. $8 and its rows as
# it returns them, one per member, in member order.
RECORD_HEARTBEATS = """
SELECT member, alive, skipped, stop_assignment_ids, newer_agent_run_id, newer_address,
       newer_incarnation, current_epoch, database_unix_s, told_interval_ms, told_dead_after_ms
  FROM record_heartbeats($1::text[], $2::bigint[], $3::bigint[], $4::int[], $5::bigint[], $6::int[],
                         $7, $8)
"""

# RECORD_HEARTBEATS ($1 .. $8, its rows in member order) and, in the same statement, the usage
# samples of the members it recorded alive (not skipped): $9 their member numbers (1-based, as
# in $1), $10 assignment ids (0: the worker's jobs together), $11 cpu_millis, $12 memory_mb,
# $13 span_ms (record_usage in schema.sql). A group whose heartbeats carry no sample runs
# RECORD_HEARTBEATS alone.
RECORD_HEARTBEATS_AND_USAGE = (
    "WITH beats AS MATERIALIZED ("
    + RECORD_HEARTBEATS
    + """), samples AS (
SELECT record_usage(array_agg(w.worker_id), array_agg(u.assignment_id), array_agg(u.cpu_millis),
                    array_agg(u.memory_mb), array_agg(u.span_ms)) AS kept
  FROM unnest($9::int[], $10::bigint[], $11::int[], $12::int[], $13::int[])
       AS u (member, assignment_id, cpu_millis, memory_mb, span_ms)
  JOIN beats b ON b.member = u.member AND b.alive AND NOT b.skipped
  JOIN unnest($1::text[]) WITH ORDINALITY AS w (worker_id, member) ON w.member = u.member
)
SELECT b.* FROM beats b CROSS JOIN samples ORDER BY b.member
"""
)

CURRENT_EPOCH = "SELECT epoch FROM lease WHERE id = 1"

# The current epoch and the database's clock (now(), unix s: the start of the caller's
# transaction), for a registration's reply: the agent times its log by it (agent/dbclock.py).
EPOCH_AND_CLOCK = "SELECT epoch, extract(epoch FROM now())::float8 AS database_unix_s FROM lease WHERE id = 1"

# $1 worker id, $2 an incarnation. The registration that replaced it, when the worker is alive
# in a newer incarnation: its agent run, address and incarnation (no row: none). Asked only
# for a heartbeat that is told to register again.
NEWER_REGISTRATION = """
SELECT agent_run_id, address, incarnation FROM workers
 WHERE id = $1 AND state = 'alive' AND incarnation > $2
"""

# $1 id, $2 address, $3 pid, $4 its console's origin (NULL: it serves none), $5 the CPU time one
# heartbeat costs it (µs; NULL: not measured yet), $6 the 99th percentile over the workers of
# the waits their heartbeats reported lately (ms; NULL: too few workers reported)
RECORD_PRESENCE = """
INSERT INTO control_planes (id, address, pid, started_at, seen_at, console_url, cpu_per_heartbeat_us,
                            heartbeat_wait_p99_ms)
VALUES ($1, $2, $3, now(), now(), $4, $5, $6)
ON CONFLICT (id) DO UPDATE
   SET address = EXCLUDED.address, seen_at = now(), console_url = EXCLUDED.console_url,
       cpu_per_heartbeat_us = coalesce(EXCLUDED.cpu_per_heartbeat_us, control_planes.cpu_per_heartbeat_us),
       heartbeat_wait_p99_ms = EXCLUDED.heartbeat_wait_p99_ms,
       started_at = CASE WHEN control_planes.pid IS DISTINCT FROM EXCLUDED.pid
                         THEN now() ELSE control_planes.started_at END,
       pid = EXCLUDED.pid
"""
