"""The lease keeper's statements (:mod:`actors.lease`): probe, take over, renew, release, read."""

from __future__ import annotations

# Namespace of the session-level advisory lock (LEASE_LOCK_SPACE, epoch) that the leader of an
# epoch holds on its lease connection for its whole reign. PostgreSQL releases it the moment
# that session ends, so a standby that can take the lock knows the leader's session is gone.
LEASE_LOCK_SPACE = 0x53544B  # "STK"

# One standby poll: the lease, whether it expired by database time, and whether its holder's
# session is gone (the try-lock succeeds; the caller then holds the lock and must release it).
PROBE_LEASE = """
SELECT epoch, expires_at < now() AS expired,
       pg_try_advisory_lock($1, epoch::int) AS orphaned
  FROM lease WHERE id = 1
"""

# $1 holder, $2 ttl_s, $3 the epoch probed, $4 whether its holder's session is gone.
# Takes the lease if it is still at that epoch and has expired or lost its holder's session;
# bumps the epoch, appends the reign to lease_history with its cause (read from the row it
# replaces: no holder before, 'first'; a clean release sets expires_at to '-infinity',
# 'released'; else 'expired' when the holder stopped renewing, or 'session_ended' when its
# session ended first) and takes the new epoch's advisory lock, all in this one statement, so
# no standby can see the new epoch before its lock is held.
TAKE_OVER_LEASE = f"""
WITH previous AS (
    SELECT holder,
           CASE WHEN holder IS NULL THEN 'first'
                WHEN expires_at = '-infinity' THEN 'released'
                WHEN expires_at < now() THEN 'expired'
                ELSE 'session_ended' END AS cause
      FROM lease WHERE id = 1
),
taken AS (
    UPDATE lease
       SET holder = $1, epoch = epoch + 1, expires_at = now() + make_interval(secs => $2)
     WHERE id = 1 AND epoch = $3 AND (expires_at < now() OR $4::boolean)
 RETURNING epoch, holder
),
history AS (
    INSERT INTO lease_history (epoch, holder, acquired_at, previous, cause)
    SELECT taken.epoch, taken.holder, now(), (SELECT holder FROM previous),
           (SELECT cause FROM previous) FROM taken
)
SELECT epoch, pg_advisory_lock({LEASE_LOCK_SPACE}, epoch::int) IS NULL AS locked FROM taken
"""

# $1 lock space, $2 epoch.
TRY_LEASE_LOCK = "SELECT pg_try_advisory_lock($1, $2::int)"
UNLOCK_LEASE_LOCK = "SELECT pg_advisory_unlock($1, $2::int)"

# $1 holder, $2 epoch, $3 ttl_s. No row back: someone else holds the lease now.
RENEW_LEASE = """
UPDATE lease SET expires_at = now() + make_interval(secs => $3)
 WHERE id = 1 AND holder = $1 AND epoch = $2
RETURNING epoch
"""

# $1 holder, $2 epoch. A clean shutdown hands the lease over at once.
RELEASE_LEASE = """
UPDATE lease SET expires_at = '-infinity'
 WHERE id = 1 AND holder = $1 AND epoch = $2
"""

READ_LEASE = """
SELECT holder, epoch, expires_at > now() AS live,
       extract(epoch FROM expires_at - now())::float8 AS remaining_s
  FROM lease WHERE id = 1
"""
