"""The dispatcher: the leader's gRPC calls to workers (Assign batches, Cancel).

:class:`Dispatch` is fire and forget (the reconciler re-sends a lost batch; the worker
deduplicates); :class:`CancelOnWorker` is answered with the ids the worker acknowledged. At most
``max_concurrent_calls`` at once; a ``stale_epoch`` refusal tells the lease keeper.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import attrs
import trio

from actors.messages import (
    CancelOnWorker,
    CommittedAssignment,
    Connect,
    Dispatch,
    DispatcherInbox,
    EpochSuperseded,
    LeaseInbox,
)
from protocol import pb
from runtime import log
from runtime.aio import GrpcChannel
from runtime.errors import StockadeError
from runtime.gangs import gang_seat_to_pb
from runtime.settings.leader import DispatchSettings
from runtime.tls import WORKER, ClientTls, Expected
from runtime.wire_jobs import job_spec_to_pb


def assignment_message(a: CommittedAssignment) -> pb.Assignment:
    """The wire form of a committed assignment."""
    return pb.Assignment(
        assignment_id=a.assignment_id,
        job_id=a.job_id,
        spec=job_spec_to_pb(a.spec),
        committed_epoch=a.epoch,
        has_array_index=a.array_index is not None,
        array_index=a.array_index or 0,
        array_id=a.array_id or 0,
        placed_before=a.placed_before,
        units=[pb.ResourceUnits(name=name, units=list(ids)) for name, ids in a.units],
        gang=gang_seat_to_pb(a.gang),
    )


class WorkerCalls(Protocol):
    """The two Worker RPCs, by address (a test can script them); the request names the worker
    (``worker_id``) the call is meant for."""

    async def assign(self, address: str, request: pb.AssignRequest, timeout_s: float) -> pb.AssignReply: ...

    async def cancel(self, address: str, request: pb.CancelRequest, timeout_s: float) -> pb.CancelReply: ...


@attrs.define
class GrpcWorkerCalls:
    """:class:`WorkerCalls` over real gRPC, one cached channel per worker and address; with
    ``tls``, mutual TLS that accepts only the certificate of the worker the request names."""

    tls: ClientTls | None = None
    _channels: dict[tuple[str, str], GrpcChannel] = attrs.field(factory=dict)

    def _channel(self, address: str, worker_id: str) -> GrpcChannel:
        key = (address, worker_id)
        channel = self._channels.get(key)
        if channel is None:
            target = None if self.tls is None else self.tls.target(Expected(WORKER, worker_id))
            channel = self._channels[key] = GrpcChannel(address, tls=target)
        return channel

    async def assign(self, address: str, request: pb.AssignRequest, timeout_s: float) -> pb.AssignReply:
        channel = self._channel(address, request.worker_id)
        return await channel.call(channel.stub(pb.WorkerStub).assign, request, timeout_s=timeout_s)

    async def cancel(self, address: str, request: pb.CancelRequest, timeout_s: float) -> pb.CancelReply:
        channel = self._channel(address, request.worker_id)
        return await channel.call(channel.stub(pb.WorkerStub).cancel, request, timeout_s=timeout_s)

    async def connect(self, address: str, worker_id: str, timeout_s: float) -> None:
        """Open the connection to ``worker_id`` at ``address`` now, so its first call does not
        wait for it; raises StockadeError when not open within ``timeout_s``."""
        await self._channel(address, worker_id).connect(timeout_s=timeout_s)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()


@attrs.define
class Dispatcher:
    """The actor."""

    settings: DispatchSettings
    inbox: trio.MemoryReceiveChannel[DispatcherInbox]
    lease_inbox: trio.MemorySendChannel[LeaseInbox]
    calls: WorkerCalls = attrs.field(factory=GrpcWorkerCalls)
    max_concurrent_calls: int = 128
    _log: Any = attrs.field(factory=lambda: log.get("dispatcher"))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve dispatch requests until cancelled."""
        slots = trio.Semaphore(self.max_concurrent_calls)
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                async for message in self.inbox:
                    await slots.acquire()
                    nursery.start_soon(self._serve, message, slots)
        finally:
            if isinstance(self.calls, GrpcWorkerCalls):
                self.calls.close()

    async def _serve(self, message: DispatcherInbox, slots: trio.Semaphore) -> None:
        try:
            match message:
                case Dispatch():
                    await self._assign(message)
                case CancelOnWorker():
                    await self._cancel(message)
                case Connect():
                    await self._connect(message)
        finally:
            slots.release()

    def _stale(self, epoch: int, epoch_seen: int) -> None:
        if epoch_seen > epoch:
            with contextlib.suppress(trio.WouldBlock):
                self.lease_inbox.send_nowait(EpochSuperseded(epoch=epoch, epoch_seen=epoch_seen))

    async def _connect(self, message: Connect) -> None:
        """Open the connections ``message`` names, one after the other (a background task
        that takes one call slot); a worker that cannot be reached is left for its dispatch."""
        if not isinstance(self.calls, GrpcWorkerCalls):
            return
        for worker in message.workers:
            try:
                await self.calls.connect(worker.address, worker.worker_id, self.settings.rpc_timeout_s)
            except StockadeError as exc:
                self._log.debug("connect ahead failed", worker_id=worker.worker_id, error=str(exc))

    async def _assign(self, message: Dispatch) -> None:
        w = message.worker
        request = pb.AssignRequest(
            **_addressed(message), assignments=[assignment_message(a) for a in message.assignments]
        )
        logger = self._log.bind(epoch=message.epoch, worker_id=w.worker_id, incarnation=w.incarnation)
        ids = {
            "job_ids": [a.job_id for a in message.assignments],
            "assignment_ids": [a.assignment_id for a in message.assignments],
        }
        try:
            reply = await self.calls.assign(w.address, request, self.settings.rpc_timeout_s)
        except StockadeError as exc:
            logger.warning("assign failed", count=len(message.assignments), error=str(exc), **ids)
            return
        logger.debug("assigned", **ids)
        if reply.refused:
            reasons = sorted({r.reason for r in reply.refused})
            job_of = {a.assignment_id: a.job_id for a in message.assignments}
            logger.warning(
                "worker refused assignments",
                refused=len(reply.refused),
                reasons=reasons,
                job_ids=[job_of.get(r.assignment_id) for r in reply.refused],
                assignment_ids=[r.assignment_id for r in reply.refused],
                refusals=[r.reason for r in reply.refused],
            )
            if "stale_epoch" in reasons:
                self._stale(message.epoch, reply.epoch_seen)

    async def _cancel(self, message: CancelOnWorker) -> None:
        w = message.worker
        request = pb.CancelRequest(
            **_addressed(message),
            assignment_ids=list(message.assignment_ids),
            grace_ms=round(message.grace_s * 1000),
        )
        logger = self._log.bind(epoch=message.epoch, worker_id=w.worker_id)
        try:
            # A stop with a grace answers once the jobs stopped: up to the grace later.
            reply = await self.calls.cancel(w.address, request, message.grace_s + self.settings.rpc_timeout_s)
        except StockadeError as exc:
            logger.warning(
                "cancel failed",
                job_ids=list(message.job_ids),
                assignment_ids=list(message.assignment_ids),
                error=str(exc),
            )
            message.reply.set(())
            return
        if any(r.reason == "stale_epoch" for r in reply.refused):
            self._stale(message.epoch, reply.epoch_seen)
        if reply.finished_ids:
            # Ended on their own first: their outcome, from a heartbeat, decides their jobs.
            logger.info("cancel came after the jobs ended", assignment_ids=list(reply.finished_ids))
        message.reply.set(tuple(reply.acknowledged_ids))


def _addressed(message: Dispatch | CancelOnWorker) -> dict[str, Any]:
    """The fields that address a request to ``message``'s worker under its epoch: a worker
    refuses a request of an older epoch or another incarnation (DESIGN.md, invariant 5)."""
    return {
        "epoch": message.epoch,
        "worker_id": message.worker.worker_id,
        "incarnation": message.worker.incarnation,
    }
