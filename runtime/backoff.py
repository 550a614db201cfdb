"""Capped exponential backoff with full jitter, for clients that retry a busy service and for
connection owners that connect again to a database that went away
(:class:`ReconnectSchedule`, :data:`RECONNECT_BACKOFF`).

"Full jitter" from Marc Brooker, "Exponential Backoff And Jitter", AWS Architecture Blog
(2015): the n-th wait is drawn uniformly from ``[0, min(cap, base * 2**n)]``, so clients refused
at the same moment do not come back at the same moment. The same rule in SQL is
``full_jitter_s`` in schema.sql (the waits of job requeues, written with the requeue).
"""

from __future__ import annotations

import math
import random

import attrs

from runtime.settings.fields import positive


@attrs.frozen(kw_only=True)
class FullJitterBackoff:
    """The waits between attempts: uniform in ``[0, min(cap_s, base_s * 2**attempt)]`` seconds;
    InvalidArgument if ``base_s`` or ``cap_s`` is not > 0."""

    base_s: float = attrs.field(default=0.1, validator=positive)
    cap_s: float = attrs.field(default=2.0, validator=positive)

    def ceiling_s(self, attempt: int) -> float:
        """The largest wait after ``attempt`` failed rounds (0 for the first wait), in seconds."""
        # 2**attempt overflows a float past attempt 1023; the cap is reached long before.
        return min(self.cap_s, self.base_s * 2.0 ** min(attempt, 1023))

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """A wait for after ``attempt`` failed rounds, drawn with ``rng``, in seconds."""
        return rng.uniform(0.0, self.ceiling_s(attempt))


RECONNECT_BACKOFF = FullJitterBackoff(base_s=0.05, cap_s=2.0)
"""The waits between failed connects to the database, for every connection owner: the first
below 50 ms, so a blip is over at once; the cap is the lease's ttl, so a replica returns within
about one ttl of its database (before its workers' dead_after, 2.5 s)."""


@attrs.define
class ReconnectSchedule:
    """When a connection owner may try to connect again: after its n-th failed connect in a
    row (n = 0, 1, ...) a wait drawn from ``backoff`` with ``rng``; a success resets it. Pure:
    the caller passes the time (trio seconds)."""

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
