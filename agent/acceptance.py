"""The worker's acceptance rules (DESIGN.md invariant 5), as pure bookkeeping without trio.

:class:`Admission` answers an Assign or Cancel request with a decision, doing no I/O and never
waiting, so the agent applies it with no checkpoint in between. The rules, in their order:
docs/design.md, "A worker's acceptance rules".
"""

from __future__ import annotations

import attrs

from agent.messages import (
    AssignDecision,
    AssignOrder,
    CancelDecision,
    CancelOrder,
    JobOrder,
    Refusal,
    RefusalReason,
    WorkerOrder,
)
from agent.runtimes import cannot_run


@attrs.frozen(kw_only=True)
class Reservation:
    """Resources held by one running assignment."""

    cpu_millis: int
    memory_mb: int
    units: frozenset[tuple[str, str]] = frozenset()
    """The device units (name, unit id) it holds."""


def spec_problem(order: JobOrder) -> str | None:
    """Why ``order`` cannot be run at all, or None when its spec is sound."""
    spec = order.spec
    if spec.runtime is None:
        return "no runtime"
    if spec.cpu_millis <= 0:
        return f"cpu_millis must be > 0, got {spec.cpu_millis}"
    if spec.memory_mb <= 0:
        return f"memory_mb must be > 0, got {spec.memory_mb}"
    return cannot_run(spec.runtime)


EPOCH_LEAD_LIMIT = 1000
"""How far a request's epoch may run ahead of the newest the database confirmed to this
worker. A real new leader is a few takeovers ahead at most; a larger jump is refused and does
not raise the newest epoch seen."""


@attrs.define(kw_only=True)
class Admission:
    """The acceptance state of one worker (capacity in millicores and MiB) and the rules that
    read and update it."""

    worker_id: str
    cpu_capacity_millis: int
    memory_capacity_mb: int
    incarnation: int | None = None
    """The current incarnation; None until the first registration."""
    fenced: bool = True
    """True while the worker must not start anything (set and cleared by the agent)."""
    restarting: bool = False
    """True once the agent prepares a planned restart (SIGHUP): what ``fenced`` refuses is
    refused as ``restarting``, the true reason (the jobs run on, no fence is involved)."""
    max_epoch_seen: int = 0
    confirmed_epoch: int = 0
    """The newest epoch a control plane's reply read from the database (registration,
    heartbeats): an Assign or Cancel may run ahead of it (a fresh leader) but only by
    ``EPOCH_LEAD_LIMIT``, so one bogus request cannot make the worker refuse every leader."""
    running: dict[int, Reservation] = attrs.field(factory=dict)
    """Assignment id -> resources, from acceptance until the job has really ended."""
    ended: set[int] = attrs.field(factory=set)
    """Assignment ids that ran and ended in this incarnation."""
    finished: set[int] = attrs.field(factory=set)
    """The ids of ``ended`` whose job ended on its own (an outcome to report: succeeded or
    failed), not stopped by the control plane, a fence or a shutdown."""
    cancelled: set[int] = attrs.field(factory=set)
    """Assignment ids cancelled or ended by the control plane in this incarnation."""
    cpu_used_millis: int = attrs.field(default=0, init=False)
    """CPU reserved by running assignments, in millicores (the sum over ``running``)."""
    memory_used_mb: int = attrs.field(default=0, init=False)
    """Memory reserved by running assignments, in MiB (the sum over ``running``)."""

    @property
    def accepting(self) -> bool:
        """True when rule 2 lets Assign requests through."""
        return not self.fenced and self.incarnation is not None

    def observe_epoch(self, epoch: int) -> None:
        """Raise the newest seen and confirmed epoch to ``epoch`` (a heartbeat or
        registration reply, read from the database)."""
        self.confirmed_epoch = max(self.confirmed_epoch, epoch)
        self.max_epoch_seen = max(self.max_epoch_seen, epoch)

    def registered(self, incarnation: int, epoch: int) -> None:
        """Enter a new incarnation: forget this life's dedup memory and stop being fenced
        (whatever still runs keeps its reservation)."""
        if incarnation != self.incarnation:
            self.ended.clear()
            self.finished.clear()
            self.cancelled.clear()
        self.incarnation = incarnation
        self.observe_epoch(epoch)
        self.fenced = False

    def continued(self, incarnation: int, epoch: int, *, released: tuple[int, ...] = ()) -> None:
        """Keep ``incarnation``, which a restarted agent continued, and stop being fenced: unlike
        :meth:`registered`, this life's memory stays, and ``released`` (the assignments the
        control plane ended) is remembered as cancelled, so a late Assign of one is refused."""
        self.incarnation = incarnation
        self.cancelled.update(released)
        self.observe_epoch(epoch)
        self.fenced = False

    def reserve(
        self,
        assignment_id: int,
        *,
        cpu_millis: int,
        memory_mb: int,
        units: tuple[tuple[str, tuple[str, ...]], ...] = (),
    ) -> None:
        """Hold resources for an accepted job, or one this agent took over from its previous
        process: from now on it is running here (with its device ``units``, (name, ids) pairs)."""
        if assignment_id in self.running:
            return
        held = frozenset((name, unit) for name, ids in units for unit in ids)
        self.running[assignment_id] = Reservation(cpu_millis=cpu_millis, memory_mb=memory_mb, units=held)
        self.cpu_used_millis += cpu_millis
        self.memory_used_mb += memory_mb

    def job_ended(self, assignment_id: int, *, finished: bool) -> None:
        """Release the reservation of an assignment whose job has really ended; ``finished``:
        it ended on its own (its outcome is reported), not stopped."""
        reservation = self.running.pop(assignment_id, None)
        if reservation is not None:
            self.cpu_used_millis -= reservation.cpu_millis
            self.memory_used_mb -= reservation.memory_mb
            self.ended.add(assignment_id)
            if finished:
                self.finished.add(assignment_id)

    def ended_by_control_plane(self, assignment_id: int) -> bool:
        """Remember an id a heartbeat reply said is no longer active; True if it is running."""
        self.cancelled.add(assignment_id)
        return assignment_id in self.running

    def _request_refusal(self, order: WorkerOrder, *, check_fence: bool) -> RefusalReason | None:
        if order.worker_id != self.worker_id:
            return RefusalReason.WRONG_WORKER
        if check_fence and not self.accepting:
            return RefusalReason.RESTARTING if self.restarting else RefusalReason.FENCED
        if order.incarnation != self.incarnation:
            return RefusalReason.WRONG_INCARNATION
        if order.epoch < self.max_epoch_seen:
            return RefusalReason.STALE_EPOCH
        if order.epoch > self.confirmed_epoch + EPOCH_LEAD_LIMIT:
            return RefusalReason.IMPLAUSIBLE_EPOCH
        self.max_epoch_seen = order.epoch
        return None

    def assign(self, order: AssignOrder) -> AssignDecision:
        """Apply the Assign rules to ``order``; reserve resources of what is to be started: the
        orders the caller must start now, each new id once even if the request repeats it."""
        reason = self._request_refusal(order, check_fence=True)
        if reason is not None:
            refused = tuple(Refusal(assignment_id=a.assignment_id, reason=reason) for a in order.assignments)
            return AssignDecision(
                accepted_ids=(), to_start=(), refused=refused, epoch_seen=self.max_epoch_seen
            )
        accepted: list[int] = []
        to_start: list[JobOrder] = []
        refusals: list[Refusal] = []
        for job in order.assignments:
            verdict = self._admit(job)
            if verdict is None:
                accepted.append(job.assignment_id)
                if job.assignment_id not in self.running and job.assignment_id not in self.ended:
                    self.reserve(
                        job.assignment_id,
                        cpu_millis=job.spec.cpu_millis,
                        memory_mb=job.spec.memory_mb,
                        units=job.units,
                    )
                    to_start.append(job)
            else:
                refusals.append(Refusal(assignment_id=job.assignment_id, reason=verdict))
        return AssignDecision(
            accepted_ids=tuple(accepted),
            to_start=tuple(to_start),
            refused=tuple(refusals),
            epoch_seen=self.max_epoch_seen,
        )

    def _admit(self, job: JobOrder) -> RefusalReason | None:
        aid = job.assignment_id
        if aid in self.cancelled:
            return RefusalReason.CANCELLED
        if aid in self.running or aid in self.ended:
            return None  # a duplicate: acknowledged, not run twice
        if spec_problem(job) is not None:
            return RefusalReason.BAD_SPEC
        if (
            self.cpu_used_millis + job.spec.cpu_millis > self.cpu_capacity_millis
            or self.memory_used_mb + job.spec.memory_mb > self.memory_capacity_mb
        ):
            return RefusalReason.NO_ROOM
        if job.units and self.units_held() & {(name, unit) for name, ids in job.units for unit in ids}:
            return RefusalReason.UNITS_HELD
        return None

    def units_held(self) -> set[tuple[str, str]]:
        """The device units (name, unit id) of the jobs running here."""
        return {unit for reservation in self.running.values() for unit in reservation.units}

    def cancel(self, order: CancelOrder) -> CancelDecision:
        """Apply the Cancel rules to ``order``; every acknowledged id is remembered as cancelled.
        The caller stops those that run now, then settles the decision with :meth:`settle_cancel`
        before it replies."""
        reason = self._request_refusal(order, check_fence=False)
        if reason is not None:
            return CancelDecision(
                acknowledged_ids=(),
                to_stop=(),
                refused=tuple(Refusal(assignment_id=aid, reason=reason) for aid in order.assignment_ids),
                epoch_seen=self.max_epoch_seen,
            )
        ids = tuple(dict.fromkeys(order.assignment_ids))
        finished = tuple(aid for aid in ids if aid in self.finished)
        acknowledged = tuple(aid for aid in ids if aid not in self.finished)
        self.cancelled.update(acknowledged)
        return CancelDecision(
            acknowledged_ids=acknowledged,
            to_stop=tuple(aid for aid in acknowledged if aid in self.running),
            refused=(),
            epoch_seen=self.max_epoch_seen,
            finished_ids=finished,
        )

    def settle_cancel(self, decision: CancelDecision) -> CancelDecision:
        """``decision`` once its ``to_stop`` jobs have ended: those that ended on their own
        meanwhile (their outcome is reported) move from acknowledged to finished."""
        late = {aid for aid in decision.to_stop if aid in self.finished}
        if not late:
            return decision
        return attrs.evolve(
            decision,
            acknowledged_ids=tuple(aid for aid in decision.acknowledged_ids if aid not in late),
            finished_ids=decision.finished_ids + tuple(aid for aid in decision.to_stop if aid in late),
        )
