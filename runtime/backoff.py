"""Capped exponential backoff with full jitter, for clients that retry a busy service and for
connection owners that connect again to a database that went away
(:class:`ReconnectSchedule`, :data:`RECONNECT_BACKOFF`).

"Full jitter" from Marc Brooker, "Exponential Backoff And Jitter", AWS Architecture Blog
(2015): the n-th wait is drawn uniformly from ``[0, min(cap, base * 2**n)]``. Spreading the
waits over the whole interval, not around its end, is what keeps many clients that were
refused at the same moment from coming back at the same moment; of the variants the article
compares, it does the least work in total for about the same completion time.

The same rule in SQL is ``full_jitter_s`` in schema.sql: the database draws the waits of job
requeues (a retry's delay, a loss's backoff), so that they are written with the requeue and a new
leader honours them; this one draws the waits of network retries, in the processes that retry.
"""

from __future__ import annotations

import math
import random

import attrs

from runtime.errors import InvalidArgument


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise InvalidArgument(attribute.name, value, "must be a finite number > 0")


@attrs.frozen(kw_only=True)
class FullJitterBackoff:
    """The waits between attempts: uniform in ``[0, min(cap_s, base_s * 2**attempt)]``.

    Args:
        base_s: the ceiling of the first wait, in seconds.
        cap_s: the ceiling no wait exceeds, in seconds.

    Raises:
        InvalidArgument: ``base_s`` or ``cap_s`` is not > 0.
    """

    base_s: float = attrs.field(default=0.1, validator=_positive)
    cap_s: float = attrs.field(default=2.0, validator=_positive)

    def ceiling_s(self, attempt: int) -> float:
        """The largest wait after ``attempt`` failed rounds (0 for the first wait), in seconds."""
        # 2**attempt overflows a float past attempt 1023; the cap is reached long before.
        return min(self.cap_s, self.base_s * 2.0 ** min(attempt, 1023))

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """A wait for after ``attempt`` failed rounds, drawn with ``rng``, in seconds."""
        return rng.uniform(0.0, self.ceiling_s(attempt))


RECONNECT_BACKOFF = FullJitterBackoff(base_s=0.05, cap_s=2.0)
"""The waits between failed connects to the database, for every connection owner.

The first wait is below 50 ms, so a connection dropped by a blip (a restarted server, a
failover) is back at once; the cap of 2 s is the longest a control plane stays away from a
database that has come back: it is the lease's ttl, so a replica returns within about one
lease ttl of its database, and workers (whose dead_after is 2.5 s) are not declared dead
because the control plane was slow to notice. A larger cap saves next to nothing: one connect
attempt every 2 s is no load on a server."""


@attrs.define
class ReconnectSchedule:
    """When a connection owner may try to connect again: after its n-th failed connect in a
    row (n = 0, 1, ...) a wait drawn from ``backoff`` (capped, growing, full jitter); a
    successful connect resets it, so the next outage starts from the shortest wait again.

    Pure: the caller passes the time (trio seconds), so a test drives it with any clock.

    Args:
        backoff: the waits' bounds.
        rng: draws the waits.
    """

    backoff: FullJitterBackoff = RECONNECT_BACKOFF
    rng: random.Random = attrs.field(factory=random.Random)
    failures: int = 0
    """Failed connects since the last success."""
    next_attempt_at: float = -math.inf
    """Earliest time of the next connect (trio seconds); -inf: at once."""

    def failed(self, now: float) -> float:
        """Record a failed connect at ``now``; returns the wait before the next one, in seconds."""
        wait_s = self.backoff.delay_s(self.failures, self.rng)
        self.failures += 1
        self.next_attempt_at = now + wait_s
        return wait_s

    def succeeded(self) -> None:
        """Record a successful connect: the next failure waits the shortest time again."""
        self.failures = 0
        self.next_attempt_at = -math.inf
