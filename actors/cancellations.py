"""Cancellations on workers: the reconciler's requests that a worker stop assignments (withdrawn,
cancelled by a user, past their timeout, drained, preempted), each a background task the pass does not
wait for, and the fenced write that ends what the worker acknowledged (:func:`ending_message`).
docs/design.md, "The reconciler's pass".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import attrs
import trio

from actors.messages import (
    CancelOnWorker,
    DispatcherInbox,
    EndAssignments,
    EndDrainedAssignments,
    EndPreemptedAssignments,
    LedgerInbox,
    WorkerRef,
)
from actors.reconciler_store import Delivery
from runtime import log
from runtime.errors import DatabaseUnavailable, StaleEpoch
from runtime.reply import Reply

CANCEL_REPLY_WAIT_S = 60.0
"""How long a cancellation waits for the dispatcher's reply: one lost with a dispatcher that
restarted frees its assignments for a later pass after this long."""

TIMED_OUT = "timeout"
"""The reason of the leader's stops of runs past their timeout (and their assignments' end)."""

DRAINED = "drained"
"""The end reason of an assignment a drain's deadline stopped."""

PREEMPTED = "preempted"
"""The end reason of an assignment a preemption stopped (docs/preemption.md)."""


def ending_message(
    epoch: int,
    assignment_ids: tuple[int, ...],
    *,
    requeue: bool,
    reason: str,
    requeue_backoff_caps_s: tuple[float, ...],
    reply: Reply[tuple[int, ...]],
) -> EndAssignments | EndDrainedAssignments | EndPreemptedAssignments:
    """The fenced write that ends ``assignment_ids``, which their worker acknowledged
    cancelling, for ``reason``: :class:`EndDrainedAssignments` for :data:`DRAINED`,
    :class:`EndPreemptedAssignments` for :data:`PREEMPTED`, else :class:`EndAssignments`
    (``timed_out`` for :data:`TIMED_OUT`)."""
    if reason == DRAINED:
        return EndDrainedAssignments(epoch=epoch, assignment_ids=assignment_ids, reply=reply)
    if reason == PREEMPTED:
        return EndPreemptedAssignments(epoch=epoch, assignment_ids=assignment_ids, reply=reply)
    return EndAssignments(
        epoch=epoch,
        assignment_ids=assignment_ids,
        requeue=requeue,
        reason=reason,
        requeue_backoff_caps_s=requeue_backoff_caps_s,
        reply=reply,
        timed_out=reason == TIMED_OUT,
    )


Write = Callable[[Callable[[Reply[Any]], LedgerInbox]], Awaitable[Any]]
"""The reconciler's fenced write: a message built around its reply, answered by the ledger."""


@attrs.define
class Cancellations:
    """The cancellations on workers of one term, each a task in the pass's background nursery,
    so a slow worker never holds up the next pass. An assignment whose cancellation is in
    flight is not asked again until that one ends."""

    dispatcher: trio.MemorySendChannel[DispatcherInbox]
    write: Write
    """Ends acknowledged assignments in fenced writes (the reconciler's, sized as it sizes them)."""
    rows: Callable[[], int]
    """How many rows the next fenced write may carry."""
    epoch: int | None = None
    """The epoch of the term whose cancellations run (None: none)."""
    preempt_grace_s: float = 0.0
    """The stop's grace a preemption asks of the worker, seconds (0: the worker's own)."""
    _in_flight: dict[int, trio.CancelScope] = attrs.field(factory=dict)
    """Assignment id -> the scope of the background task cancelling it."""
    _log: Any = attrs.field(factory=lambda: log.get("reconciler"))

    def stop(self) -> None:
        """Cancel the background cancellations of an earlier term (no checkpoint)."""
        for scope in set(self._in_flight.values()):
            scope.cancel()
        self._in_flight.clear()

    def start(
        self,
        background: trio.Nursery,
        epoch: int,
        worker: WorkerRef,
        group: Sequence[Delivery],
        requeue: bool,
        reason: str,
        requeue_backoff_caps_s: tuple[float, ...],
    ) -> None:
        """Cancel the assignments of ``group`` not already in flight on ``worker``, in a task of
        ``background``; once the worker acknowledges, end them for ``reason``
        (:func:`ending_message`)."""
        group = [d for d in group if d.assignment.assignment_id not in self._in_flight]
        if not group:
            return
        if reason in (PREEMPTED, TIMED_OUT):
            logger = self._log.bind(
                epoch=epoch,
                worker_id=worker.worker_id,
                job_ids=[d.assignment.job_id for d in group],
                assignment_ids=[d.assignment.assignment_id for d in group],
            )
            if reason == PREEMPTED:
                logger.info("stopping preempted runs", grace_s=self.preempt_grace_s)
            else:
                logger.warning("stopping runs past their timeout")
        # Marked in flight here, not when the task first runs: the same assignment
        # in two lists of this pass (a drained run a user cancelled) is asked once.
        scope = trio.CancelScope()
        for d in group:
            self._in_flight[d.assignment.assignment_id] = scope
        cancel = partial(self._cancel, epoch, worker, group, requeue, reason, requeue_backoff_caps_s)
        ids = [d.assignment.assignment_id for d in group]
        background.start_soon(self._in_background, scope, epoch, worker, ids, cancel)

    async def _in_background(
        self,
        scope: trio.CancelScope,
        epoch: int,
        worker: WorkerRef,
        ids: list[int],
        cancel: Callable[[], Awaitable[None]],
    ) -> None:
        """``cancel`` (:meth:`_cancel` of ``ids`` on ``worker``) as a task of its own, in
        ``scope`` (which ``_in_flight`` maps those assignments to until it ends); a refused or
        failed ending is logged (a later pass asks again), not raised."""
        logger = self._log.bind(worker_id=worker.worker_id, assignment_ids=ids)
        with scope:
            try:
                await cancel()
            except StaleEpoch as exc:
                logger.info(
                    "cancellation's ending refused: deposed", epoch=exc.epoch, epoch_seen=exc.epoch_seen
                )
            except DatabaseUnavailable as exc:
                logger.warning("cancellation's ending failed", epoch=epoch, error=str(exc))
            finally:
                for assignment_id in ids:
                    if self._in_flight.get(assignment_id) is scope:
                        del self._in_flight[assignment_id]

    async def _cancel(
        self,
        epoch: int,
        worker: WorkerRef,
        group: Sequence[Delivery],
        requeue: bool,
        reason: str,
        caps: tuple[float, ...],
    ) -> None:
        ids = tuple(d.assignment.assignment_id for d in group)
        logger = self._log.bind(epoch=epoch, worker_id=worker.worker_id)
        reply: Reply[tuple[int, ...]] = Reply()
        grace_s = self.preempt_grace_s if reason == PREEMPTED else 0.0
        await self.dispatcher.send(
            CancelOnWorker(
                epoch=epoch,
                worker=worker,
                assignment_ids=ids,
                reply=reply,
                job_ids=tuple(d.assignment.job_id for d in group),
                grace_s=grace_s,
            )
        )
        acknowledged: tuple[int, ...] = ()
        # The worker answers a stop with a grace once its jobs stopped: wait that much longer.
        with trio.move_on_after(CANCEL_REPLY_WAIT_S + grace_s) as waited:
            acknowledged = await reply.wait()
        if waited.cancelled_caught:
            logger.warning(
                "cancellation unanswered: the dispatcher never replied",
                waited_s=CANCEL_REPLY_WAIT_S + grace_s,
                assignment_ids=list(ids),
            )
        if not acknowledged:
            return
        ended: list[int] = []
        remaining = acknowledged
        while remaining:
            rows = self.rows()
            ids, remaining = remaining[:rows], remaining[rows:]
            ended += await self.write(
                lambda reply: ending_message(
                    epoch,
                    ids,  # noqa: B023 (called at once, in this iteration)
                    requeue=requeue,
                    reason=reason,
                    requeue_backoff_caps_s=caps if requeue else (),
                    reply=reply,
                )
            )
        job_of = {d.assignment.assignment_id: d.assignment.job_id for d in group}
        logger.info(
            "ended assignments",
            reason=reason,
            count=len(ended),
            job_ids=[job_of[a] for a in ended if a in job_of],
            assignment_ids=list(ended),
        )
