"""The agent's view of the control plane: register, heartbeat and leave, behind a small protocol.

The agent talks to the control plane only through :class:`ControlPlane`, so a unit test can pass
a scripted stand-in and drive it on a mock clock. :class:`GrpcControlPlane` is the production
one: it converts to and from protobuf and makes every call a hedged one
(:meth:`runtime.client.ControlPlaneClient.call_hedged`, delayed by :class:`HedgeDelay`).
"""

from __future__ import annotations

import math
from typing import Any, Protocol, TypeVar

import attrs
import betterproto2
import trio

from agent.messages import (
    MAX_OUTCOME_MS,
    HeartbeatAnswer,
    HeartbeatReport,
    Leave,
    LeaveAnswer,
    NewerRegistration,
    Outcome,
    Registered,
    Registration,
)
from protocol import pb
from runtime.client import ControlPlaneClient

M = TypeVar("M", bound=betterproto2.Message)


class ControlPlane(Protocol):
    """What the agent needs from the control plane.

    Every method gives up ``deadline_s`` seconds after it was called and raises
    :class:`runtime.errors.StockadeError` subclasses on failure
    (:class:`runtime.errors.Unavailable` when no replica answered in time); the agent retries.
    """

    async def register(self, request: Registration, *, deadline_s: float) -> Registered: ...

    async def heartbeat(self, request: HeartbeatReport, *, deadline_s: float) -> HeartbeatAnswer: ...

    async def leave(self, request: Leave, *, deadline_s: float) -> LeaveAnswer: ...


def whole_ms(seconds: float) -> int:
    """``seconds`` as whole milliseconds, rounded down (a run never reads longer, nor its end
    earlier, than it was: schema.sql, run_finished_at; past a float's error of a microsecond, so
    a sleep of 0.2 s reads 200), within 0..MAX_OUTCOME_MS."""
    if not math.isfinite(seconds):
        return 0
    return min(MAX_OUTCOME_MS, max(0, math.floor(seconds * 1000 + 1e-3)))


def outcome_to_pb(outcome: Outcome, *, now: float) -> pb.JobOutcome:
    """An :class:`Outcome` as a ``JobOutcome`` message sent at trio time ``now``: its run's
    length, and how long before ``now`` it ended."""
    return pb.JobOutcome(
        assignment_id=outcome.assignment_id,
        job_id=outcome.job_id,
        state=outcome.state.value,
        has_exit_code=outcome.exit_code is not None,
        exit_code=outcome.exit_code if outcome.exit_code is not None else 0,
        run_ms=whole_ms(outcome.run_s),
        ended_ago_ms=whole_ms(now - outcome.ended_at),
        stdout_path=outcome.stdout_path,
        stderr_path=outcome.stderr_path,
        detail=outcome.detail,
    )


def told(reply: pb.RegisterWorkerReply | pb.HeartbeatReply) -> dict[str, Any]:
    """What a registration or heartbeat reply tells besides its answer, each None when the reply
    tells none (0): the database's clock, the heartbeat interval (unchecked; a dead_after told
    with an interval of 0 names an interval of 0, which the agent refuses) and the dead_after."""
    interval_ms, dead_after_ms = reply.heartbeat_interval_ms, reply.dead_after_ms
    return {
        "database_unix_s": reply.database_unix_s or None,
        "heartbeat_interval_s": interval_ms / 1000 if interval_ms or dead_after_ms else None,
        "dead_after_s": dead_after_ms / 1000 if dead_after_ms else None,
    }


def to_pb(request: Registration | HeartbeatReport | Leave, message: type[M]) -> M:
    """``request`` as the protobuf ``message`` whose fields have the same names: tuples as lists,
    its outcomes as ``JobOutcome`` messages sent now (trio's clock)."""
    fields = {
        k: list(v) if isinstance(v, tuple) else v for k, v in attrs.asdict(request, recurse=False).items()
    }
    now = trio.current_time()
    if isinstance(request, Registration):
        fields["resources"] = [pb.ResourceUnits(name=n, units=list(u)) for n, u in request.resources]
    if isinstance(request, HeartbeatReport):
        fields["usage"] = [pb.UsageSample(**attrs.asdict(s)) for s in request.usage]
    return message(**fields | {"finished": [outcome_to_pb(o, now=now) for o in request.finished]})


@attrs.define
class HedgeDelay:
    """How long a call waits for one replica before the next one is asked too, in seconds:
    ``factor`` times the smoothed round trip of the calls that were answered, never below
    ``floor_s`` and never above a third of the call's deadline (room for two more replicas).
    ``weight`` is the newest round trip's in the (exponential) smoothing. Why not a fixed
    delay: docs/design.md, "The agent's calls under load".
    """

    floor_s: float
    factor: float = 3.0
    weight: float = 0.2
    round_trip_s: float | None = None
    """The smoothed round trip (seconds); None before any call was answered."""

    def after_s(self, deadline_s: float) -> float:
        """The delay for a call given ``deadline_s`` seconds."""
        wanted = self.floor_s if self.round_trip_s is None else self.factor * self.round_trip_s
        return max(self.floor_s, min(wanted, deadline_s / 3))

    def answered(self, round_trip_s: float) -> None:
        """Account for a call answered ``round_trip_s`` seconds after it was made."""
        if self.round_trip_s is None:
            self.round_trip_s = round_trip_s
        else:
            self.round_trip_s += self.weight * (round_trip_s - self.round_trip_s)


class GrpcControlPlane:
    """:class:`ControlPlane` over gRPC, through a :class:`ControlPlaneClient` it does not own.

    Args:
        hedge_after_s: the shortest time without an answer from one replica before the next
            one is asked too (:class:`HedgeDelay`).
        home_key: passed with every call: a shared client's worker passes its id, so its calls go
            first to its own home replica; None: the client's own route.
    """

    def __init__(
        self, client: ControlPlaneClient, *, hedge_after_s: float, home_key: str | None = None
    ) -> None:
        self._client = client
        self.hedge = HedgeDelay(floor_s=hedge_after_s)
        self._home_key = home_key

    async def _call(self, rpc: str, request: Any, deadline_s: float) -> Any:
        """Call ``rpc`` hedged and return its reply.

        Raises:
            NoControlPlaneReachable: no replica answered within ``deadline_s``.
            InvalidArgument, NotFound, RemoteError: a replica refused the request.
        """
        began = trio.current_time()
        reply = await self._client.call_hedged(
            rpc,
            request,
            hedge_after_s=self.hedge.after_s(deadline_s),
            deadline_s=deadline_s,
            home_key=self._home_key,
        )
        self.hedge.answered(trio.current_time() - began)
        return reply

    async def register(self, request: Registration, *, deadline_s: float) -> Registered:
        """Call RegisterWorker, carrying the outcomes not yet acknowledged; raises as :meth:`_call`."""
        reply = await self._call("register_worker", to_pb(request, pb.RegisterWorkerRequest), deadline_s)
        return Registered(
            incarnation=reply.incarnation,
            epoch=reply.epoch,
            resumed=reply.resumed,
            stop_assignment_ids=tuple(reply.stop_assignment_ids),
            released_assignment_ids=tuple(reply.released_assignment_ids),
            **told(reply),
        )

    async def heartbeat(self, request: HeartbeatReport, *, deadline_s: float) -> HeartbeatAnswer:
        """Call Heartbeat; raises as :meth:`_call`."""
        reply = await self._call("heartbeat", to_pb(request, pb.HeartbeatRequest), deadline_s)
        return HeartbeatAnswer(
            epoch=reply.epoch,
            stop_assignment_ids=tuple(reply.stop_assignment_ids),
            reregister=reply.reregister,
            restart_hold_granted=reply.restart_hold_granted,
            newer=None
            if not reply.newer_incarnation
            else NewerRegistration(
                agent_run_id=reply.newer_agent_run_id,
                address=reply.newer_address,
                incarnation=reply.newer_incarnation,
            ),
            **told(reply),
        )

    async def leave(self, request: Leave, *, deadline_s: float) -> LeaveAnswer:
        """Call LeaveWorker, carrying the outcomes not yet acknowledged; raises as :meth:`_call`."""
        reply = await self._call("leave_worker", to_pb(request, pb.LeaveWorkerRequest), deadline_s)
        return LeaveAnswer(left=reply.left, epoch=reply.epoch, detail=reply.detail)
