"""The agent's pause and self-fence (:class:`SelfFencing`): at the fence deadline every job
pauses; a fresh acknowledged heartbeat resumes them; at the kill deadline they are killed and the
worker self-fences (docs/design.md, "The agent's loops").
"""

from __future__ import annotations

import trio

from agent.joblog import LogEvent
from agent.messages import StopReason
from agent.state import AgentState
from runtime import metrics


class SelfFencing(AgentState):
    """The agent layer that pauses, resumes and self-fences every job at once, and watches the deadlines."""

    def _fence_if_due(self) -> bool:
        """Pause every job now if live and the fence deadline has passed; kill them (self-fence)
        if the kill deadline has passed too. True if it paused or fenced now."""
        if self._fence.kill_due():
            if not self._jobs:
                # Nothing to kill: a self-fence would only throw this incarnation away and
                # register another, for no job's sake. The worker stays paused instead.
                if self._fence.paused:
                    return False
                self._pause_now()
                return True
            self._fence_now()
            return True
        if self._fence.due():
            self._pause_now()
            return True
        return False

    def _pause_now(self) -> None:
        """Pause every job at once, with no checkpoint: refuse work, log it, hold the jobs.

        Command jobs are held by their reapers, which read the same deadline from the file;
        sleep jobs stop counting their duration. They count as paused from the fence deadline
        (or from now, when that came first). With no outage grace this is a self-fence.
        """
        fence = self._fence
        if fence.paused or fence.self_fenced:
            return
        if fence.outage_grace_s() <= fence.fence_after_s and self._jobs:
            self._fence_now()
            return
        now = trio.current_time()
        fenced_at = fence.pause_from(now)
        fence.paused = True
        self._leave_live()
        metrics.AGENT_PAUSES.labels(self.worker_id).inc()
        self._log_event(LogEvent.PAUSE, at=fence.fenced_at)
        kill_at = fence.kill_deadline()
        self._logger.warning(
            "paused every job: no heartbeat acknowledged",
            silent_s=round(now - (fence.last_acked_send_time or 0.0), 3),
            late_s=round(now - fenced_at, 3),
            self_fence_after_s=fence.fence_after_s,
            killed_in_s=None if kill_at is None else round(kill_at - now, 3),
            jobs=len(self._jobs),
            **self._all_jobs_keys(),
        )
        fence.signal_change()

    def _resume(self, sent_at: float) -> None:
        """Resume the paused jobs, with no checkpoint: a heartbeat sent at ``sent_at`` was
        acknowledged, fresh enough that its deadline has not passed. The new deadline is
        published first (the reapers SIGCONT their jobs when they see it)."""
        fence = self._fence
        now = trio.current_time()
        paused_from = fence.fenced_at
        fence.acknowledged(sent_at, resuming=True)
        fence.paused = False
        fence.fenced_at = None
        fence.pause_ended(now)
        self._jobs.record_progress()  # sleep jobs' records: the pause does not count
        self._admission.fenced = False
        fence.live.set()
        metrics.AGENT_RESUMES.labels(self.worker_id).inc()
        self._log_event(LogEvent.RESUME)
        self._logger.warning(
            "resumed every job: a heartbeat was acknowledged",
            paused_s=None if paused_from is None else round(now - paused_from, 3),
            jobs=len(self._jobs),
            **self._all_jobs_keys(),
        )
        fence.signal_change()

    def _fence_now(self) -> None:
        """Self-fence at once, with no checkpoint: refuse work, log it, ask every job to stop
        (paused ones are killed at once). The jobs count as stopped when they paused, or at
        the fence deadline."""
        fence = self._fence
        if fence.self_fenced:
            return
        now = trio.current_time()
        if not fence.paused:
            fence.pause_from(now)
        fence.paused = False
        fence.self_fenced = True
        self._leave_live()
        metrics.AGENT_SELF_FENCES.labels(self.worker_id).inc()
        self._log_event(LogEvent.SELF_FENCE)
        self._logger.warning(
            "self-fenced: no heartbeat acknowledged, stopping every job",
            silent_s=round(now - (fence.last_acked_send_time or 0.0), 3),
            late_s=round(now - (fence.fenced_at or now), 3),
            self_fence_after_s=fence.fence_after_s,
            db_outage_grace_s=self.settings.db_outage_grace_s,
            jobs=len(self._jobs),
            **self._all_jobs_keys(),
        )
        self._jobs.request_stop_all(StopReason.SELF_FENCE)
        fence.signal_change()

    async def _fence_watch(self) -> None:
        """Pause every job once no heartbeat sent in the last ``self_fence_after_s`` was
        answered; kill them once none sent in the last ``db_outage_grace_s`` was."""
        fence = self._fence
        while True:
            if fence.paused:
                kill_at = fence.kill_deadline()
                assert kill_at is not None
                if self._fence_if_due():
                    await self._jobs.stop(None, StopReason.SELF_FENCE)
                    continue
                if trio.current_time() >= kill_at:
                    await fence.changed.wait()  # paused past the grace, holding no job
                    continue
                with trio.move_on_at(kill_at):
                    await fence.changed.wait()
                continue
            if not fence.live.is_set():
                await fence.live.wait()
                continue
            deadline = fence.deadline()
            assert deadline is not None  # set by the registration
            if self._fence_if_due():
                if fence.self_fenced:
                    await self._jobs.stop(None, StopReason.SELF_FENCE)
            else:
                await trio.sleep_until(deadline)
