"""The placer's reads (:mod:`actors.placer`): live workers, pending jobs, one round's reads."""

from __future__ import annotations

# $1 worker_fresh_s, $2 trial_run_s. The workers the placer may place on, with their allocation,
# their send window's counters, and what places them apart (schema.sql, live_workers).
LIVE_WORKERS = """
SELECT id, address, incarnation, cpu_millis, memory_mb, cpu_allocated_millis, memory_allocated_mb,
       unconfirmed_assignments, confirmed_assignments, runs_containers, labels, cordoned, unhealthy,
       probe_due, trial, resources, units_in_use
  FROM live_workers($1, $2)
"""

# A pending job's columns (schema.sql, placeable_jobs) as parallel arrays over ``ps``, the
# rows read: PENDING_JOBS' and ROUND_READ's ``p`` columns, which the placer reads alike.
_PENDING_ARRAYS = """array_agg(id) AS p_id, array_agg(cpu_millis) AS p_cpu_millis,
               array_agg(memory_mb) AS p_memory_mb, array_agg(priority) AS p_priority,
               array_agg(reason) AS p_reason, array_agg(pending_xid) AS p_pending_xid,
               array_agg(pending_seq) AS p_pending_seq, array_agg(wait_s) AS p_wait_s,
               array_agg(container) AS p_container, array_agg(constraints) AS p_constraints,
               array_agg(failed_on) AS p_failed_on, array_agg(owner) AS p_owner,
               array_agg(resources) AS p_resources,
               array_agg(gang_id) AS p_gang_id, array_agg(gang_rank) AS p_gang_rank,
               array_agg(gang_size) AS p_gang_size, array_agg(gang_spread) AS p_gang_spread"""

# $1 limit. Every pending job (the placer's full resync; schema.sql, placeable_jobs, a gang's
# task with its gang's id, its rank and the gang's size and spread: actors/gangs.py), highest
# priority first, then submission order, as parallel arrays in one row (NULL when there are
# none), with the snapshot the statement read in (pg_current_snapshot() is the statement's own),
# as the placer's PendingMark needs it: xmax, the first transaction id not yet assigned, and xip,
# the transactions in progress (xid8 values travel as bigint: they stay below 2^63).
PENDING_JOBS = f"""
SELECT p.*, pg_snapshot_xmax(snap.s)::text::bigint AS snapshot_xmax,
       ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(snap.s) x) AS snapshot_xip
  FROM (SELECT {_PENDING_ARRAYS}
          FROM (SELECT * FROM placeable_jobs ORDER BY priority DESC, id LIMIT $1) ps) p,
       (SELECT pg_current_snapshot() AS s) snap
"""

# The capped accounts' caps and use (schema.sql, quota_usage) as parallel arrays in one row
# (NULL when there are none): read with every round (ROUND_READ) and with a full read.
QUOTAS = """
SELECT array_agg(name) AS q_name, array_agg(cpu_millis) AS q_cpu_millis,
       array_agg(memory_mb) AS q_memory_mb, array_agg(used_cpu_millis) AS q_used_cpu_millis,
       array_agg(used_memory_mb) AS q_used_memory_mb
  FROM quota_usage
"""

# What each account's assigned and running jobs hold (index jobs_in_use_by_owner), with its
# fair-share weight (1 for an account without a row): fair share's current use
# (actors/fair_share.py), read in every round whose queue holds two accounts' jobs or more
# (actors/placer.py). One row per account that holds
# something or has a weight other than 1.
ACCOUNT_USE = """
SELECT coalesce(u.owner, a.name) AS name, coalesce(a.weight, 1)::float8 AS weight,
       coalesce(u.cpu_millis, 0)::bigint AS used_cpu_millis,
       coalesce(u.memory_mb, 0)::bigint AS used_memory_mb
  FROM (SELECT j.owner, sum(j.cpu_millis) AS cpu_millis, sum(j.memory_mb) AS memory_mb
          FROM jobs j WHERE j.state IN ('assigned', 'running') GROUP BY j.owner) u
  FULL JOIN (SELECT name, weight FROM accounts WHERE weight <> 1) a ON a.name = u.owner
"""

# $1 worker_fresh_s, $2 $3 the mark (pending_xid, pending_seq), $4 limit, $5 the mark's
# transactions in flight, $6 trial_run_s, $7 whether to read each account's use (fair share).
# One round's reads in one round trip, as parallel arrays in one row (an array is NULL when it
# has no rows), with the snapshot they were read in (as PENDING_JOBS'): LIVE_WORKERS' rows; the
# jobs that became pending after the mark, in (pending_xid, pending_seq) order, up to the limit;
# those at or below the mark made pending by a transaction that was still in flight at the
# previous read (see actors/placer_store.py, PendingMark); the capped accounts (QUOTAS); and,
# with $7, ACCOUNT_USE's rows (without it the filter, a one-time test, scans nothing).
ROUND_READ = f"""
SELECT w.*, p.*, q.*, f.*, pg_snapshot_xmax(snap.s)::text::bigint AS snapshot_xmax,
       ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(snap.s) x) AS snapshot_xip
  FROM (SELECT array_agg(w.id) AS w_id, array_agg(w.address) AS w_address,
               array_agg(w.incarnation) AS w_incarnation, array_agg(w.cpu_millis) AS w_cpu_millis,
               array_agg(w.memory_mb) AS w_memory_mb,
               array_agg(w.cpu_allocated_millis) AS w_cpu_allocated_millis,
               array_agg(w.memory_allocated_mb) AS w_memory_allocated_mb,
               array_agg(w.unconfirmed_assignments) AS w_unconfirmed_assignments,
               array_agg(w.confirmed_assignments) AS w_confirmed_assignments,
               array_agg(w.runs_containers) AS w_runs_containers, array_agg(w.labels) AS w_labels,
               array_agg(w.cordoned) AS w_cordoned, array_agg(w.unhealthy) AS w_unhealthy,
               array_agg(w.probe_due) AS w_probe_due, array_agg(w.trial) AS w_trial,
               array_agg(w.resources) AS w_resources, array_agg(w.units_in_use) AS w_units_in_use
          FROM live_workers($1, $6) w) w,
       (SELECT {_PENDING_ARRAYS}
          FROM ((SELECT * FROM placeable_jobs WHERE (pending_xid, pending_seq) > ($2, $3)
                  ORDER BY pending_xid, pending_seq LIMIT $4)
                UNION ALL
                (SELECT * FROM placeable_jobs
                  WHERE pending_xid = ANY($5::bigint[]) AND (pending_xid, pending_seq) <= ($2, $3))) ps) p,
       ({QUOTAS}) q,
       (SELECT array_agg(u.name) AS f_name, array_agg(u.weight) AS f_weight,
               array_agg(u.used_cpu_millis) AS f_used_cpu_millis,
               array_agg(u.used_memory_mb) AS f_used_memory_mb
          FROM ({ACCOUNT_USE}) u WHERE $7::boolean) f,
       (SELECT pg_current_snapshot() AS s) snap
"""

# $1 job ids. Those no longer pending.
NO_LONGER_PENDING = "SELECT id FROM jobs WHERE id = ANY($1::bigint[]) AND state <> 'pending'"

# $1 the highest priority of the round's preemption candidates, $2 preempt_cooldown_s, $3 the
# round's live worker ids, $4 their incarnations. Read only in a round that left candidates
# (actors/placer.py; docs/preemption.md), as parallel arrays in one row (NULL when none): the
# active assignments that may be preempted (on those workers in those incarnations, of a lower
# priority than $1, not marked already (a mark lapses once its preempting job is no longer
# pending: cancelled, or placed elsewhere), their job without a cancel asked and not preempted
# within the cooldown), each with its job's priority and account and when its run started (or,
# not started yet, was placed; unix seconds); and every account with pending, assigned or
# running jobs, with what its assigned and running jobs hold and its fair-share weight.
PREEMPTIBLE = """
SELECT v.*, s.*
  FROM (SELECT array_agg(a.id ORDER BY a.id) AS v_assignment_id,
               array_agg(a.job_id ORDER BY a.id) AS v_job_id,
               array_agg(a.worker_id ORDER BY a.id) AS v_worker_id,
               array_agg(j.cpu_millis ORDER BY a.id) AS v_cpu_millis,
               array_agg(j.memory_mb ORDER BY a.id) AS v_memory_mb,
               array_agg(j.priority ORDER BY a.id) AS v_priority,
               array_agg(j.owner ORDER BY a.id) AS v_account,
               array_agg(extract(epoch FROM coalesce(j.started_at, a.created_at))::float8 ORDER BY a.id)
                   AS v_started_at_s
          FROM assignments a
          JOIN unnest($3::text[], $4::bigint[]) AS w(id, incarnation)
            ON w.id = a.worker_id AND w.incarnation = a.worker_incarnation
          JOIN jobs j ON j.id = a.job_id
         WHERE a.state = 'active'
           AND (a.preempt_requested_at IS NULL
                OR NOT EXISTS (SELECT 1 FROM jobs p WHERE p.id = a.preempted_by AND p.state = 'pending'))
           AND j.priority < $1 AND NOT j.cancel_requested
           AND (j.preempted_at IS NULL OR j.preempted_at <= now() - make_interval(secs => $2::float8))) v,
       (SELECT array_agg(u.owner) AS s_account, array_agg(u.cpu_millis) AS s_cpu_millis,
               array_agg(u.memory_mb) AS s_memory_mb, array_agg(coalesce(acc.weight, 1)) AS s_weight
          FROM (SELECT owner,
                       coalesce(sum(cpu_millis) FILTER (WHERE state <> 'pending'), 0)::bigint AS cpu_millis,
                       coalesce(sum(memory_mb) FILTER (WHERE state <> 'pending'), 0)::bigint AS memory_mb
                  FROM jobs WHERE state IN ('pending', 'assigned', 'running') GROUP BY owner) u
          LEFT JOIN accounts acc ON acc.name = u.owner) s
"""

# $1 the half-life (s, > 0). Each account's decayed past allocation (actors/fair_share.py,
# decayed_allocation): every run's cpu_millis and memory_mb times 2^(-age at its end / $1) -
# 2^(-age at its start / $1), its start its placement (created_at) and its end now for a run
# still active, summed by the job's owner; runs that ended more than 10 half-lives ago (under
# 0.1 % of their weight left) are left out. Ages are capped at 1,000 half-lives (2^-1000 is 0 to
# float8 without an underflow). A scan of the runs of the last 10 half-lives: read every
# FAIR_SHARE_PAST_REFRESH_S (actors/placer.py), never in a round.
ACCOUNT_PAST_USE = """
SELECT j.owner AS name, sum(a.cpu_millis * x.w)::float8 AS decayed_cpu_millis,
       sum(a.memory_mb * x.w)::float8 AS decayed_memory_mb
  FROM assignments a JOIN jobs j ON j.id = a.job_id
  CROSS JOIN LATERAL (
      SELECT power(2::float8, -least(extract(epoch FROM now() - coalesce(a.ended_at, now())) / $1, 1000))
             - power(2::float8, -least(extract(epoch FROM now() - a.created_at) / $1, 1000)) AS w
  ) x
 WHERE a.state = 'active' OR a.ended_at > now() - make_interval(secs => 10 * $1::float8)
 GROUP BY j.owner
"""
