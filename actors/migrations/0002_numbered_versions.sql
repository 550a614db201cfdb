-- Version 2, from release 0.1.0's (version 1: it recorded only its schema.sql's sha256): versions
-- by number; judged_workers, placeable_jobs, live_workers and dependency_states, each rule once;
-- one full-jitter backoff (full_jitter_s, which takes its cap) behind the retry delay.
DROP TABLE IF EXISTS schema_version;
CREATE TABLE IF NOT EXISTS schema_version (
    version     integer     PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE VIEW judged_workers AS
SELECT w.id, w.incarnation, w.last_heartbeat_at, w.hold_until, w.dead_after_ms
  FROM workers w
 WHERE w.state = 'alive'
    OR (w.state = 'left'
        AND EXISTS (SELECT 1 FROM assignments a WHERE a.worker_id = w.id AND a.state = 'active'));

CREATE OR REPLACE FUNCTION dependency_states(p_after bigint[])
RETURNS TABLE (dep bigint, state text) LANGUAGE sql STABLE AS $$
    SELECT m.dep, CASE WHEN bool_or(m.state = 'failed') THEN 'failed'
                       WHEN bool_or(m.state = 'cancelled') THEN 'cancelled'
                       WHEN bool_and(m.state = 'succeeded') THEN 'succeeded'
                       WHEN count(*) = 1 THEN min(m.state)
                       ELSE 'unfinished' END AS state
      FROM (SELECT d.id AS dep, d.state FROM jobs d
             WHERE d.id = ANY(p_after) AND d.array_id IS DISTINCT FROM d.id
            UNION ALL
            SELECT t.array_id, t.state FROM jobs t WHERE t.array_id = ANY(p_after)) m
     GROUP BY m.dep
$$;

CREATE OR REPLACE FUNCTION full_jitter_s(p_base_s float8, p_cap_s float8, p_attempt integer)
RETURNS float8 LANGUAGE sql VOLATILE STRICT AS $$
    SELECT random() * least(p_cap_s, p_base_s * power(2.0::float8, least(p_attempt, 1023)))
$$;

CREATE OR REPLACE FUNCTION retry_delay_s(p_backoff_ms bigint, p_failures integer)
RETURNS float8 LANGUAGE sql VOLATILE AS $$
    SELECT full_jitter_s(p_backoff_ms / 1000.0, 600.0, greatest(p_failures, 1) - 1)
$$;

CREATE OR REPLACE FUNCTION live_workers(p_fresh_s float8, p_trial_run_s float8)
RETURNS TABLE (
    id text, address text, incarnation bigint, cpu_millis integer, memory_mb integer,
    cpu_allocated_millis bigint, memory_allocated_mb bigint, unconfirmed_assignments integer,
    confirmed_assignments integer, runs_containers boolean, labels text, cordoned boolean,
    unhealthy boolean, probe_due boolean, trial boolean
) LANGUAGE sql STABLE AS $$
    SELECT w.id, w.address, w.incarnation, w.cpu_millis, w.memory_mb, a.cpu_allocated_millis,
           a.memory_allocated_mb, a.unconfirmed_assignments, a.confirmed_assignments,
           coalesce(w.labels->>'container' = 'docker', false), w.labels::text,
           w.cordoned_at IS NOT NULL, w.unhealthy_at IS NOT NULL,
           coalesce(w.unhealthy_probe_at <= now(), false),
           p_trial_run_s > 0
           AND NOT EXISTS (SELECT 1 FROM assignments t
                            WHERE t.worker_id = w.id AND t.state = 'finished'
                              AND t.ended_at > greatest(w.registered_at, coalesce(w.health_since, '-infinity'))
                              AND t.worker_incarnation = w.incarnation
                              AND (t.outcome = 'succeeded'
                                   OR t.confirmed_at + make_interval(secs => p_trial_run_s) <= t.ended_at))
           AND NOT EXISTS (SELECT 1 FROM assignments t
                            WHERE t.worker_id = w.id AND t.state = 'cancelled'
                              AND t.ended_at > greatest(w.registered_at, coalesce(w.health_since, '-infinity'))
                              AND t.worker_incarnation = w.incarnation
                              AND t.confirmed_at + make_interval(secs => p_trial_run_s) <= t.ended_at)
           AND NOT EXISTS (SELECT 1 FROM assignments t
                            WHERE t.worker_id = w.id AND t.state = 'active'
                              AND t.worker_incarnation = w.incarnation
                              AND t.confirmed_at + make_interval(secs => p_trial_run_s) <= now())
      FROM workers w JOIN worker_allocations a ON a.worker_id = w.id
     WHERE w.state = 'alive' AND w.last_heartbeat_at > now() - make_interval(secs => p_fresh_s)
       AND (w.hold_until IS NULL OR w.hold_until <= now())
$$;

CREATE OR REPLACE VIEW placeable_jobs AS
SELECT id, cpu_millis, memory_mb, priority, reason, pending_xid, pending_seq,
       greatest(extract(epoch FROM not_before - now()), 0)::float8 AS wait_s,
       runtime = 'container' AS container,
       CASE WHEN constraints = '[]'::jsonb THEN NULL ELSE constraints::text END AS constraints,
       CASE WHEN failures > 0 THEN
           (SELECT string_agg(DISTINCT a.worker_id, ' ') FROM assignments a
             WHERE a.job_id = jobs.id AND a.outcome = 'failed') END AS failed_on
  FROM jobs WHERE state = 'pending';
