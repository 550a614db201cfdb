"""The Worker gRPC service: protobuf in, the agent's messages inside, protobuf out.

Served with ``runtime.aio.trio_service(protocol.bases.WorkerBase, WorkerService(agent))``; each method is
a trio coroutine that converts the request, lets :class:`agent.core.Agent` apply the
acceptance rules, and converts the decision back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from agent.core import Agent
from agent.logs import LogQuery, LogReader, check_stream
from agent.messages import AssignOrder, CancelOrder, JobOrder, Refusal
from protocol import pb
from runtime import identifiers
from runtime.errors import InvalidArgument
from runtime.gangs import gang_seat_from_pb
from runtime.validation import check_cancel_grace_ms, check_tail_lines
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
        placed_before=assignment.placed_before,
        units=tuple((u.name, tuple(u.units)) for u in assignment.units),
        gang=gang_seat_from_pb(assignment.gang),
    )


MAX_OFFSET = 2**63 - 1
"""The largest output offset a read may begin at (a file offset, ``off_t``)."""


def log_query_from_pb(request: pb.ReadLogsRequest, worker_id: str) -> LogQuery:
    """A ``ReadLogsRequest`` meant for worker ``worker_id`` as a :class:`agent.logs.LogQuery`;
    InvalidArgument when it names another worker, no job or assignment, an unknown stream, too
    many tail lines or an offset past :data:`MAX_OFFSET`."""
    identifiers.check_id(request.worker_id, field="worker_id")
    if request.worker_id != worker_id:
        raise InvalidArgument("worker_id", request.worker_id, f"must be this worker's id, {worker_id!r}")
    for field, value in (("job_id", request.job_id), ("assignment_id", request.assignment_id)):
        if value < 1:
            raise InvalidArgument(field, value, "must be at least 1")
    if request.has_offset and request.offset > MAX_OFFSET:
        raise InvalidArgument("offset", request.offset, f"must be at most {MAX_OFFSET}")
    return LogQuery(
        job_id=request.job_id,
        assignment_id=request.assignment_id,
        stream=check_stream(request.stream),
        follow=request.follow,
        tail_lines=check_tail_lines(request.tail_lines) if request.has_tail else None,
        tail_max_bytes=request.tail_max_bytes if request.has_tail else 0,
        offset=request.offset if request.has_offset else None,
    )


def _refusals_to_pb(refused: tuple[Refusal, ...]) -> list[pb.Refusal]:
    return [pb.Refusal(assignment_id=r.assignment_id, reason=r.reason.value) for r in refused]


class WorkerService:
    """Implements the Worker service's RPCs for one agent; ``logs`` reads its jobs' output
    (None: ReadLogs finds nothing)."""

    def __init__(self, agent: Agent, logs: LogReader | None = None) -> None:
        self._agent = agent
        self._logs = logs

    async def assign(self, request: pb.AssignRequest) -> pb.AssignReply:
        """Assign: start what the acceptance rules accept; answer accepted and refused ids."""
        assignments = tuple(job_order_from_pb(a) for a in request.assignments)
        decision = self._agent.assign(
            AssignOrder(
                epoch=request.epoch,
                worker_id=request.worker_id,
                incarnation=request.incarnation,
                assignments=assignments,
            )
        )
        return pb.AssignReply(
            accepted_ids=list(decision.accepted_ids),
            refused=_refusals_to_pb(decision.refused),
            epoch_seen=decision.epoch_seen,
        )

    async def cancel(self, request: pb.CancelRequest) -> pb.CancelReply:
        """Cancel: stop the running ones (waiting until they ended; with ``grace_ms`` > 0, a
        preemption's, SIGTERM at once and the kill that long after), refuse the never started
        ones forever, and name those that had ended on their own as finished. InvalidArgument
        (nothing stopped or remembered) when ``grace_ms`` is over
        :data:`runtime.validation.MAX_CANCEL_GRACE_MS`."""
        grace_ms = check_cancel_grace_ms(request.grace_ms)
        decision = await self._agent.cancel(
            CancelOrder(
                epoch=request.epoch,
                worker_id=request.worker_id,
                incarnation=request.incarnation,
                assignment_ids=tuple(request.assignment_ids),
                grace_ms=grace_ms,
            )
        )
        return pb.CancelReply(
            acknowledged_ids=list(decision.acknowledged_ids),
            finished_ids=list(decision.finished_ids),
            refused=_refusals_to_pb(decision.refused),
            epoch_seen=decision.epoch_seen,
        )

    async def read_logs(self, request: pb.ReadLogsRequest) -> AsyncIterator[pb.LogChunk]:
        """ReadLogs: one assignment's stdout or stderr, in chunks (:class:`agent.logs.LogReader`);
        every chunk names this worker and the assignment."""
        query = log_query_from_pb(request, self._agent.worker_id)
        if self._logs is None:
            raise InvalidArgument("assignment_id", query.assignment_id, "names no output this worker serves")
        async for piece in self._logs.read(query):
            yield pb.LogChunk(
                data=piece.data,
                dropped_bytes=piece.dropped_bytes,
                job_ended=piece.job_ended,
                worker_id=self._agent.worker_id,
                assignment_id=query.assignment_id,
                offset=piece.offset,
            )
