"""ControlPlane.ReadJobLogs: a job's output, relayed from the worker that keeps it.

Any replica answers: the ingest looks the job up, picks its source (:func:`log_source`) and
relays the worker's chunks as the client takes them (:class:`LogRelay`). What the caller is
told in each case, and why: docs/design.md, "Job output, relayed".
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import trio

from actors.validation import check_assignment_id
from protocol import pb
from protocol.bases import WorkerBase
from runtime import log, metrics, validation
from runtime.aio import GrpcChannel, Send, StreamLimits, rpc_deadline
from runtime.errors import Busy, FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, Unavailable
from runtime.settings.control_plane import IngestSettings
from runtime.tls import WORKER, ClientTls, Expected

STREAMS = ("stdout", "stderr")
MAX_OFFSET = 2**63 - 1
"""The largest output offset a read may begin at (a worker's file offset, ``off_t``)."""
_PASSED_ON = ("follow", "has_tail", "tail_lines", "tail_max_bytes", "has_offset")
"""The fields of a ReadJobLogs request that its worker's ReadLogs request carries as they are."""


@attrs.frozen(kw_only=True)
class LogSource:
    """Where a job's output is read: one run (assignment) and the worker that ran it."""

    job_id: int
    assignment_id: int
    worker_id: str
    address: str


def check_read_job_logs(request: pb.ReadJobLogsRequest) -> pb.ReadJobLogsRequest:
    """``request`` with its stream named (``""`` reads as ``"stdout"``).

    Raises:
        InvalidArgument: a job id out of range, an unknown stream, or a tail of more than
            :data:`runtime.validation.MAX_TAIL_LINES` lines.
    """
    validation.check_job_id(request.job_id)
    stream = request.stream or "stdout"
    if stream not in STREAMS:
        raise InvalidArgument("stream", request.stream, "must be stdout or stderr")
    if request.has_tail:
        validation.check_tail_lines(request.tail_lines)
    if request.assignment_id:
        check_assignment_id(request.assignment_id)
    if request.has_offset and request.offset > MAX_OFFSET:
        raise InvalidArgument("offset", request.offset, f"must be at most {MAX_OFFSET}")
    offset = request.offset if request.has_offset else 0
    kept = {field: getattr(request, field) for field in (*_PASSED_ON, "job_id", "assignment_id")}
    return pb.ReadJobLogsRequest(stream=stream, offset=offset, **kept)


def log_source(job_id: int, row: Any, assignment_id: int = 0) -> LogSource:
    """The run whose output a ReadJobLogs of ``job_id`` reads, from the job's row of
    :data:`actors.queries.LOG_SOURCE` (None: no such job), asked for ``assignment_id`` (0:
    the newest run that started).

    Raises:
        NotFound: no job has that id.
        InvalidArgument: it is a sleep job (which writes no output).
        FailedPrecondition: none of its runs (or not the one asked for) has started.
        Unavailable: the run's worker was declared dead or left the cluster.
    """
    if row is None:
        raise NotFound(f"job_id {job_id} not found")
    if row["runtime"] == "sleep":
        raise InvalidArgument(
            "job_id", job_id, "must name a command or container job", detail="a sleep job writes no output"
        )
    if row["assignment_id"] is None and assignment_id:
        raise FailedPrecondition(
            f"job {job_id} has no run with assignment {assignment_id} that started on a worker"
        )
    if row["assignment_id"] is None:
        state, reason = row["state"], row["reason"] or ""
        said = f"{state} ({reason})" if reason else state
        if state in ("succeeded", "failed", "cancelled"):
            raise FailedPrecondition(
                f"job {job_id} never started on a worker: it ended {said}; it has no output"
            )
        if state == "assigned" and row["pending_worker_id"]:
            said = f"assigned to {row['pending_worker_id']}, which has not reported it running"
        raise FailedPrecondition(
            f"job {job_id} has not started yet: it is {said}; its output can be read once it runs "
            "(stockade logs --follow waits for it)"
        )
    source = LogSource(
        job_id=job_id,
        assignment_id=int(row["assignment_id"]),
        worker_id=row["worker_id"],
        address=row["address"],
    )
    gone = {"dead": "was declared dead", "left": "left the cluster (its agent stopped)"}.get(
        row["worker_state"]
    )
    if gone:
        raise Unavailable(
            f"worker {source.worker_id} at {source.address} {gone}: the output of job {job_id} "
            f"(assignment {source.assignment_id}) is kept on that worker only"
        )
    return source


@attrs.define
class LogRelay:
    """Relays a worker's ReadLogs stream to a ReadJobLogs caller; ``tls``: this replica's client
    certificate for calling workers (None: plaintext)."""

    cp_id: str
    settings: IngestSettings
    tls: ClientTls | None = None
    streams: int = 0
    """Streams being relayed now."""
    _channels: dict[tuple[str, str], GrpcChannel] = attrs.field(factory=dict)

    def _channel(self, source: LogSource) -> GrpcChannel:
        key = (source.address, source.worker_id)
        channel = self._channels.get(key)
        if channel is None:
            target = None if self.tls is None else self.tls.target(Expected(WORKER, source.worker_id))
            channel = self._channels[key] = GrpcChannel(source.address, tls=target)
        return channel

    def admit(self) -> None:
        """Raise Busy when this replica relays ``max_log_streams`` streams already."""
        if self.streams >= self.settings.max_log_streams:
            raise Busy(
                f"busy: {self.cp_id} relays {self.streams} output streams already "
                f"(max_log_streams {self.settings.max_log_streams}), try another replica"
            )

    async def relay(self, source: LogSource, request: pb.ReadJobLogsRequest, send: Send) -> None:
        """Send every chunk of ``source``'s output that ``request`` asks for, as the worker sends it.

        Raises:
            Unavailable: the worker could not be reached, sent nothing in time, or its stream
                broke (the message names it and its address).
            FailedPrecondition: the worker keeps no output of that run any more.
            Busy: ``max_log_streams`` streams are relayed already, or the worker serves too many.
        """
        self.admit()
        worker_request = pb.ReadLogsRequest(
            worker_id=source.worker_id,
            job_id=source.job_id,
            assignment_id=source.assignment_id,
            **{field: getattr(request, field) for field in (*_PASSED_ON, "stream", "offset")},
        )
        deadline = rpc_deadline()
        timeout_s = None if math.isinf(deadline) else max(0.001, deadline - trio.current_time())
        self.streams += 1
        metrics.CP_LOG_STREAMS.inc()
        worker = f"worker {source.worker_id} at {source.address}"
        try:
            async with self._channel(source).stream(
                WorkerBase,
                "read_logs",
                worker_request,
                StreamLimits(
                    first_message_s=self.settings.log_open_timeout_s,
                    idle_s=self.settings.log_idle_timeout_s,
                    timeout_s=timeout_s,
                ),
            ) as chunks:
                async for chunk in chunks:
                    await send(chunk)
        except (NotFound, Busy, PermissionDenied, Unavailable) as exc:
            log.get("logs").info(
                "output relay failed",
                job_id=source.job_id,
                assignment_id=source.assignment_id,
                worker_id=source.worker_id,
                stream=request.stream,
                error=str(exc),
            )
            if isinstance(exc, NotFound):
                raise FailedPrecondition(str(exc)) from exc
            if isinstance(exc, Busy):
                raise Busy(f"{worker}: {exc}") from exc
            if isinstance(exc, PermissionDenied):  # a fault of the cluster's: another replica may be let in
                raise Unavailable(f"{worker} refused {self.cp_id}: {exc}") from exc
            raise Unavailable(
                f"{worker} is unreachable ({exc}): the output of job {source.job_id} (assignment "
                f"{source.assignment_id}) is kept on that worker only"
            ) from exc
        finally:
            self.streams -= 1
            metrics.CP_LOG_STREAMS.dec()

    def close(self) -> None:
        """Close the connections to workers."""
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
