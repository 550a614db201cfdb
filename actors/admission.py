"""Admission to the ingest's database: liveness work first, new work refused under overload.

DESIGN.md, "Under overload": the heartbeat answers are the last things to slow down, and new
work is shed before liveness work. The ingest (:mod:`actors.ingest`) applies both rules to its
RPCs, split into two classes:

- liveness (:data:`LIVENESS_RPCS`): Heartbeat and RegisterWorker, and the replica's own
  presence record. A late heartbeat answer makes a worker fence itself, register again and
  have its jobs placed again: more work for the same saturated processes. These are never
  refused here.
- everything else: SubmitJob(s), CancelJob, GetJob, ListJobs and Status. Status is read-only
  but runs five queries, and an operator's dashboard polling it adds up: it is shed too.

Reserved capacity (:class:`ConnectionGate`). The ingest has one pool of ``pool_size``
connections, and a gate in front of it that hands out at most ``pool_size`` slots (so asyncpg's
own queue never holds anyone), at most ``pool_size - liveness_reserved_connections`` of them to
other RPCs, and that serves waiting liveness requests before waiting others. So a heartbeat never
waits for a connection behind a submission, a listing or a status call: at least
``liveness_reserved_connections`` connections are out of their reach, and when liveness
requests need more, every other connection that frees up goes to them first. Two separate
pools would give the same reservation, but liveness work could then never use the other pool's
idle connections (a burst of registrations after a partition heals), and the counts the
shedding rule needs would have to be kept beside asyncpg's pools anyway.

Shedding (:func:`shed_reason`). A request that is not liveness work is refused at once, before
it touches the database, with :class:`runtime.errors.Busy` (gRPC RESOURCE_EXHAUSTED) when

- the ingest loop's worst lag over the last second (:attr:`runtime.lag.LoopLag.recent_max_s`)
  exceeds ``shed_lag_s``: every answer of this loop, heartbeat answers included, is already
  that late, and taking in less is the only lever the replica has; or
- it would have to wait for a connection while ``max_waiting_requests`` others already wait:
  its answer would come late anyway, and another replica may have room now.

A refused request did nothing, so its client may ask another replica at once and, when every
replica is busy, back off and ask again (:class:`runtime.client.ControlPlaneClient`).
"""

from __future__ import annotations

from collections import deque

import attrs
import trio

from runtime.settings import IngestSettings

LIVENESS_RPCS = frozenset({"heartbeat", "register_worker", "presence"})
"""The work that is never shed and may use the reserved connections (``presence``: this
replica's own liveness record, not an RPC)."""


@attrs.frozen(kw_only=True)
class Load:
    """How loaded the ingest is at the moment a request arrives.

    Args:
        lag_s: the ingest loop's worst lag over the last second, in seconds.
        waiting: requests other than liveness work already waiting for a connection.
        would_wait: whether this request would have to wait for a connection too.
    """

    lag_s: float
    waiting: int
    would_wait: bool


def shed_reason(rpc: str, load: Load, *, cp_id: str, settings: IngestSettings) -> str | None:
    """Why ``rpc`` must be refused now, or None when it may go ahead (see the module docstring).

    Args:
        rpc: the RPC's method name in snake_case, e.g. ``"submit_jobs"``.
        load: the ingest's load as the request arrives.
        cp_id: this replica's id, named in the answer.
        settings: ``shed_lag_s`` and ``max_waiting_requests``.

    Returns:
        the busy message for the client, naming the replica, the measures and their limits,
        e.g. ``"busy: cp-1 is overloaded (event loop lag 0.42 s, limit 0.25 s; 14 requests
        waiting for the database, limit 16), try another replica"``; None for liveness work,
        which is never refused.
    """
    if rpc in LIVENESS_RPCS:
        return None
    lagging = load.lag_s > settings.shed_lag_s
    queue_full = load.would_wait and load.waiting >= settings.max_waiting_requests
    if not (lagging or queue_full):
        return None
    return (
        f"busy: {cp_id} is overloaded (event loop lag {load.lag_s:.2f} s, limit {settings.shed_lag_s:g} s; "
        f"{load.waiting} requests waiting for the database, limit {settings.max_waiting_requests}), "
        "try another replica"
    )


@attrs.define(eq=False)
class ConnectionGate:
    """Slots for the ingest's ``size`` pooled connections, ``reserved`` of them for liveness work.

    A liveness request may take any free slot; any other request only while fewer than
    ``size - reserved`` other requests hold one. Waiting requests are served liveness first,
    then in arrival order. A released slot is handed to the next waiter directly, so a request
    arriving later never overtakes one that waits.

    Args:
        size: slots in all (the pool's size).
        reserved: slots only liveness requests may take (``0 < reserved < size``).
    """

    size: int
    reserved: int
    _held_liveness: int = 0
    _held_other: int = 0
    _liveness_waiters: deque[trio.Event] = attrs.field(factory=deque)
    _other_waiters: deque[trio.Event] = attrs.field(factory=deque)

    @property
    def held(self) -> int:
        """Slots held now."""
        return self._held_liveness + self._held_other

    @property
    def waiting_other(self) -> int:
        """Requests other than liveness work waiting for a slot."""
        return len(self._other_waiters)

    @property
    def waiting_liveness(self) -> int:
        """Liveness requests waiting for a slot."""
        return len(self._liveness_waiters)

    def would_wait(self, *, liveness: bool) -> bool:
        """Whether a request of this class arriving now would have to wait for a slot."""
        if liveness:
            return bool(self._liveness_waiters) or self.held >= self.size
        return bool(self._liveness_waiters or self._other_waiters) or not self._room_for_other()

    def _room_for_other(self) -> bool:
        return self.held < self.size and self._held_other < self.size - self.reserved

    async def acquire(self, *, liveness: bool) -> None:
        """Take a slot, waiting for one if needed; pair with :meth:`release`.

        A cancelled wait takes no slot.
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
                # Handed a slot in the same moment the wait was cancelled: give it on.
                self.release(liveness=liveness)
            else:
                waiters.remove(granted)
            raise

    def release(self, *, liveness: bool) -> None:
        """Give back a slot taken by :meth:`acquire` with the same ``liveness``."""
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
