"""The agent's heartbeats (:class:`Heartbeating`): every ``heartbeat_interval_s`` (or sooner,
once, when a moved job starts) one reports what runs and every outcome not acknowledged, and its
reply is obeyed (docs/design.md, "The agent's loops").
"""

from __future__ import annotations

import trio

from agent.fence import EARLY_HEARTBEAT_GATHER_S, early_heartbeat_allowed
from agent.messages import HeartbeatAnswer, HeartbeatReport, StopReason
from agent.registration import Registering
from agent.state import LOG_EVERY_FAILURES
from runtime import metrics
from runtime.errors import StockadeError
from runtime.loops import Periodic


class Heartbeating(Registering):
    """The agent layer that heartbeats and obeys the replies, live or paused."""

    async def _heartbeat_loop(self) -> None:
        if not await self._keep_taken_over():
            # A new incarnation: whatever was taken over and not kept is stopped first.
            await self._register(StopReason.RESTART)
        # Counted from the registration's send time, as after a heartbeat: a slow answer is
        # followed at once (not by a burst), while the deadline runs from the send.
        assert self._fence.last_acked_send_time is not None
        beats = Periodic(self.heartbeat_interval_s, last_at=self._fence.last_acked_send_time)
        failures = 0
        began = self._jobs.began()
        while True:
            beats.interval_s = self.heartbeat_interval_s  # as the cluster tells it
            await self._until_heartbeat(beats, began)
            if self._restart_granted.is_set():
                # The hold is recorded: no heartbeat may move the deadline back before the exit.
                await trio.sleep_forever()
            # Taken before the heartbeat lists what runs: a moved job that starts from here on
            # is in the next one, which it may pull forward.
            began = self._jobs.began()
            ok = await self._heartbeat_once(failures)
            failures = 0 if ok else failures + 1

    async def _until_heartbeat(self, beats: Periodic, began: trio.Event) -> None:
        """Sleep until the next heartbeat is due: the next of ``beats``, or sooner when a job
        placed before started since the last heartbeat (``began``) and an early heartbeat is allowed
        (:func:`agent.fence.early_heartbeat_allowed`); the ticks then count from it."""
        due = beats.next_at()
        with trio.move_on_at(due):
            await began.wait()
            if not early_heartbeat_allowed(trio.current_time(), self._early_heartbeat_at, beats.interval_s):
                await trio.sleep_forever()  # the regular heartbeat reports it
            await trio.sleep(EARLY_HEARTBEAT_GATHER_S)
            self._early_heartbeat_at = beats.last_at = trio.current_time()
            return
        await beats.tick()

    async def _heartbeat_once(self, failures: int) -> bool:
        """Send one heartbeat and obey its reply; False when no control plane answered."""
        self._fence_if_due()  # a thawed agent reports nothing before it has fenced
        incarnation = self._admission.incarnation
        assert incarnation is not None  # the loop registers first
        sent_at = trio.current_time()
        report = self._heartbeat_report(
            incarnation,
            sent_at,
            tuple(self._unacked),
            () if self._usage is None else self._usage.take(),
            restart_hold_ms=0 if self._restart_hold_s is None else round(self._restart_hold_s * 1000),
            waited_ms=round(self._heartbeat_waited_s * 1000),
        )
        # Said by the next heartbeat only when it was sent while live and answered: one sent
        # while paused through an outage measures the outage, not how long the replicas take now.
        live_at_send = self._fence.live.is_set()
        self._heartbeat_waited_s = 0.0
        try:
            answer = await self._cp.heartbeat(report, deadline_s=self._fence.call_deadline_s(failures))
        except StockadeError as exc:
            self._heartbeat_failures.inc()
            if failures % LOG_EVERY_FAILURES == 0:
                self._logger.warning(
                    "heartbeat failed",
                    error=str(exc),
                    failures_in_a_row=failures + 1,
                    fenced=self._fence.self_fenced,
                )
            return False
        round_trip_s = trio.current_time() - sent_at
        self._heartbeat_waited_s = round_trip_s if live_at_send else 0.0
        metrics.AGENT_HEARTBEAT_ROUND_TRIP_SECONDS.observe(round_trip_s)
        self._clock_told(answer.database_unix_s, sent_at)
        if failures:
            self._logger.info("heartbeat answered again", failures_in_a_row=failures)
        await self._on_heartbeat_answer(report, answer, sent_at)
        return True

    async def _on_heartbeat_answer(
        self, report: HeartbeatReport, answer: HeartbeatAnswer, sent_at: float
    ) -> None:
        # A reply that comes after the deadline does not move it: pause (or fence) first.
        self._fence_if_due()
        if self._fence.paused:
            await self._on_answer_while_paused(report, answer, sent_at)
            return
        # Before the deadline moves: the span told with this answer counts from its send time.
        self._adopt_told(answer.heartbeat_interval_s, answer.dead_after_s)
        self._fence.acknowledged(sent_at)
        self._admission.observe_epoch(answer.epoch)
        # Outcomes are only appended while the heartbeat was in flight, and heartbeats are
        # sequential: the first len(report.finished) entries are exactly those it carried.
        del self._unacked[: len(report.finished)]
        if self._fence.self_fenced:
            self._logger.info("heartbeat got through while fenced: registering again")
            await self._register(StopReason.SELF_FENCE)
            return
        if answer.reregister:
            await self._register_again(answer, "control plane asked to register again", report.incarnation)
            return
        for aid in answer.stop_assignment_ids:
            self._admission.ended_by_control_plane(aid)
            job = self._jobs.get(aid)
            if job is not None:
                self._logger.info("control plane ended a running assignment", **job.log_keys)
                self._jobs.request_stop(job, StopReason.STOPPED_BY_CONTROL_PLANE)
        if report.restart_hold_ms and answer.restart_hold_granted:
            self._hold_granted(sent_at, report.restart_hold_ms / 1000)

    async def _on_answer_while_paused(
        self, report: HeartbeatReport, answer: HeartbeatAnswer, sent_at: float
    ) -> None:
        """Obey a heartbeat reply while the jobs are paused: register again if asked; else kill
        the jobs whose assignments the reply lists as ended and wait until they are gone; then
        resume the others if the heartbeat's own deadline has not passed, else stay paused."""
        self._admission.observe_epoch(answer.epoch)
        del self._unacked[: len(report.finished)]
        if answer.reregister:
            await self._register_again(
                answer, "control plane asked to register again while paused", report.incarnation
            )
            return
        # As on the live path; the freshness below is judged by the span told. A paused worker
        # still on the span it registered with would never resume while answers take longer.
        self._adopt_told(answer.heartbeat_interval_s, answer.dead_after_s)
        for aid in answer.stop_assignment_ids:
            self._admission.ended_by_control_plane(aid)
        await self._stop_ended(
            "control plane ended paused assignments",
            answer.stop_assignment_ids,
            answer.epoch,
            report.incarnation,
        )
        self._fence_if_due()
        if not self._fence.paused:
            return  # killed meanwhile (the kill deadline passed)
        if trio.current_time() >= sent_at + self._fence.fence_after_s:
            self._logger.info(
                "heartbeat answered too late to resume on", sent_s_ago=round(trio.current_time() - sent_at, 3)
            )
            return
        self._resume(sent_at)

    async def _register_again(self, answer: HeartbeatAnswer, why: str, incarnation: int) -> None:
        """Register again as the reply ``answer`` asks, logging ``why`` (every job is stopped
        first), unless another agent took this worker's id (:meth:`_replaced_if_so`)."""
        await self._replaced_if_so(answer)
        self._logger.warning(why, incarnation=incarnation)
        await self._register(StopReason.REREGISTER)

    def _hold_granted(self, sent_at: float, hold_s: float) -> None:
        """A heartbeat sent at ``sent_at`` recorded a restart hold of ``hold_s``: move the
        deadlines on by it (published for the reapers), stop heartbeating, park the fence
        watcher. No checkpoint."""
        self._fence.publish(sent_at + hold_s + self._fence.fence_after_s)
        self._jobs.record_progress()
        self._leave_live()
        self._restart_granted.set()
        self._logger.warning(
            "restart hold recorded: leaving the jobs to the next agent process",
            hold_s=hold_s,
            jobs=len(self._jobs),
            incarnation=self._admission.incarnation,
        )
