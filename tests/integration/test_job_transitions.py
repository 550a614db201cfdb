"""Every interleaving of finish, cancel, worker death, fence, clean stop and requeue, on the real
database.

A job's and an assignment's state change only through these transitions (schema.sql and
actors/queries.py), and each is decided from what happened to the job, never from an
acknowledgement alone:

=================================  =================================  ==========================
job                                by                                 decided from
=================================  =================================  ==========================
pending -> assigned                placer (COMMIT_PLACEMENTS, fenced)  free room, live worker
pending -> cancelled               user (CANCEL_JOB)                   the request; nothing runs
assigned -> running                heartbeat (record_heartbeat)        the worker lists it running
assigned/running -> succeeded,     heartbeat or registration           the job's own end (its
  failed                           (record_outcomes)                   outcome)
assigned/running -> cancelled      leader (END_CANCELLED_ASSIGNMENTS)  the worker stopped it or
                                                                       it never started
assigned/running -> pending        leader (END_CANCELLED_ASSIGNMENTS   withdrawn unconfirmed, or
                                   with requeue, END_ORPHANED_...)     its worker dead/restarted/
                                                                       left (stopped cleanly)
assigned/running -> cancelled      leader (END_ORPHANED_ASSIGNMENTS)   worker dead, restarted or
                                                                       left, and a cancel
                                                                       requested
pending -> succeeded, failed       heartbeat or registration           a late outcome of its lost
                                   (record_outcomes)                   assignment, not placed again
=================================  =================================  ==========================

An assignment goes from ``active`` to ``finished`` (an outcome), ``cancelled`` (the worker
answered a Cancel with the id acknowledged: stopped by it, or never started), ``lost`` (worker
dead or registered again) or ``stopped`` (its worker stopped it and left cleanly: its job is
requeued at once, no loss counted); a lost one still records an outcome that arrives late.

The worker's side is the agent's own rules (:class:`agent.acceptance.Admission`, which decides
a Cancel's answer from how each job ended); the control plane's side is the real ingest
handlers and the leader's real statements. Hypothesis draws event orders; every example runs on
fresh workers and a fresh job, and the test asserts what must hold whatever the order.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import attrs
import pytest
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from properties import examples
from serving import HOLD_LEASE

from actors import queries
from actors.ingest import ControlPlaneService
from actors.ingest_gate import SESSION_SETTINGS
from agent.acceptance import Admission
from agent.messages import AssignOrder, CancelOrder, JobOrder
from protocol import pb
from runtime.aio import PgConnection, PgPool, asyncio_bridge
from runtime.jobs import JobSpec, SleepRuntime

EPOCH = 1
EVENTS = (
    "finish",  # a running job ends on its own (succeeded) on its worker, if reachable
    "cancel_request",  # a user cancels the job (CancelJob)
    "leader_cancel",  # the leader sends Cancel for cancel-requested jobs and ends what is acknowledged
    "heartbeat",  # the first worker heartbeats (with the outcomes not yet acknowledged)
    "cut_off",  # the first worker is cut off and fences itself (stops what runs)
    "declare_dead",  # the leader declares the cut-off worker dead
    "leave",  # the first worker stops cleanly: stops what runs, then LeaveWorker with its outcomes
    "reconnect",  # the cut-off (or left) worker registers again (a new incarnation) and heartbeats
    "sweep",  # the leader ends orphaned assignments and requeues their jobs
    "place_again",  # the placer places the job, if pending, on the second worker
)
_example = itertools.count()


@attrs.define
class Worker:
    """One worker as the agent runs it: its acceptance rules, the outcomes not yet
    acknowledged, and whether it is cut off."""

    worker_id: str
    admission: Admission
    unacked: list[pb.JobOutcome] = attrs.field(factory=list)
    cut_off: bool = False
    registrations: int = 0


@attrs.define
class Run:
    """The truth of one run: ``running``, ``succeeded`` (ended on its own) or ``stopped``."""

    worker: Worker
    assignment_id: int
    job_id: int
    state: str = "running"


@attrs.define
class World:
    service: ControlPlaneService
    admin: PgConnection
    job_id: int
    w1: Worker
    w2: Worker
    runs: list[Run] = attrs.field(factory=list)
    cancel_requested: bool = False
    success_delivered: bool = False
    placed_again_before_delivery: bool = False

    def run_of(self, assignment_id: int) -> Run | None:
        return next((r for r in self.runs if r.assignment_id == assignment_id), None)

    def stop(self, worker: Worker, assignment_id: int) -> None:
        """The worker stops a running job (cancel, fence, a heartbeat's stop order)."""
        run = self.run_of(assignment_id)
        if assignment_id in worker.admission.running:
            worker.admission.job_ended(assignment_id, finished=False)
            assert run is not None
            run.state = "stopped"

    async def register(self, worker: Worker) -> None:
        """RegisterWorker with the unacknowledged outcomes, then one heartbeat, as an agent does."""
        for aid in list(worker.admission.running):
            self.stop(worker, aid)  # an agent stops every job before it registers
        reply = await self.service.register_worker(
            pb.RegisterWorkerRequest(
                worker_id=worker.worker_id,
                address="127.0.0.1:9",
                cpu_millis=4000,
                memory_mb=4096,
                finished=list(worker.unacked),
                agent_run_id=f"run-{worker.worker_id}",
                registration_seq=worker.registrations + 1,
            )
        )
        worker.registrations += 1
        self._delivered(worker.unacked)
        worker.unacked.clear()
        worker.admission.registered(int(reply.incarnation), int(reply.epoch))
        worker.cut_off = False
        await self.heartbeat(worker)

    async def heartbeat(self, worker: Worker) -> None:
        if worker.cut_off or worker.admission.fenced:
            return
        sent = list(worker.unacked)
        reply = await self.service.heartbeat(
            pb.HeartbeatRequest(
                worker_id=worker.worker_id,
                incarnation=worker.admission.incarnation or 0,
                running_assignment_ids=list(worker.admission.running),
                finished=sent,
            )
        )
        self._delivered(sent)
        del worker.unacked[: len(sent)]
        if reply.reregister:
            worker.admission.fenced = True
            await self.register(worker)
            return
        for aid in reply.stop_assignment_ids:
            if worker.admission.ended_by_control_plane(aid):
                self.stop(worker, aid)

    def _delivered(self, outcomes: Sequence[pb.JobOutcome]) -> None:
        first = self.runs[0].assignment_id if self.runs else None
        if any(o.assignment_id == first and o.state == "succeeded" for o in outcomes):
            self.success_delivered = True

    async def place(self, worker: Worker) -> None:
        rows = await self.admin.fetch(
            queries.COMMIT_PLACEMENTS,
            [self.job_id],
            [worker.worker_id],
            [worker.admission.incarnation],
            EPOCH,
            True,
            [],
            [],
            [],
            [],
            [],
        )
        aid = rows[0]["assignment_id"]
        if aid is None:
            return
        order = AssignOrder(
            epoch=EPOCH,
            worker_id=worker.worker_id,
            incarnation=worker.admission.incarnation or 0,
            assignments=(
                JobOrder(
                    assignment_id=aid,
                    job_id=self.job_id,
                    spec=JobSpec(
                        name="", cpu_millis=100, memory_mb=16, runtime=SleepRuntime(duration_ms=300)
                    ),
                ),
            ),
        )
        if not worker.admission.assign(order).to_start:
            return  # refused (a cut-off worker): the leader's withdrawal path ends it
        self.runs.append(Run(worker=worker, assignment_id=aid, job_id=self.job_id))
        if worker is self.w2 and not self.success_delivered:
            self.placed_again_before_delivery = True

    async def apply(self, event: str) -> None:
        w1 = self.w1
        match event:
            case "finish":
                run = next((r for r in self.runs if r.state == "running" and not r.worker.cut_off), None)
                if run is not None:
                    run.state = "succeeded"
                    run.worker.admission.job_ended(run.assignment_id, finished=True)
                    run.worker.unacked.append(
                        pb.JobOutcome(
                            assignment_id=run.assignment_id,
                            job_id=self.job_id,
                            state="succeeded",
                            has_exit_code=True,
                            exit_code=0,
                            run_ms=300,
                            detail="exit code 0",
                        )
                    )
            case "cancel_request":
                await self.service.cancel_job(
                    pb.CancelJobRequest(job_id=self.job_id, idempotency_key=f"cancel-{self.job_id}")
                )
                self.cancel_requested = True
            case "leader_cancel":
                await self.leader_cancel()
            case "heartbeat":
                await self.heartbeat(w1)
            case "cut_off":
                if not w1.cut_off:
                    for aid in list(w1.admission.running):
                        self.stop(w1, aid)
                    w1.admission.fenced = True
                    w1.cut_off = True
            case "declare_dead":
                if w1.cut_off:  # invariant 7: a worker is declared dead only after it fenced
                    await self.admin.fetch(
                        queries.DECLARE_DEAD_WORKERS,
                        EPOCH,
                        0.0,
                        [w1.worker_id],
                        [w1.admission.incarnation],
                        None,
                    )
            case "leave":
                if not w1.cut_off and not w1.admission.fenced:
                    for aid in list(w1.admission.running):
                        self.stop(w1, aid)
                    w1.admission.fenced = True
                    sent = list(w1.unacked)
                    await self.service.leave_worker(
                        pb.LeaveWorkerRequest(
                            worker_id=w1.worker_id,
                            incarnation=w1.admission.incarnation or 0,
                            agent_run_id=f"run-{w1.worker_id}",
                            finished=sent,
                        )
                    )
                    self._delivered(sent)
                    del w1.unacked[: len(sent)]
                    w1.cut_off = True  # gone until it starts again (reconnect)
            case "reconnect":
                if w1.cut_off:
                    await self.register(w1)
            case "sweep":
                await self.admin.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, EPOCH, [], 500)
            case "place_again":
                await self.place(self.w2)

    async def leader_cancel(self) -> None:
        """The reconciler's pass over cancel-requested assignments: Cancel on each reachable
        worker, then END_CANCELLED_ASSIGNMENTS for the ids its answer acknowledged."""
        rows = await self.admin.fetch(queries.CANCEL_REQUESTED_ASSIGNMENTS)
        for row in rows:
            worker = self.w1 if row["worker_id"] == self.w1.worker_id else self.w2
            if row["worker_id"] != worker.worker_id or worker.cut_off:
                continue  # the call fails: nothing is ended
            decision = worker.admission.cancel(
                CancelOrder(
                    epoch=EPOCH,
                    worker_id=worker.worker_id,
                    incarnation=int(row["incarnation"]),
                    assignment_ids=(int(row["assignment_id"]),),
                )
            )
            for aid in decision.to_stop:
                self.stop(worker, aid)
            decision = worker.admission.settle_cancel(decision)
            if decision.acknowledged_ids:
                await self.admin.fetch(
                    queries.END_CANCELLED_ASSIGNMENTS,
                    EPOCH,
                    list(decision.acknowledged_ids),
                    "cancelled",
                    False,
                    [],
                )

    async def active_assignments(self) -> int:
        return int(
            await self.admin.fetchval(
                "SELECT count(*) FROM assignments WHERE job_id = $1 AND state = 'active'", self.job_id
            )
        )


@attrs.define
class Database:
    """The ingest's handlers and the leader's connection, on one trio loop that runs in a
    thread of its own for the whole test: every example is played there
    (:meth:`play`), without a new loop, bridge and pool each time."""

    service: ControlPlaneService
    admin: PgConnection
    token: trio.lowlevel.TrioToken
    examples: trio.MemorySendChannel[tuple[Sequence[str], queue.Queue[BaseException | None]]]

    def play(self, events: Sequence[str]) -> None:
        """Play one example on the loop; raises what it raised."""
        result: queue.Queue[BaseException | None] = queue.Queue()
        trio.from_thread.run(self.examples.send, (events, result), trio_token=self.token)
        error = result.get()
        if error is not None:
            raise error


@contextmanager
def database_loop(database_url: str) -> Iterator[Database]:
    ready: queue.Queue[Database | BaseException] = queue.Queue()
    done = threading.Event()

    async def serve() -> None:
        async with asyncio_bridge():
            pool = await PgPool.create(database_url, size=2, server_settings=SESSION_SETTINGS)
            admin = await PgConnection.connect(database_url)
            try:
                await admin.execute(HOLD_LEASE, EPOCH)
                send, receive = trio.open_memory_channel[
                    tuple[Sequence[str], queue.Queue[BaseException | None]]
                ](0)
                db = Database(
                    service=ControlPlaneService(cp_id="cp-1", pool=pool),
                    admin=admin,
                    token=trio.lowlevel.current_trio_token(),
                    examples=send,
                )
                ready.put(db)
                async with trio.open_nursery() as nursery:

                    async def stop() -> None:
                        await trio.to_thread.run_sync(done.wait)
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(stop)
                    async for events, result in receive:
                        try:
                            await _play(db, events)
                        except BaseException as exc:  # handed to the test's thread
                            result.put(exc)
                        else:
                            result.put(None)
            finally:
                await admin.close()
                await pool.close()

    def main() -> None:
        try:
            trio.run(serve)
        except BaseException as exc:
            ready.put(exc)

    thread = threading.Thread(target=main, name="transitions-loop")
    thread.start()
    try:
        db = ready.get()
        if isinstance(db, BaseException):
            raise db
        yield db
    finally:
        done.set()
        thread.join()


async def _play(db: Database, events: Sequence[str]) -> None:
    n = next(_example)
    service, admin = db.service, db.admin
    reply = await service.submit_job(
        pb.SubmitJobRequest(
            spec=pb.JobSpec(
                name=f"t-{n}", cpu_millis=100, memory_mb=16, sleep=pb.SleepRuntime(duration_ms=300)
            ),
            idempotency_key=f"submit-{n}",
        )
    )

    def worker(name: str) -> Worker:
        return Worker(
            worker_id=f"{name}-{n}",
            admission=Admission(worker_id=f"{name}-{n}", cpu_capacity_millis=4000, memory_capacity_mb=4096),
        )

    world = World(service=service, admin=admin, job_id=int(reply.job_id), w1=worker("a"), w2=worker("b"))
    await world.register(world.w1)
    await world.register(world.w2)
    await world.place(world.w1)
    assert world.runs, "the job was placed on the first worker"
    for event in events:
        await world.apply(event)
        assert await world.active_assignments() <= 1, events
    # Contact returns everywhere, whatever still runs ends on its own, and the leader's
    # passes run until nothing changes.
    for _ in range(3):
        for event in ("reconnect", "heartbeat", "sweep", "leader_cancel", "finish"):
            await world.apply(event)
        await world.heartbeat(world.w2)
    await _check(world, events)


async def _check(world: World, events: Sequence[str]) -> None:
    first = world.runs[0]
    row = await world.admin.fetchrow(
        "SELECT state, outcome, exit_code FROM assignments WHERE id = $1", first.assignment_id
    )
    job = await world.admin.fetchrow("SELECT state, exit_code FROM jobs WHERE id = $1", world.job_id)
    assert row is not None and job is not None
    where = f"events {list(events)}: first run {first.state}, assignment {dict(row)}, job {dict(job)}"
    if first.state == "succeeded":
        # The success is on its assignment whatever came after, never overwritten by a cancel.
        assert row["outcome"] == "succeeded" and row["exit_code"] == 0, where
        assert row["state"] in ("finished", "lost", "stopped"), where
        if not world.placed_again_before_delivery:
            assert (job["state"], job["exit_code"]) == ("succeeded", 0), where
    else:
        assert first.state == "stopped", where
        assert row["state"] in ("cancelled", "lost", "stopped") and row["outcome"] is None, where
    if job["state"] == "cancelled":
        assert world.cancel_requested, where
        assert first.state != "succeeded" or world.placed_again_before_delivery, where
    if world.cancel_requested:
        assert job["state"] in ("cancelled", "succeeded"), where
    else:
        assert job["state"] != "cancelled", where


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(events=st.lists(st.sampled_from(EVENTS), max_size=12))
@example(events=["cancel_request", "finish", "leader_cancel", "heartbeat"])
@example(events=["finish", "cut_off", "cancel_request", "declare_dead", "sweep", "reconnect"])
def test_every_order_of_finish_cancel_death_fence_and_requeue_keeps_what_happened(
    database: Database, events: list[str]
) -> None:
    """Whatever the order: a success is never overwritten (by a cancel that came too late, a
    fence, a clean stop or a death after it); a job ends cancelled only if a cancel was asked and no run of it
    had succeeded by then; a requested cancel is never lost; never two active assignments."""
    database.play(events)


def test_a_cancel_that_reaches_the_worker_after_the_job_succeeded_leaves_it_succeeded(
    database: Database,
) -> None:
    """Issue 10, fault 1: the job succeeded on its worker, the user's cancel was acknowledged
    as cancelling, and the leader's Cancel reached the worker before the heartbeat carrying the
    success reached the control plane. The job ends succeeded with exit code 0."""
    database.play(["cancel_request", "finish", "leader_cancel", "heartbeat"])


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    """A fresh database, served on a loop of its own (:func:`database_loop`)."""
    with database_loop(database_url) as db:
        yield db


def test_a_cancel_asked_while_the_worker_is_cut_off_after_its_job_succeeded_leaves_it_succeeded(
    database: Database,
) -> None:
    """The job succeeded, then its worker was frozen before a heartbeat carried the success; a
    cancel was asked meanwhile and the worker declared dead, so the leader's sweep ended the job
    cancelled. When the worker came back its registration carried the success: the job ends
    succeeded with exit code 0 (before, it stayed cancelled, the success kept on the lost
    assignment alone)."""
    database.play(["finish", "cut_off", "cancel_request", "declare_dead", "sweep", "reconnect"])
