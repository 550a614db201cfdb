"""Admission to the ingest: liveness work first, a small number of other requests at a time,
new work refused under overload.

:class:`AdmissionGate` hands out the turns, :class:`LoopShare` bounds the loop time of work done
in slices, and the ``*_reason`` functions say why a request is refused. docs/design.md, "Admission".
"""

from __future__ import annotations

import math
from collections import deque

import attrs
import trio

from runtime.settings.control_plane import DEFAULT_WIRE_WORK_BURST_S, IngestSettings

LIVENESS_RPCS = frozenset({"heartbeat", "register_worker", "leave_worker", "presence"})
"""The work that is never shed and may use the reserved connections (``presence``: this
replica's own liveness record, not an RPC)."""


@attrs.frozen(kw_only=True)
class Load:
    """How loaded the ingest is as a request arrives: the loop's worst lag over the last second,
    the requests other than liveness work holding a turn and waiting for one, and whether this
    request would have to wait."""

    lag_s: float
    in_progress: int
    waiting: int
    would_wait: bool


def shed_reason(rpc: str, load: Load, *, cp_id: str, settings: IngestSettings) -> str | None:
    """The busy message refusing ``rpc`` (snake_case) as it arrives under ``load``, naming
    the replica, the measures and their limits; None when it may go ahead (liveness work always).
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
    """How long a request arriving at trio time ``now`` may wait for its turn, in seconds: up to
    ``liveness_connection_wait_s`` or ``max_admission_wait_s``, never past ``deadline``."""
    limit_s = settings.liveness_connection_wait_s if liveness else settings.max_admission_wait_s
    return max(0.0, min(limit_s, deadline - now))


def turn_timeout_reason(
    rpc: str, *, waited_s: float, in_progress: int, cp_id: str, settings: IngestSettings
) -> str:
    """The busy message for ``rpc``, which waited ``waited_s`` seconds for its turn in vain
    while ``in_progress`` requests held one."""
    return (
        f"busy: {cp_id} had no turn for {rpc} within {waited_s:.2f} s "
        f"(limit {settings.max_admission_wait_s:g} s; {in_progress} requests in progress, "
        f"limit {settings.max_requests_in_progress}), try another replica"
    )


def queue_full_reason(
    *, pending: int, counted_s_ago: float, cp_id: str, settings: IngestSettings
) -> str | None:
    """The busy message refusing a submission while ``pending`` (counted ``counted_s_ago``
    seconds ago) reaches ``max_pending_jobs`` (0: no limit), or None."""
    limit = settings.max_pending_jobs
    if not limit or pending < limit:
        return None
    return (
        f"busy: {pending} jobs pending (counted {counted_s_ago:.2f} s ago), limit {limit} "
        f"(max_pending_jobs); nothing was stored, try again when the queue is shorter ({cp_id})"
    )


@attrs.define(eq=False)
class AdmissionGate:
    """Turns for the ingest's requests: ``size`` in all (the pool's connections), ``reserved``
    of them for liveness work (``0 < reserved < size``), and at most ``max_other`` for other work.

    Waiting requests are served liveness first, then in arrival order; a released turn is handed
    to the next waiter directly, so a later request never overtakes one that waits.
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
        """Take a turn, waiting for one if needed (a cancelled wait takes none); pair with
        :meth:`release`."""
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
    """A token bucket of the ingest loop's time for the sliced CPU work of requests other than
    liveness work (docs/design.md, "Admission", rule 5): tokens (seconds of loop time) accrue at
    ``share`` per second up to ``burst_s``; a slice spends what it took; a negative balance is
    paid back by pausing (0 < ``share`` <= 1).
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
        return max(0.0, -self.tokens_s) / self.share
