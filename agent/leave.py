"""The agent's leave at a clean stop (:class:`Leaving`): once every job has ended the agent tells
a control plane that its incarnation left, retrying within ``leave_timeout_s`` and heartbeating
meanwhile.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs
import trio

from agent.heartbeat import Heartbeating
from agent.joblog import LogEvent
from agent.messages import Leave, LeaveAnswer
from runtime.backoff import FullJitterBackoff
from runtime.errors import StockadeError, TemporaryError
from runtime.loops import Periodic

T = TypeVar("T")

LEAVE_BACKOFF = FullJitterBackoff(base_s=0.1, cap_s=1.0)
"""The waits between attempts of a leave no control plane answered (:meth:`Leaving._leave`):
jittered, so the workers of a fleet that failed together do not come back together."""


@attrs.define
class _LeaveResult:
    """How a leave went: the answer (None: none came), the attempts made, the last error."""

    error: str
    answer: LeaveAnswer | None = None
    attempts: int = 0


class Leaving(Heartbeating):
    """The agent layer that stops cleanly: heartbeating while its jobs stop, then the leave."""

    async def _leave(self, stopping_since: float) -> None:
        """Say that this worker stopped cleanly, once every job has ended, retrying what no
        control plane answered within ``leave_timeout_s`` while heartbeating; write the
        ``leave`` line at ``stopping_since`` (trio time: when heartbeats stopped). Never raises a
        StockadeError; never called while a job runs."""
        incarnation = self._admission.incarnation
        if incarnation is None:
            return  # never registered: no row of this life to leave
        if len(self._jobs):
            # run() calls this only after the job nursery has closed; a bug otherwise.
            self._logger.error("not leaving: jobs are still running", jobs=self._jobs.ids())
            return
        request = Leave(
            worker_id=self.worker_id,
            incarnation=incarnation,
            agent_run_id=self._run_id,
            finished=tuple(self._unacked),
        )
        result = await self._heartbeating(lambda: self._leave_attempts(request))
        answer = result.answer
        left = answer is not None and answer.left
        if answer is not None:
            self._admission.observe_epoch(answer.epoch)
            del self._unacked[: len(request.finished)]
        self._log_event(LogEvent.LEAVE, at=stopping_since, left=left)
        if left:
            self._logger.info(
                "left the cluster",
                incarnation=incarnation,
                outcomes=len(request.finished),
                attempts=result.attempts,
            )
        else:
            self._logger.warning(
                "leave not recorded: the control planes will declare this worker dead",
                incarnation=incarnation,
                attempts=result.attempts,
                error=result.error if answer is None else answer.detail,
            )

    async def _heartbeating(self, work: Callable[[], Awaitable[T]]) -> T:
        """``await work()`` (a step of a clean stop: stopping the jobs, leaving) while heartbeating
        every ``heartbeat_interval_s`` (:meth:`_heartbeat_while_stopping`); at once when this
        worker never registered."""
        incarnation = self._admission.incarnation
        if incarnation is None:
            return await work()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._heartbeat_while_stopping, incarnation)
            result = await work()
            nursery.cancel_scope.cancel()
        return result

    async def _heartbeat_while_stopping(self, incarnation: int) -> None:
        """Heartbeat every ``heartbeat_interval_s`` until cancelled, reporting what still runs and no
        outcome (the leave carries them); the answers are not obeyed but for the epoch and the
        database's clock. Without it a worker whose jobs take a while to stop, or whose leave
        waits, would be declared dead before its leave arrives."""
        beats = Periodic(self.heartbeat_interval_s, last_at=self._fence.last_acked_send_time)
        while True:
            await beats.tick()
            sent_at = trio.current_time()
            report = self._heartbeat_report(incarnation, sent_at, ())
            try:
                answer = await self._cp.heartbeat(report, deadline_s=self._stopping_call_s())
            except StockadeError:
                continue  # the leave says what fails
            self._admission.observe_epoch(answer.epoch)
            self._clock_told(answer.database_unix_s, sent_at)

    def _stopping_call_s(self) -> float:
        """How long a heartbeat or a leave attempt of a clean stop waits for its answer, in
        seconds: ``heartbeat_timeout_s`` for each control plane, and one more (hedged)."""
        return self.settings.heartbeat_timeout_s * (len(self.settings.control_planes) + 1)

    async def _leave_attempts(self, request: Leave) -> _LeaveResult:
        """Send ``request`` until a control plane answers it, for at most ``leave_timeout_s`` from
        the first attempt, retried with backoff; never raises a StockadeError."""
        settings = self.settings
        attempt_s = self._stopping_call_s()
        result = _LeaveResult(error=f"no control plane answered within {settings.leave_timeout_s:g} s")
        rng = random.Random()
        deadline = math.inf
        while True:
            async with self._leave_turns:
                if result.attempts == 0:
                    deadline = trio.current_time() + settings.leave_timeout_s
                timeout_s = min(deadline - trio.current_time(), attempt_s)
                if timeout_s <= 0:
                    return result
                result.attempts += 1
                result.error = f"no control plane answered within {timeout_s:.2f} s"
                with trio.move_on_after(timeout_s):
                    try:
                        result.answer = await self._cp.leave(request, deadline_s=timeout_s)
                        return result
                    except TemporaryError as exc:  # unreachable, busy, no database: try again
                        result.error = str(exc)
                    except StockadeError as exc:  # refused for good (a field out of range)
                        result.error = str(exc)
                        return result
            wait_s = LEAVE_BACKOFF.delay_s(result.attempts - 1, rng)
            if trio.current_time() + wait_s >= deadline:
                return result
            await trio.sleep(wait_s)
