"""The agent's registrations (:class:`Registering`): a new incarnation (every job stopped first),
or the continuation of the incarnation whose jobs a restarted agent took over; both through one
loop that retries with a capped, jittered backoff while no control plane answers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import attrs
import trio

from agent import adoption
from agent.joblog import LogEvent
from agent.messages import HeartbeatAnswer, Outcome, Registered, Registration, StopReason
from agent.self_fence import SelfFencing
from agent.state import LOG_EVERY_FAILURES
from runtime.errors import FailedPrecondition, PermissionDenied, StockadeError, TemporaryError


class Registering(SelfFencing):
    """The agent layer that registers, takes over what a previous process left running and
    continues its incarnation."""

    async def _replaced_if_so(self, answer: HeartbeatAnswer) -> None:
        """When another agent process registered this worker's id since this one did, two agents
        share the id: registering again would only take it back, and each would end the other's
        jobs in turn. The later one keeps the id; this one stops every job and ends.

        Raises:
            FailedPrecondition: always, naming the other agent's address and incarnation.
        """
        newer = answer.newer
        if newer is None or newer.agent_run_id == self._run_id:
            return
        self._logger.error(
            "another agent registered this worker's id: stopping",
            other_address=newer.address,
            other_incarnation=newer.incarnation,
            other_agent_run_id=newer.agent_run_id,
        )
        self._leave_live()
        await self._jobs.stop(None, StopReason.REREGISTER)
        raise FailedPrecondition(
            f"another agent registered as worker {self.worker_id} (from {newer.address}, incarnation "
            f"{newer.incarnation}) while this one ran: two agents must not share an id. This one "
            "stopped its jobs and exits; give each agent its own --id"
        )

    def _registration(self, finished: tuple[Outcome, ...], **resume: Any) -> Registration:
        """The registration this agent sends now, carrying ``finished`` (and, to continue an
        incarnation, ``resume_incarnation`` and ``held_assignment_ids``)."""
        return Registration(
            worker_id=self.worker_id,
            address=self.address,
            cpu_millis=self.settings.cpu_millis,
            memory_mb=self.settings.memory_mb,
            labels=dict(self.settings.labels),
            resources=tuple(sorted(self.settings.resources.items())),
            finished=finished,
            agent_run_id=self._run_id,
            registration_seq=self._registrations,
            **resume,
        )

    async def _register_until_answered(
        self,
        request: Callable[[tuple[Outcome, ...], int], Registration | None],
        deadline_s: Callable[[], float],
        *,
        failed: str,
        escalate: bool = False,
        **keys: Any,
    ) -> tuple[Registered, float, int] | None:
        """Send the registration ``request(finished, failures)`` builds (None: give up, and
        return None) until a control plane answers it, each attempt waiting ``deadline_s()``;
        return the reply, its send time and the attempts made.

        Every attempt carries the outcomes no reply has acknowledged yet (``finished``), dropped
        once it succeeded. After a failed attempt it pauses, capped and with full jitter
        (``register_retry_s``, ``register_retry_max_s``). The first failure of a streak is
        logged as ``failed`` with ``keys`` (an error when ``escalate`` and not a
        :class:`TemporaryError`), then every ``LOG_EVERY_FAILURES``-th.

        Raises:
            PermissionDenied: a control plane refused the registration (retrying cannot help).
        """
        self._registrations += 1  # one number for every attempt of this registration
        failures = 0
        while True:
            finished = tuple(self._unacked)
            registration = request(finished, failures)
            if registration is None:
                return None
            sent_at = trio.current_time()
            try:
                reply = await self._cp.register(registration, deadline_s=deadline_s())
            except PermissionDenied as exc:
                self._logger.error("registration refused", error=str(exc))
                raise
            except StockadeError as exc:
                failures += 1
                wait_s = self._register_backoff.delay_s(failures - 1, self._rng)
                if failures % LOG_EVERY_FAILURES == 1:
                    level = "error" if escalate and not isinstance(exc, TemporaryError) else "warning"
                    getattr(self._logger, level)(
                        failed, error=str(exc), attempts=failures, **keys, retry_in_s=round(wait_s, 3)
                    )
                await trio.sleep(wait_s)
                continue
            self._clock_told(reply.database_unix_s, sent_at)
            # Outcomes are only appended, and nothing else drops any while this runs (heartbeats
            # wait for it): the first len(finished) entries are exactly those it carried.
            del self._unacked[: len(finished)]
            return reply, sent_at, failures + 1

    async def _register(self, stop_reason: StopReason) -> None:
        """Stop every job, then register until a control plane answers (new incarnation);
        PermissionDenied when the control plane refused this worker id."""
        self._leave_live()
        await self._jobs.stop(None, stop_reason)
        try:
            answered = await self._register_until_answered(
                lambda finished, _: self._registration(finished),
                self._fence.register_deadline_s,
                failed="registration failed, retrying",
                escalate=True,
            )
        except PermissionDenied as exc:
            raise PermissionDenied(
                f"worker {self.worker_id} cannot register: {exc}; start the agent with the "
                "--id its certificate names, or issue a certificate for this id"
            ) from exc
        assert answered is not None  # a new registration never gives up
        reply, sent_at, attempts = answered
        self._adopt_told(reply.heartbeat_interval_s, reply.dead_after_s)
        self._fence.registered(sent_at, new_incarnation=True)  # before any job of this life can start
        self._admission.registered(reply.incarnation, reply.epoch)
        self._log_event(LogEvent.REGISTER)
        self._logger.info(
            "registered",
            incarnation=reply.incarnation,
            epoch=reply.epoch,
            address=self.address,
            attempts=attempts,
        )
        self._fence.live.set()
        self._registered_once.set()

    def _take_over(self) -> None:
        """Find what the previous agent process of this work folder left running and take it
        over (:mod:`agent.adoption`): jobs that ended meanwhile get their ``stop`` lines and their
        outcomes now, the others a task that watches them; those not to be kept are asked to
        stop. No checkpoint: called before the heartbeat loop, which asks the control plane to
        continue the incarnation of the rest (:meth:`_keep_taken_over`)."""
        found = adoption.survey(
            self.jobs_dir, worker_id=self.worker_id, deadline_path=self.fence_deadline_path
        )
        if not found.found and not found.strays:
            return
        plan = adoption.plan_takeover(
            found,
            cpu_millis=self.settings.cpu_millis,
            memory_mb=self.settings.memory_mb,
            now_s=time.monotonic(),
            min_left_s=self._fence.fence_after_s,
            pidfds=hasattr(os, "pidfd_open"),
        )
        pause_at, kill_at = found.deadline if found.deadline is not None else (None, None)
        self._logger.warning(
            "found jobs of the previous agent process",
            running=len(plan.watch),
            ended=len(plan.settle),
            strays=len(plan.strays),
            keep=len(plan.keep),
            incarnation=plan.incarnation,
            job_ids=[item.record.job_id for item in plan.watch],
            assignment_ids=[item.record.assignment_id for item in plan.watch],
            ended_job_ids=[item.record.job_id for item in plan.settle],
            ended_assignment_ids=[item.record.assignment_id for item in plan.settle],
        )
        for item in plan.settle:
            self._jobs.settle_ended(item)
        for item in plan.watch:
            job = self._jobs.adopt(item, go=self._continued, pause_at_s=pause_at, kill_at_s=kill_at)
            aid = item.record.assignment_id
            if job is None:  # its reaper exited since the survey: it ended on its own terms
                self._jobs.settle_ended(attrs.evolve(item, verdict=adoption.Verdict.ENDED))
            elif aid in plan.stop:
                self._logger.warning(
                    "stopping a job of the previous agent process", why=plan.stop[aid], **job.log_keys
                )
                self._jobs.request_stop(job, StopReason.RESTART)
        self._takeover = plan

    async def _keep_taken_over(self) -> bool:
        """Stop what :meth:`_take_over` is not to keep and wait until it is gone, then ask the
        control plane to continue the incarnation of the rest. True when it did; False: register
        a new incarnation, stopping the rest first."""
        plan, self._takeover = self._takeover, None
        if plan is None:
            return False
        await adoption.stop_strays(plan.strays, stop_grace_s=self.settings.stop_grace_s)
        for stray in plan.strays:  # their cgroups were kept for them at start
            await self._jobs.release_cgroup(os.path.basename(stray.cwd))
        await self._jobs.stop(list(plan.stop), StopReason.RESTART)
        if plan.incarnation is None:
            return False
        return await self._continue_incarnation(plan.incarnation, set(plan.keep), plan.kill_at_s)

    async def _continue_incarnation(self, incarnation: int, keep: set[int], kill_at_s: float | None) -> bool:
        """Register asking to continue ``incarnation`` with the jobs of ``keep`` still running
        (retrying until their kill deadline ``kill_at_s``, ``time.monotonic()``, is less than a
        fence span ahead). On a reply that continued it: remember what the control plane
        released, stop what it lists as ended, and, if the registration's own fence deadline is
        still ahead, move the deadline on and go live. Returns False when the incarnation was not
        continued, or the reply came too late to resume on: the caller registers anew."""
        held: tuple[int, ...] = ()

        def request(finished: tuple[Outcome, ...], failures: int) -> Registration | None:
            nonlocal held
            held = tuple(
                aid
                for aid in self._jobs.ids()
                if aid in keep and (job := self._jobs.get(aid)) is not None and not job.stop.is_set()
            )
            if not held:
                self._logger.info(
                    "nothing left to keep of the previous agent process", incarnation=incarnation
                )
                return None
            if kill_at_s is not None and time.monotonic() > kill_at_s - self._fence.fence_after_s:
                self._logger.warning(
                    "no control plane answered before the jobs' kill deadline: registering anew",
                    incarnation=incarnation,
                    attempts=failures,
                )
                return None
            return self._registration(finished, resume_incarnation=incarnation, held_assignment_ids=held)

        answered = await self._register_until_answered(
            request,
            self._fence.call_deadline_s,
            failed="continuing the incarnation failed, retrying",
            incarnation=incarnation,
        )
        if answered is None:
            return False
        reply, sent_at, attempts = answered
        if not reply.resumed:
            self._logger.warning(
                "the control plane did not continue the incarnation (declared dead, or registered "
                "again since): stopping the jobs of the previous agent process",
                incarnation=incarnation,
                jobs=len(held),
            )
            return False
        self._adopt_told(reply.heartbeat_interval_s, reply.dead_after_s)
        self._admission.continued(
            incarnation, reply.epoch, released=reply.released_assignment_ids + reply.stop_assignment_ids
        )
        await self._stop_ended(
            "control plane ended kept assignments", reply.stop_assignment_ids, reply.epoch, incarnation
        )
        if trio.current_time() >= sent_at + self._fence.fence_after_s:
            self._logger.warning("incarnation continued too late to resume on", incarnation=incarnation)
            return False
        self._fence.registered(sent_at, new_incarnation=False)  # the reapers resume on it
        self._continued.set()
        self._log_event(LogEvent.REGISTER)
        self._logger.info(
            "continued the incarnation of the previous agent process",
            incarnation=incarnation,
            epoch=reply.epoch,
            kept=len(held) - len(reply.stop_assignment_ids),
            released=len(reply.released_assignment_ids),
            attempts=attempts,
            job_ids=self._job_ids(a for a in held if a not in reply.stop_assignment_ids),
            assignment_ids=[a for a in held if a not in reply.stop_assignment_ids],
            released_assignment_ids=list(reply.released_assignment_ids),
        )
        self._fence.live.set()
        self._registered_once.set()
        return True
