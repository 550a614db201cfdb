"""Admission to the ingest: liveness work first, a small number of other requests at a time,
new work refused under overload.

DESIGN.md, "Under overload": the heartbeat answers are the last things to slow down, and new
work is shed before liveness work. The ingest (:mod:`actors.ingest`) applies both rules to its
RPCs, split into two classes:

- liveness (:data:`LIVENESS_RPCS`): Heartbeat, RegisterWorker and LeaveWorker, and the
  replica's own presence record. A late heartbeat answer makes a worker fence itself, register
  again and have its jobs placed again: more work for the same saturated processes; a refused
  leave makes a clean stop count as a death, which holds the worker's jobs for ``dead_after``
  and a backoff. These are never refused here.
- everything else: SubmitJob(s), CancelJob, GetJob, ListJobs and Status. Status is read-only
  but runs five queries, and an operator's dashboard polling it adds up: it is shed too.

What a request costs the loop. The ingest serves every RPC on one trio loop (and one thread).
A heartbeat answer waits for the database and for that loop; the loop is shared with
everything the other RPCs do on it, and much of that is not database work: a
``ListJobs(limit=1000)`` reply is 1,000 ``JobInfo`` messages that betterproto2 encodes in pure
Python, 70 to 110 ms in one piece on the 2-core development VM (more with other processes
wanting the CPU), and a 10,000-job ``SubmitJobs`` request takes 200 ms to decode. Bounding only
the requests that hold or wait for a connection (as this module once did) let 90 listings
admitted while the lag was still low then encode their replies for seconds, heartbeats queued
behind them; shedding by lag reacted only after the heartbeats were already late. So:

1. A turn covers all of a request's work (:class:`AdmissionGate`). A request other than
   liveness work holds its turn from admission until its reply is encoded: its database work,
   building the reply and encoding it (the handler encodes it itself, in the turn, and hands
   gRPC the bytes: :class:`protocol.wire.Encoded`); a batch submission's request is decoded
   and checked inside the turn too, so a refused one is never decoded at all. At most
   ``max_requests_in_progress`` (2) hold a turn. Two keep the database and the CPU both busy
   (one request's query runs while the other's reply is encoded); more would not make the loop
   do more work per second, only make every request, heartbeats included, wait behind more.
2. Long work is done in slices (:mod:`protocol.wire`): a large reply is encoded, a large
   request decoded and checked, ``wire_step_messages`` (32) elements at a time, about 2 ms,
   with a checkpoint between slices. A heartbeat's task, at each of its steps (the request
   arriving, its statement, its answer), waits for at most one slice of each request in
   progress. Slicing without rule 1 would not do: with 90 requests in progress a heartbeat
   waits behind 90 slices at every step. Rule 1 without slicing would not do either: one
   reply of a thousand jobs still holds the loop for 100 ms in one piece.
3. The rest is refused at once or soon (:func:`shed_reason`, :func:`turn_timeout_reason`),
   with :class:`runtime.errors.Busy` (gRPC RESOURCE_EXHAUSTED), before any of its work is
   done, when

   - the ingest loop's worst lag over the last second (:attr:`runtime.lag.LoopLag.recent_max_s`)
     exceeds ``shed_lag_s``: every answer of this loop, heartbeat answers included, is already
     that late (the CPU is short for reasons of its own: taking in less is the only lever the
     replica has); or
   - it would have to wait for its turn while ``max_waiting_requests`` others already wait; or
   - it has waited ``max_admission_wait_s`` (1 s) for its turn without getting one: its client
     learns then, not at its own deadline, that it should try another replica or back off.
     (A wait that the client's deadline ends first answers DEADLINE_EXCEEDED, as before.)

   A waiting request costs the loop nothing; a refused one costs the gRPC exchange alone.
4. Submissions are refused while the pending queue holds ``max_pending_jobs`` (20,000)
   (:func:`queue_full_reason`). Past what the cluster can place, every job taken in costs
   CPU that placing and running need (decoding, checking, storing, and a longer queue in every
   placer read): with sleep jobs on the 2-core VM, goodput fell from 890 jobs/s at 1,600
   offered to 477 at 6,400 while the queue grew to 137,000, and the ingest shed nothing until
   its own loop lagged. A refusal is decided before the request is decoded, on a count at
   most ``pending_count_max_age_s`` old, so refusing costs the gRPC exchange alone.
5. The slices together take at most ``max_wire_work_share`` (a quarter) of the loop's time
   (:class:`LoopShare`). Rules 1 and 2 bound how long a heartbeat's trio task waits at each
   step, but not its asyncio side: trio-asyncio runs one asyncio callback per pass of the trio
   loop, in arrival order, and grpclib and asyncpg live there. With two encoders always ready,
   every pass cost two slices for one asyncio callback, and a heartbeat's database reply
   waited behind the callbacks of every refused request before it: 0.2 to 0.5 s in the flood
   test with rules 1 to 3 alone. Paused past their share, the slices leave the loop the time
   to drain that queue.

No cap on one listing's size beyond ``validation.MAX_LIST_LIMIT``: sliced, a 10,000-job
listing costs its own client time and holds one turn longer, not the heartbeats' time.

Reserved connections. The ingest has one pool of ``pool_size`` connections, and the gate
hands out at most ``pool_size`` turns in all (so asyncpg's own queue never holds anyone), at
most ``pool_size - liveness_reserved_connections`` to other work (and at most
``max_requests_in_progress``), and serves waiting liveness requests before waiting others. So
a heartbeat never waits for a connection behind a submission, a listing or a status call, and
when liveness requests need more, every turn that frees up goes to them first. Liveness work
holds its turn only for its database work (its answer is a few bytes). Two separate pools
would give the same reservation, but liveness work could then never use the other pool's idle
connections (a burst of registrations after a partition heals), and the counts the shedding
rule needs would have to be kept beside asyncpg's pools anyway.

A refused request did nothing, so its client may ask another replica at once and, when every
replica is busy, back off and ask again (:class:`runtime.client.ControlPlaneClient`).
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

    Why (the module docstring's rule 5): trio runs every ready task once per pass of its
    loop, and trio-asyncio runs one asyncio callback per pass, in arrival order; grpclib and
    asyncpg (every byte a heartbeat sends or receives) live on that asyncio side. Two encoders
    always ready to run a 2 ms slice would make each pass cost 4 ms for one asyncio callback,
    and a heartbeat's callbacks would queue behind hundreds of others. Capped at ``share`` of
    the loop's time, the slices leave the rest to everything else.

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
