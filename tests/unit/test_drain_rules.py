"""Drain and cordon, the decisions as pure functions: the placer never places on a cordoned
worker and says which ones its unschedulable reasons left out; a worker's schedule (cordoned,
draining, drained) from its row; the drain deadline's limits; what the CLI prints and refuses.

The reconciler's part (a drain's deadline stops jobs, and only what the worker acknowledged is
requeued, without a loss) is in tests/unit/test_reconciler.py, with the actor's other passes."""

from __future__ import annotations

import math

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from actors.ingest_replies import schedule_of
from actors.messages import WorkerRef
from actors.pending_queue import PendingJob, PendingQueue
from actors.placer_store import LiveWorker
from actors.rooms import WorkerRoom
from actors.round_plan import not_counting_cordoned, plan_round
from ops.cli import EXIT_INVALID, app
from ops.cli.workers import schedule_line
from ops.config import INSECURE_ENV
from runtime import validation
from runtime.client import ControlPlaneClient
from runtime.errors import InvalidArgument
from runtime.settings.leader import PlacerSettings

SETTINGS = PlacerSettings(initial_window=100, max_unconfirmed_per_worker=100)


def worker(worker_id: str, cpu_millis: int, *, cordoned: bool = False, port: int = 1) -> LiveWorker:
    return LiveWorker(
        ref=WorkerRef(worker_id=worker_id, address=f"127.0.0.1:{port}", incarnation=port),
        room=WorkerRoom(worker_id=worker_id, cpu_millis=cpu_millis, memory_mb=8192),
        cordoned=cordoned,
    )


def queue_of(*jobs: tuple[int, int]) -> PendingQueue:
    queue = PendingQueue()
    queue.replace([PendingJob(job_id=job_id, cpu_millis=cpu, memory_mb=100) for job_id, cpu in jobs])
    return queue


# ---------------------------------------------------------------- the placer


@given(
    st.lists(st.tuples(st.integers(1, 8000), st.booleans()), min_size=1, max_size=6),
    st.lists(st.integers(1, 9000), max_size=30),
)
def test_a_round_never_places_on_a_cordoned_worker(workers: list[tuple[int, bool]], jobs: list[int]) -> None:
    """Whatever the workers' sizes and cordons and the jobs' sizes, no placement names a
    cordoned worker, and every unschedulable reason names the cordoned ones when there are
    any."""
    live = [worker(f"w-{i}", cpu, cordoned=c, port=i + 1) for i, (cpu, c) in enumerate(workers)]
    cordoned = {w.ref.worker_id for w in live if w.cordoned}
    plan = plan_round(queue_of(*enumerate(jobs, 1)), live, SETTINGS, max_rows=500, now=0.0)
    assert not {p.worker_id for p in plan.placements} & cordoned
    for _, reason in plan.reasons:
        if reason and cordoned:
            assert "(not counting cordoned " in reason


def test_a_job_only_a_cordoned_worker_could_hold_says_so() -> None:
    """A 6000-millicore job, the 8000-millicore worker cordoned and a 4000 one free: nothing is
    placed, and the reason is the usual one, naming the cordoned worker it did not count."""
    plan = plan_round(
        queue_of((1, 6000)),
        [worker("w-big", 8000, cordoned=True, port=1), worker("w-small", 4000, port=2)],
        SETTINGS,
        max_rows=10,
        now=0.0,
    )
    assert plan.placements == ()
    assert plan.reasons == (
        (1, "unschedulable: needs 6000 cpu_millis, largest worker has 4000 (not counting cordoned w-big)"),
    )


def test_a_cluster_whose_every_worker_is_cordoned_places_nothing_and_says_why() -> None:
    """Every live worker cordoned: no placement, and the reason says none is counted and
    which were left out."""
    plan = plan_round(
        queue_of((1, 100), (2, 100)),
        [worker("w-1", 4000, cordoned=True, port=1), worker("w-2", 4000, cordoned=True, port=2)],
        SETTINGS,
        max_rows=10,
        now=0.0,
    )
    assert plan.placements == ()
    assert dict(plan.reasons) == dict.fromkeys(
        (1, 2), "unschedulable: no live workers (not counting cordoned w-1, w-2)"
    )


def test_an_uncordoned_worker_is_placed_on_again_and_the_cordon_changes_the_fingerprint() -> None:
    """The same worker, cordoned then not: the first round places nothing, and its
    fingerprint differs from the second's, which places the job (a round skipped as
    unchanged would never see the uncordon)."""
    queue = queue_of((1, 100))
    cordoned = plan_round(queue, [worker("w-1", 4000, cordoned=True)], SETTINGS, max_rows=10, now=0.0)
    free = plan_round(
        queue, [worker("w-1", 4000)], SETTINGS, max_rows=10, now=0.0, idle_fingerprint=cordoned.fingerprint
    )
    assert cordoned.placements == ()
    assert free.fingerprint != cordoned.fingerprint
    assert [(p.job_id, p.worker_id) for p in free.placements] == [(1, "w-1")]


def test_a_reason_names_at_most_three_cordoned_workers() -> None:
    """Past three cordoned workers, a reason says how many more."""
    assert not_counting_cordoned("unschedulable: x", ()) == "unschedulable: x"
    assert (
        not_counting_cordoned("unschedulable: x", ("a", "b", "c", "d", "e"))
        == "unschedulable: x (not counting cordoned a, b, c and 2 more)"
    )


# ---------------------------------------------------------------- a worker's schedule


@pytest.mark.parametrize(
    ("cordoned", "drain_requested", "active_jobs", "expected"),
    [
        (False, False, 0, (False, False, False)),
        (False, False, 3, (False, False, False)),
        (True, False, 3, (True, False, False)),
        (True, True, 3, (True, True, False)),
        (True, True, 0, (True, False, True)),
    ],
)
def test_a_workers_schedule_from_its_row(
    cordoned: bool, drain_requested: bool, active_jobs: int, expected: tuple[bool, bool, bool]
) -> None:
    """Cordoned as stored; draining while a drain was asked and jobs remain; drained once a
    drain was asked and none does."""
    schedule = schedule_of(cordoned=cordoned, drain_requested=drain_requested, active_jobs=active_jobs)
    assert attrs.astuple(schedule) == expected


def test_the_commands_say_what_became_of_the_worker() -> None:
    """One line per schedule: drained, draining with or without a deadline, cordoned, not."""
    common = {"cordoned": True, "draining": False, "drained": False, "drain_deadline_unix_s": 0.0}
    assert schedule_line("w-2", **{**common, "drained": True}, job_ids=[]) == (
        "w-2: drained, no job left; its agent can be stopped"
    )
    assert schedule_line("w-2", **{**common, "draining": True}, job_ids=[12, 13]) == (
        "w-2: draining, 2 jobs (12 13) left; no deadline: waiting for them to end"
    )
    with_deadline = schedule_line(
        "w-2", **{**common, "draining": True, "drain_deadline_unix_s": 1.0e9}, job_ids=[12]
    )
    assert with_deadline.startswith(
        "w-2: draining, 1 job (12) left; stopped and placed elsewhere at 2001-09-"
    )
    assert (
        schedule_line("w-2", **common, job_ids=[12])
        == "w-2: cordoned, no new placements; 1 job (12) still there"
    )
    assert schedule_line("w-2", **{**common, "cordoned": False}, job_ids=[]) == (
        "w-2: not cordoned, takes placements"
    )


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("deadline_s", [-1.0, math.nan, 604_800.001, math.inf])
def test_a_drain_deadline_out_of_range_is_refused_naming_field_value_and_limit(deadline_s: float) -> None:
    """A deadline that is negative, NaN or over a week is refused, naming deadline_s, the
    value and the limit."""
    with pytest.raises(InvalidArgument) as refused:
        validation.check_drain_deadline_s(deadline_s)
    assert str(refused.value) == (
        f"deadline_s must be between 0 and 604800 seconds (one week), got {deadline_s!r}"
    )


def test_a_drain_deadline_of_zero_or_a_week_is_taken() -> None:
    """The bounds themselves are allowed, in seconds and in milliseconds; a millisecond more is
    not."""
    assert validation.check_drain_deadline_s(0.0) == 0.0
    assert validation.check_drain_deadline_s(604_800.0) == 604_800.0
    assert validation.check_drain_deadline_ms(604_800_000) == 604_800_000
    with pytest.raises(
        InvalidArgument, match=r"^deadline_ms must be between 0 and 604800000, got 604800001$"
    ):
        validation.check_drain_deadline_ms(604_800_001)


RANGE = "error: deadline_s must be between 0 and 604800 seconds (one week), got "


@pytest.mark.parametrize(
    ("deadline", "line"),
    [("-1", RANGE), ("604801", RANGE), ("nan", "error: --deadline-s must be a finite number, got 'nan'")],
)
def test_stockade_drain_refuses_a_bad_deadline_before_sending_anything(
    deadline: str, line: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stockade drain w-1 --deadline-s BAD` prints one error line naming the deadline and exits
    2, without calling the cluster (nothing stored); NaN is refused as it is read."""
    monkeypatch.setenv(INSECURE_ENV, "1")

    def no_call(*args: object, **kwargs: object) -> object:
        raise AssertionError("the cluster was called")

    monkeypatch.setattr(ControlPlaneClient, "_attempt", no_call)
    result = CliRunner().invoke(
        app, ["drain", "w-1", "--deadline-s", deadline, "--control-planes", "127.0.0.1:1"]
    )
    assert result.exit_code == EXIT_INVALID
    assert result.output.startswith(line)


def test_stockade_cordon_refuses_a_malformed_worker_id_before_sending_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker id that is not an id is refused naming worker_id, exit 2, nothing sent."""
    monkeypatch.setenv(INSECURE_ENV, "1")

    def no_call(*args: object, **kwargs: object) -> object:
        raise AssertionError("the cluster was called")

    monkeypatch.setattr(ControlPlaneClient, "_attempt", no_call)
    result = CliRunner().invoke(app, ["cordon", "w 1", "--control-planes", "127.0.0.1:1"])
    assert result.exit_code == EXIT_INVALID
    assert result.output.startswith("error: worker_id ")
