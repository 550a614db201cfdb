"""The Worker gRPC service: protobuf in, the agent's messages inside, protobuf out.

Served with ``runtime.aio.trio_service(pb.WorkerBase, WorkerService(agent))``; each method is
a trio coroutine that converts the request, lets :class:`agent.core.Agent` apply the
acceptance rules, and converts the decision back.
"""

from __future__ import annotations

from agent.core import Agent
from agent.messages import (
    AssignOrder,
    CancelOrder,
    JobOrder,
    Refusal,
)
from protocol import pb
from runtime.wire_jobs import job_spec_from_pb


def job_order_from_pb(assignment: pb.Assignment) -> JobOrder:
    """An ``Assignment`` message as a :class:`JobOrder`; its spec's runtime is None when the
    spec names none, or both (no control plane sends that): refused as ``bad_spec``."""
    return JobOrder(
        assignment_id=assignment.assignment_id,
        job_id=assignment.job_id,
        spec=job_spec_from_pb(assignment.spec, strict=False),
        committed_epoch=assignment.committed_epoch,
        array_index=assignment.array_index if assignment.has_array_index else None,
        array_id=assignment.array_id or None if assignment.has_array_index else None,
    )


def assign_order_from_pb(request: pb.AssignRequest) -> AssignOrder:
    """An ``AssignRequest`` as an :class:`AssignOrder`."""
    return AssignOrder(
        epoch=request.epoch,
        worker_id=request.worker_id,
        incarnation=request.incarnation,
        assignments=tuple(job_order_from_pb(a) for a in request.assignments),
    )


def cancel_order_from_pb(request: pb.CancelRequest) -> CancelOrder:
    """A ``CancelRequest`` as a :class:`CancelOrder`."""
    return CancelOrder(
        epoch=request.epoch,
        worker_id=request.worker_id,
        incarnation=request.incarnation,
        assignment_ids=tuple(request.assignment_ids),
    )


def _refusals_to_pb(refused: tuple[Refusal, ...]) -> list[pb.Refusal]:
    return [pb.Refusal(assignment_id=r.assignment_id, reason=r.reason.value) for r in refused]


class WorkerService:
    """Implements the Worker service's RPCs for one agent (trio methods, protobuf messages).

    Args:
        agent: the agent whose rules and jobs answer.
    """

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    async def assign(self, request: pb.AssignRequest) -> pb.AssignReply:
        """Assign: start what the acceptance rules accept; answer accepted and refused ids."""
        decision = self._agent.assign(assign_order_from_pb(request))
        return pb.AssignReply(
            accepted_ids=list(decision.accepted_ids),
            refused=_refusals_to_pb(decision.refused),
            epoch_seen=decision.epoch_seen,
        )

    async def cancel(self, request: pb.CancelRequest) -> pb.CancelReply:
        """Cancel: stop the running ones (waiting until they ended), refuse the never started
        ones forever, and name those that had ended on their own as finished."""
        decision = await self._agent.cancel(cancel_order_from_pb(request))
        return pb.CancelReply(
            acknowledged_ids=list(decision.acknowledged_ids),
            finished_ids=list(decision.finished_ids),
            refused=_refusals_to_pb(decision.refused),
            epoch_seen=decision.epoch_seen,
        )
