"""The Worker gRPC service of every simulated worker (:class:`SimulatedWorkerService`): sleep jobs
only, with the agent's checks of epoch, incarnation and assignment ids (invariant 5,
docs/design.md)."""

from __future__ import annotations

import time

import attrs
import grpclib.const
import grpclib.exceptions

from ops.bench.loadgen.generator import LoadGenerator, SimulatedWorker, SleepRun
from protocol import pb
from protocol.bases import WorkerBase


@attrs.define
class SimulatedWorkerService(WorkerBase):
    """The Worker service of every simulated worker: sleep jobs only, checked as an agent does."""

    gen: LoadGenerator

    def _worker(self, worker_id: str) -> SimulatedWorker:
        worker = self.gen.workers.get(worker_id)
        if worker is None:
            raise grpclib.exceptions.GRPCError(
                grpclib.const.Status.INVALID_ARGUMENT, f"no worker {worker_id}"
            )
        if worker.killed:
            raise grpclib.exceptions.GRPCError(grpclib.const.Status.UNAVAILABLE, f"{worker_id} is down")
        return worker

    def _refusal(self, worker: SimulatedWorker, epoch: int, incarnation: int) -> str | None:
        if epoch < worker.epoch_seen:
            return "stale_epoch"
        worker.epoch_seen = epoch
        if incarnation != worker.incarnation or worker.registering:
            return "wrong_incarnation"
        return None

    async def assign(self, message: pb.AssignRequest) -> pb.AssignReply:
        worker = self._worker(message.worker_id)
        reason = self._refusal(worker, message.epoch, message.incarnation)
        accepted, refused = [], []
        now = time.monotonic()
        for assignment in message.assignments:
            aid = assignment.assignment_id
            if reason is not None:
                refused.append(pb.Refusal(assignment_id=aid, reason=reason))
            elif aid in worker.cancelled:
                refused.append(pb.Refusal(assignment_id=aid, reason="cancelled"))
            elif aid in worker.accepted:
                accepted.append(aid)  # a duplicate: acknowledged, not run twice
            elif assignment.spec is None or assignment.spec.sleep is None:
                refused.append(pb.Refusal(assignment_id=aid, reason="bad_spec"))
            else:
                worker.accepted.add(aid)
                duration_s = assignment.spec.sleep.duration_ms / 1000
                worker.running[aid] = SleepRun(job_id=assignment.job_id, started=now, ends=now + duration_s)
                accepted.append(aid)
                if assignment.placed_before:
                    self.gen.pull_forward(worker, now)
        return pb.AssignReply(accepted_ids=accepted, refused=refused, epoch_seen=worker.epoch_seen)

    async def cancel(self, message: pb.CancelRequest) -> pb.CancelReply:
        worker = self._worker(message.worker_id)
        reason = self._refusal(worker, message.epoch, message.incarnation)
        worker.settle(time.monotonic())
        acknowledged, finished, refused = [], [], []
        for aid in message.assignment_ids:
            if reason is not None:
                refused.append(pb.Refusal(assignment_id=aid, reason=reason))
            elif aid in worker.cancelled:
                acknowledged.append(aid)  # asked again: stopped already, as an agent answers
            elif aid in worker.finished or (aid in worker.accepted and aid not in worker.running):
                finished.append(aid)
            else:
                worker.running.pop(aid, None)
                worker.cancelled.add(aid)
                acknowledged.append(aid)
        return pb.CancelReply(
            acknowledged_ids=acknowledged,
            finished_ids=finished,
            refused=refused,
            epoch_seen=worker.epoch_seen,
        )
