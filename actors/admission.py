"""Admission to the ingest: liveness work first, a small number of other requests at a time,
new work refused under overload.

:class:`AdmissionGate` hands out the turns (liveness work first), :class:`LoopShare` bounds the
loop time of work done in slices, and :func:`shed_reason`, :func:`turn_timeout_reason` and
:func:`queue_full_reason` say why a request is refused. The rules and their argument:
docs/design.md, "Admission".
"""

from __future__ import annotations

import math
from collections import deque

import attrs
import trio

from runtime.settings.control_plane import (
    DEFAULT_WIRE_WORK_BURST_S,
    IngestSettings,
)

LIVENESS_RPCS = frozenset({"heartbeat", "register_worker", "leave_worker", "presence"})
"""The work that is never shed and may use the reserved connections (``presence``: this
replica's own liveness record, not an RPC)."""


@attrs.frozen(kw_only=True)
class Load:
    """How loaded the ingest is at the moment a request arrives.

    Args:
        lag_s: the ingest loop's worst lag over the last second, in seconds.
        in_progress: requests other than liveness work holding a turn.
        waiting: requests other than liveness work waiting for a turn.
        would_wait: whether this request would have to wait for its turn.
    """

    lag_s: float
    in_progress: int
    waiting: int
    would_wait: bool


def shed_reason(rpc: str, load: Load, *, cp_id: str, settings: IngestSettings) -> str | None:
    """Why ``rpc`` must be refused as it arrives, or None when it may go ahead (see the module
    docstring, rule 3).

    Args:
        rpc: the RPC's method name in snake_case, e.g. ``"submit_jobs"``.
        load: the ingest's load as the request arrives.
        cp_id: this replica's id, named in the answer.
        settings: ``shed_lag_s``, ``max_requests_in_progress`` and ``max_waiting_requests``.

    Returns:
        the busy message for the client, naming the replica, the measures and their limits,
        e.g. ``"busy: cp-1 is overloaded (event loop lag 0.42 s, limit 0.25 s; 2 requests in
        progress, limit 2; 14 waiting, limit 16), try another replica"``; None for liveness
        work, which is never refused.
    """
    if rpc in LIVENESS_RPCS:
        return None
    lagging = load.lag_s > settings.shed_lag_s
    queue_full = load.would_wait and load.waiting >= settings.max_waiting_requests
    if not (lagging or queue_full):
        return None
    return (
        f"busy: {cp_id} is overloaded (event loop lag {load.lag_s:.2f} s, limit {settings.shed_lag_s:g} s; "
        f"{load.in_progress} requests in progress, limit {settings.max_requests_in_progress}; "
        f"{load.waiting} waiting, limit {settings.max_waiting_requests}), try another replica"
    )


def admission_wait_s(*, now: float, deadline: float, liveness: bool, settings: IngestSettings) -> float:
    """How long a request arriving at trio time ``now`` may wait for its turn, in seconds.

    Liveness work waits up to ``settings.liveness_connection_wait_s``, other work up to
    ``settings.max_admission_wait_s``; neither past its client's ``deadline`` (trio time).
    """
    limit_s = settings.liveness_connection_wait_s if liveness else settings.max_admission_wait_s
    return max(0.0, min(limit_s, deadline - now))


def turn_timeout_reason(
    rpc: str, *, waited_s: float, in_progress: int, cp_id: str, settings: IngestSettings
) -> str:
    """The busy message for ``rpc``, which waited ``waited_s`` seconds for its turn in vain.

    Args:
        rpc: the RPC's method name in snake_case.
        waited_s: how long it waited, in seconds.
        in_progress: requests holding a turn now.
        cp_id: this replica's id, named in the answer.
        settings: ``max_admission_wait_s`` and ``max_requests_in_progress``, named in the answer.

    Returns:
        e.g. ``"busy: cp-1 had no turn for list_jobs within 1.00 s (limit 1 s; 2 requests in
        progress, limit 2), try another replica"``.
    """
    return (
        f"busy: {cp_id} had no turn for {rpc} within {waited_s:.2f} s "
        f"(limit {settings.max_admission_wait_s:g} s; {in_progress} requests in progress, "
        f"limit {settings.max_requests_in_progress}), try another replica"
    )


def queue_full_reason(
    *, pending: int, counted_s_ago: float, cp_id: str, settings: IngestSettings
) -> str | None:
    """Why a submission must be refused because the pending queue is full, or None.

    Args:
        pending: jobs pending when last counted.
        counted_s_ago: how long ago that count was taken, in seconds.
        cp_id: this replica's id, named in the answer.
        settings: ``max_pending_jobs`` (0: no limit).

    Returns:
        e.g. ``"busy: 20013 jobs pending (counted 0.31 s ago), limit 20000 (max_pending_jobs);
        nothing was stored, try again when the queue is shorter (cp-1)"``, or None while the
        queue is under the limit.
    """
    limit = settings.max_pending_jobs
    if not limit or pending < limit:
        return None
    return (
        f"busy: {pending} jobs pending (counted {counted_s_ago:.2f} s ago), limit {limit} "
        f"(max_pending_jobs); nothing was stored, try again when the queue is shorter ({cp_id})"
    )


@attrs.define(eq=False)
class AdmissionGate:
    """Turns for the ingest's requests: ``size`` in all (the pool's connections),
    ``reserved`` of them for liveness work, and at most ``max_other`` for other work.

    A liveness request may take any free turn; any other request only while fewer than
    ``min(size - reserved, max_other)`` other requests hold one. Waiting requests are served
    liveness first, then in arrival order. A released turn is handed to the next waiter
    directly, so a request arriving later never overtakes one that waits.

    Args:
        size: turns in all (the pool's size).
        reserved: turns only liveness requests may take (``0 < reserved < size``).
        max_other: most turns other requests may hold at once (``max_requests_in_progress``).
    """

    size: int
    reserved: int
    max_other: int = attrs.field(default=2**31)
    _held_liveness: int = 0
    _held_other: int = 0
    _liveness_waiters: deque[trio.Event] = attrs.field(factory=deque)
    _other_waiters: deque[trio.Event] = attrs.field(factory=deque)

    @property
    def held(self) -> int:
        """Turns held now."""
        return self._held_liveness + self._held_other

    @property
    def held_other(self) -> int:
        """Turns held now by requests other than liveness work."""
        return self._held_other

    @property
    def other_limit(self) -> int:
        """Most turns other requests may hold at once."""
        return min(self.size - self.reserved, self.max_other)

    @property
    def waiting_other(self) -> int:
        """Requests other than liveness work waiting for a turn."""
        return len(self._other_waiters)

    @property
    def waiting_liveness(self) -> int:
        """Liveness requests waiting for a turn."""
        return len(self._liveness_waiters)

    def would_wait(self, *, liveness: bool) -> bool:
        """Whether a request of this class arriving now would have to wait for a turn."""
        if liveness:
            return bool(self._liveness_waiters) or self.held >= self.size
        return bool(self._liveness_waiters or self._other_waiters) or not self._room_for_other()

    def _room_for_other(self) -> bool:
        return self.held < self.size and self._held_other < self.other_limit

    async def acquire(self, *, liveness: bool) -> None:
        """Take a turn, waiting for one if needed; pair with :meth:`release`.

        A cancelled wait takes no turn.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self.would_wait(liveness=liveness):
            self._take(liveness)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        waiters = self._liveness_waiters if liveness else self._other_waiters
        granted = trio.Event()
        waiters.append(granted)
        try:
            await granted.wait()
        except BaseException:
            if granted.is_set():
                # Handed a turn in the same moment the wait was cancelled: give it on.
                self.release(liveness=liveness)
            else:
                waiters.remove(granted)
            raise

    def release(self, *, liveness: bool) -> None:
        """Give back a turn taken by :meth:`acquire` with the same ``liveness``."""
        if liveness:
            self._held_liveness -= 1
        else:
            self._held_other -= 1
        while self._liveness_waiters and self.held < self.size:
            self._take(True)
            self._liveness_waiters.popleft().set()
        while self._other_waiters and not self._liveness_waiters and self._room_for_other():
            self._take(False)
            self._other_waiters.popleft().set()

    def _take(self, liveness: bool) -> None:
        if liveness:
            self._held_liveness += 1
        else:
            self._held_other += 1


@attrs.define(kw_only=True)
class LoopShare:
    """A token bucket of the ingest loop's time for the CPU work of requests other than
    liveness work (building, encoding, decoding and checking large messages, in slices).

    Why: docs/design.md, "Admission", rule 5.

    Tokens (seconds of loop time) accrue at ``share`` per second of wall time, up to
    ``burst_s``; a slice spends what it took; a negative balance is paid back by pausing.

    Args:
        share: the fraction of the loop's time the slices may take (0 < share <= 1).
        burst_s: the most time saved up while idle, in seconds.
    """

    share: float
    burst_s: float = DEFAULT_WIRE_WORK_BURST_S
    tokens_s: float = 0.0
    updated_at: float = -math.inf

    def spend(self, *, now: float, used_s: float) -> float:
        """Record a slice that took ``used_s`` seconds and ended at trio time ``now``; returns
        how long to pause before the next slice, in seconds (0: none)."""
        accrued_s = max(0.0, now - self.updated_at) * self.share
        self.tokens_s = min(self.burst_s, self.tokens_s + accrued_s - used_s)
        self.updated_at = now
        return pause_for_share_s(tokens_s=self.tokens_s, share=self.share)


def pause_for_share_s(*, tokens_s: float, share: float) -> float:
    """How long slices must pause to pay back a balance of ``tokens_s`` seconds when tokens
    accrue at ``share`` per second, in seconds (0 for a balance that is not negative)."""
    return max(0.0, -tokens_s) / share
