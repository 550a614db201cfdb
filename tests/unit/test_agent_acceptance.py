"""The worker's acceptance rules (invariant 5), pure: no trio, no I/O."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from agent.acceptance import EPOCH_LEAD_LIMIT, Admission
from agent.messages import (
    AssignOrder,
    CancelOrder,
    JobOrder,
)
from runtime.jobs import CommandRuntime, JobSpec, SleepRuntime

WORKER = "w-1"


def admission(
    *, incarnation: int | None = 7, epoch: int = 3, cpu: int = 4000, memory: int = 8192
) -> Admission:
    adm = Admission(worker_id=WORKER, cpu_capacity_millis=cpu, memory_capacity_mb=memory)
    if incarnation is not None:
        adm.registered(incarnation, epoch)
    return adm


def job(aid: int, *, cpu: int = 1000, memory: int = 1024, runtime: object = "sleep") -> JobOrder:
    chosen = SleepRuntime(duration_ms=1000) if runtime == "sleep" else runtime
    spec = JobSpec(name="j", cpu_millis=cpu, memory_mb=memory, runtime=chosen)  # type: ignore[arg-type]
    return JobOrder(assignment_id=aid, job_id=aid * 10, spec=spec)


def assign(*jobs: JobOrder, epoch: int = 3, incarnation: int = 7, worker_id: str = WORKER) -> AssignOrder:
    return AssignOrder(epoch=epoch, worker_id=worker_id, incarnation=incarnation, assignments=jobs)


def cancel(*ids: int, epoch: int = 3, incarnation: int = 7, worker_id: str = WORKER) -> CancelOrder:
    return CancelOrder(epoch=epoch, worker_id=worker_id, incarnation=incarnation, assignment_ids=ids)


def reasons(decision: object) -> dict[int, str]:
    return {r.assignment_id: r.reason.value for r in decision.refused}  # type: ignore[attr-defined]


def test_fresh_assignment_is_accepted_and_started() -> None:
    """A valid assignment that fits is accepted, started once, and reserves its resources."""
    adm = admission()
    decision = adm.assign(assign(job(1)))
    assert decision.accepted_ids == (1,)
    assert [j.assignment_id for j in decision.to_start] == [1]
    assert adm.cpu_used_millis == 1000 and adm.memory_used_mb == 1024


def test_wrong_worker_is_refused() -> None:
    """An Assign addressed to another worker id is refused whole with wrong_worker."""
    decision = admission().assign(assign(job(1), job(2), worker_id="w-2"))
    assert reasons(decision) == {1: "wrong_worker", 2: "wrong_worker"}
    assert decision.to_start == ()


def test_unregistered_worker_refuses_as_fenced() -> None:
    """Before the first registration every Assign is refused with fenced."""
    decision = admission(incarnation=None).assign(assign(job(1)))
    assert reasons(decision) == {1: "fenced"}


def test_fenced_worker_refuses_everything() -> None:
    """A self-fenced worker refuses every Assign with fenced, even for its own incarnation."""
    adm = admission()
    adm.fenced = True
    assert reasons(adm.assign(assign(job(1)))) == {1: "fenced"}


def test_wrong_incarnation_is_refused() -> None:
    """An Assign meant for another life of this worker is refused with wrong_incarnation."""
    decision = admission(incarnation=7).assign(assign(job(1), incarnation=6))
    assert reasons(decision) == {1: "wrong_incarnation"}


def test_stale_epoch_is_refused() -> None:
    """An Assign whose epoch is lower than the newest seen is refused with stale_epoch."""
    adm = admission(epoch=5)
    decision = adm.assign(assign(job(1), epoch=4))
    assert reasons(decision) == {1: "stale_epoch"}
    assert decision.epoch_seen == 5


def test_newer_epoch_raises_the_newest_seen() -> None:
    """An accepted Assign with a newer epoch makes older epochs stale from then on."""
    adm = admission(epoch=3)
    assert adm.assign(assign(job(1), epoch=9)).epoch_seen == 9
    assert reasons(adm.assign(assign(job(2), epoch=8))) == {2: "stale_epoch"}


def test_equal_epoch_is_accepted() -> None:
    """An epoch equal to the newest seen is current, not stale."""
    assert admission(epoch=3).assign(assign(job(1), epoch=3)).accepted_ids == (1,)


def test_rules_apply_in_order() -> None:
    """Wrong worker wins over fenced, fenced over wrong incarnation, that over stale epoch."""
    adm = admission(epoch=5)
    adm.fenced = True
    assert reasons(adm.assign(assign(job(1), worker_id="x", incarnation=1, epoch=1))) == {1: "wrong_worker"}
    assert reasons(adm.assign(assign(job(1), incarnation=1, epoch=1))) == {1: "fenced"}
    adm.fenced = False
    assert reasons(adm.assign(assign(job(1), incarnation=1, epoch=1))) == {1: "wrong_incarnation"}


def test_duplicate_is_accepted_but_started_once() -> None:
    """A second Assign of a running id is acknowledged but not started again."""
    adm = admission()
    first = adm.assign(assign(job(1)))
    second = adm.assign(assign(job(1)))
    assert first.accepted_ids == second.accepted_ids == (1,)
    assert len(first.to_start) == 1 and second.to_start == ()
    assert adm.cpu_used_millis == 1000


def test_duplicate_within_one_request_is_started_once() -> None:
    """The same id twice in one request is started once and reserves once."""
    adm = admission()
    decision = adm.assign(assign(job(1), job(1)))
    assert decision.accepted_ids == (1, 1)
    assert len(decision.to_start) == 1
    assert adm.cpu_used_millis == 1000


def test_duplicate_of_an_ended_job_is_accepted_not_rerun() -> None:
    """An Assign of an id that already ran and ended is acknowledged and not run again."""
    adm = admission()
    adm.assign(assign(job(1)))
    adm.job_ended(1, finished=True)
    decision = adm.assign(assign(job(1)))
    assert decision.accepted_ids == (1,) and decision.to_start == ()
    assert adm.cpu_used_millis == 0


def test_cancelled_id_is_refused() -> None:
    """An id cancelled before it arrived is refused with cancelled, forever."""
    adm = admission()
    ack = adm.cancel(cancel(1))
    assert ack.acknowledged_ids == (1,) and ack.to_stop == ()
    assert reasons(adm.assign(assign(job(1)))) == {1: "cancelled"}
    assert reasons(adm.assign(assign(job(1)))) == {1: "cancelled"}


def test_cancel_of_running_id_asks_to_stop_it_and_refuses_it_later() -> None:
    """Cancelling a running id acknowledges it, asks for its stop, and refuses a re-Assign."""
    adm = admission()
    adm.assign(assign(job(1)))
    ack = adm.cancel(cancel(1, 2))
    assert ack.acknowledged_ids == (1, 2) and ack.to_stop == (1,)
    assert reasons(adm.assign(assign(job(1)))) == {1: "cancelled"}


def test_a_cancel_after_the_job_ended_on_its_own_names_it_finished_not_acknowledged() -> None:
    """Issue 10, fault 1: a job that succeeded before its cancel arrived is answered as
    finished (its outcome decides), only the stopped and never-started ids are acknowledged."""
    adm = admission()
    adm.assign(assign(job(1), job(2), job(3)))
    adm.job_ended(1, finished=True)  # succeeded on its own
    adm.job_ended(2, finished=False)  # stopped (a heartbeat reply, a fence)
    decision = adm.cancel(cancel(1, 2, 3, 4))
    assert decision.finished_ids == (1,)
    assert decision.acknowledged_ids == (2, 3, 4) and decision.to_stop == (3,)
    assert 1 not in adm.cancelled


def test_a_job_that_ends_on_its_own_while_being_stopped_is_settled_as_finished() -> None:
    """A running job the cancel asked to stop but that ended on its own first (a process that
    exited 0 as the signal came) moves from acknowledged to finished."""
    adm = admission()
    adm.assign(assign(job(1), job(2)))
    decision = adm.cancel(cancel(1, 2, 3))
    assert decision.to_stop == (1, 2)
    adm.job_ended(1, finished=True)
    adm.job_ended(2, finished=False)
    settled = adm.settle_cancel(decision)
    assert settled.acknowledged_ids == (2, 3) and settled.finished_ids == (1,)


def test_fenced_worker_still_acknowledges_cancel() -> None:
    """A fenced worker runs nothing, so it acknowledges cancels of its incarnation."""
    adm = admission()
    adm.fenced = True
    assert adm.cancel(cancel(5)).acknowledged_ids == (5,)


def test_cancel_checks_worker_incarnation_and_epoch() -> None:
    """Cancel is refused for another worker, another incarnation, or a stale epoch."""
    adm = admission(epoch=5)
    assert reasons(adm.cancel(cancel(1, worker_id="w-9"))) == {1: "wrong_worker"}
    assert reasons(adm.cancel(cancel(1, incarnation=1, epoch=5))) == {1: "wrong_incarnation"}
    assert reasons(adm.cancel(cancel(1, epoch=4))) == {1: "stale_epoch"}
    assert 1 not in adm.cancelled


def test_no_room_when_capacity_would_be_exceeded() -> None:
    """An assignment that does not fit the free CPU or memory is refused with no_room."""
    adm = admission(cpu=2000, memory=2048)
    decision = adm.assign(
        assign(job(1, cpu=1500), job(2, cpu=600), job(3, cpu=500), job(4, cpu=100, memory=1500))
    )
    assert decision.accepted_ids == (1, 3)
    assert reasons(decision) == {2: "no_room", 4: "no_room"}
    assert adm.cpu_used_millis == 2000


def test_room_returns_when_a_job_ends() -> None:
    """Resources of an ended job are free for the next assignment."""
    adm = admission(cpu=1000)
    adm.assign(assign(job(1)))
    assert reasons(adm.assign(assign(job(2)))) == {2: "no_room"}
    adm.job_ended(1, finished=False)
    assert adm.assign(assign(job(2))).accepted_ids == (2,)


def test_bad_spec_is_refused() -> None:
    """No runtime, zero CPU or memory, or an empty argv is refused with bad_spec."""
    decision = admission().assign(
        assign(
            job(1, runtime=None),
            job(2, cpu=0),
            job(3, memory=0),
            job(4, runtime=CommandRuntime(argv=())),
            job(5, runtime=CommandRuntime(argv=("true",))),
        )
    )
    assert reasons(decision) == {1: "bad_spec", 2: "bad_spec", 3: "bad_spec", 4: "bad_spec"}
    assert decision.accepted_ids == (5,)


def test_new_incarnation_forgets_the_old_dedup_memory() -> None:
    """After registering again, old cancelled/ended ids are forgotten (rule 3 guards them)."""
    adm = admission(incarnation=7)
    adm.cancel(cancel(1))
    adm.registered(8, 3)
    assert adm.assign(assign(job(1), incarnation=8)).accepted_ids == (1,)


def test_ended_by_control_plane_refuses_later_assign() -> None:
    """An id a heartbeat reply ended is refused with cancelled if it is assigned later."""
    adm = admission()
    assert adm.ended_by_control_plane(4) is False
    assert reasons(adm.assign(assign(job(4)))) == {4: "cancelled"}


# ---------------------------------------------------------------------------- properties

_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("assign"),
            st.lists(st.integers(1, 6), min_size=1, max_size=4),
            st.integers(0, 6),
            st.integers(1, 2),
        ),
        st.tuples(
            st.just("cancel"),
            st.lists(st.integers(1, 6), min_size=1, max_size=3),
            st.integers(0, 6),
            st.integers(1, 2),
        ),
        st.tuples(st.just("end"), st.integers(1, 6), st.booleans()),
        st.tuples(st.just("fence"), st.booleans()),
    ),
    max_size=40,
)


@settings(max_examples=examples(300), deadline=None)
@given(_ops)
def test_no_id_is_started_twice_and_capacity_holds(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    """Whatever arrives, an id starts at most once, cancelled ids never start, capacity holds,
    and a cancel never acknowledges an id whose job ended on its own (nor names one finished
    that did not)."""
    adm = admission(incarnation=1, epoch=0, cpu=3000, memory=3000)
    started: set[int] = set()
    cancelled: set[int] = set()
    finished: set[int] = set()
    for op in ops:
        kind = op[0]
        if kind == "assign":
            _, ids, epoch, inc = op
            request = assign(*(job(i) for i in ids), epoch=epoch, incarnation=inc)
            decision = adm.assign(request)
            answered = list(decision.accepted_ids) + [r.assignment_id for r in decision.refused]
            assert sorted(answered) == sorted(ids)
            for order in decision.to_start:
                assert order.assignment_id not in started
                assert order.assignment_id not in cancelled
                started.add(order.assignment_id)
            assert adm.cpu_used_millis <= 3000 and adm.memory_used_mb <= 3000
        elif kind == "cancel":
            _, ids, epoch, inc = op
            acks = adm.cancel(cancel(*ids, epoch=epoch, incarnation=inc))
            cancelled.update(acks.acknowledged_ids)
            assert set(acks.to_stop) <= set(adm.running)
            assert not set(acks.acknowledged_ids) & finished
            assert set(acks.finished_ids) <= finished
        elif kind == "end":
            if op[1] in adm.running and op[2]:
                finished.add(op[1])
            adm.job_ended(op[1], finished=op[2])
        else:
            adm.fenced = op[1]
        assert adm.cpu_used_millis == sum(r.cpu_millis for r in adm.running.values())


def test_an_implausible_epoch_is_refused_and_poisons_nothing() -> None:
    """A request claiming an epoch far beyond any the database confirmed (2**64 - 1) is
    refused and does not raise the newest epoch seen, so the real leader still gets through."""
    adm = admission(epoch=7)
    assert reasons(adm.assign(assign(job(1), epoch=2**64 - 1))) == {1: "implausible_epoch"}
    assert adm.max_epoch_seen == 7
    assert reasons(adm.assign(assign(job(2), epoch=8))) == {}  # the real next leader
    assert reasons(adm.assign(assign(job(3), epoch=8 + EPOCH_LEAD_LIMIT))) == {
        1: "implausible_epoch"
    }.fromkeys([3], "implausible_epoch")


def test_a_worker_preparing_a_restart_refuses_as_restarting() -> None:
    """While the agent exits for a planned restart, Assigns are refused as ``restarting``; a
    fence (or any other closed state) is still ``fenced``."""
    adm = admission()
    adm.fenced = adm.restarting = True
    assert reasons(adm.assign(assign(job(1)))) == {1: "restarting"}
    adm.restarting = False
    assert reasons(adm.assign(assign(job(2)))) == {2: "fenced"}
