"""Placement constraints: their text form, their checks, and the placer honouring them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.pending_queue import PendingJob
from actors.placement import place
from actors.rooms import WorkerRoom, unschedulable_reason
from runtime.constraints import Constraint, parse_constraint, satisfied
from runtime.errors import InvalidArgument


@pytest.mark.parametrize(
    ("text", "key", "op", "values"),
    [
        ("gpu=a100", "gpu", "=", ("a100",)),
        ("zone!=b", "zone", "!=", ("b",)),
        ("ssd", "ssd", "exists", ()),
        ("zone in (a, b)", "zone", "in", ("a", "b")),
        ("example.com/rack=r1", "example.com/rack", "=", ("r1",)),
    ],
)
def test_the_four_operators_parse(text: str, key: str, op: str, values: tuple[str, ...]) -> None:
    """``key=value``, ``key!=value``, ``key`` and ``key in (a,b)`` parse to their operator."""
    constraint = parse_constraint(text)
    assert (constraint.key, constraint.op, constraint.values) == (key, op, values)
    assert parse_constraint(constraint.describe()) == constraint


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("=a100", "must not be empty"),
        ("gpu=a\x00", "NUL"),
        ("gpu ~ a100", "must be key=value"),
        ("gpu >= 2", "must be key=value"),
        ("", "must not be empty"),
        ("zone in ()", "zone in"),
    ],
)
def test_bad_constraints_are_refused_naming_the_text(text: str, words: str) -> None:
    """A constraint with no key, a NUL or an unknown operator is refused, the message naming
    the field and what was given."""
    with pytest.raises(InvalidArgument) as caught:
        parse_constraint(text, field="constraint")
    assert caught.value.field == "constraint"
    assert words in str(caught.value)


def test_an_unknown_operator_on_the_wire_is_refused() -> None:
    """A constraint message whose op is none of the four is refused naming ``op``."""
    with pytest.raises(InvalidArgument, match=r"constraints\[0\]\.op must be one of"):
        Constraint(key="gpu", op="~", values=("a",)).check("constraints[0]")


@given(
    labels=st.dictionaries(st.sampled_from(["gpu", "zone", "ssd"]), st.sampled_from(["a", "b", "c"])),
    key=st.sampled_from(["gpu", "zone", "ssd"]),
    value=st.sampled_from(["a", "b", "c"]),
)
def test_not_equal_is_the_negation_of_equal(labels: dict[str, str], key: str, value: str) -> None:
    """For any labels, ``key!=v`` holds exactly when ``key=v`` does not."""
    equal = Constraint(key=key, op="=", values=(value,))
    unequal = Constraint(key=key, op="!=", values=(value,))
    assert equal.matches(labels) != unequal.matches(labels)
    assert satisfied((), labels)


def _gpu_job(job_id: int = 1, *, cpu: int = 500) -> PendingJob:
    return PendingJob(
        job_id=job_id, cpu_millis=cpu, memory_mb=100, constraints=(parse_constraint("gpu=a100"),)
    )


def test_a_constrained_job_goes_only_to_an_eligible_worker() -> None:
    """Best fit would pick the fuller worker; the job goes to the one labelled gpu=a100."""
    workers = [
        WorkerRoom(worker_id="w-1", cpu_millis=1000, memory_mb=1000, cpu_allocated_millis=400),
        WorkerRoom(worker_id="w-2", cpu_millis=4000, memory_mb=4000, labels={"gpu": "a100"}),
    ]
    plan = place([_gpu_job()], workers)
    assert plan.placements == ((1, "w-2"),)


def test_a_constrained_job_waits_without_blocking_others() -> None:
    """With its only eligible worker full, the job waits (no reason: it fits one day) and
    unconstrained jobs behind it are placed."""
    workers = [
        WorkerRoom(worker_id="w-1", cpu_millis=1000, memory_mb=1000),
        WorkerRoom(
            worker_id="w-2",
            cpu_millis=1000,
            memory_mb=1000,
            cpu_allocated_millis=1000,
            labels={"gpu": "a100"},
        ),
    ]
    plan = place([_gpu_job(1), PendingJob(job_id=2, cpu_millis=500, memory_mb=100)], workers)
    assert plan.placements == ((2, "w-1"),)
    assert plan.unschedulable == {}


def test_the_unschedulable_reason_names_the_constraint_no_worker_has() -> None:
    """No live worker has gpu=a100: the reason says so, naming the constraint."""
    workers = [WorkerRoom(worker_id="w-1", cpu_millis=1000, memory_mb=1000, labels={"gpu": "t4"})]
    plan = place([_gpu_job()], workers)
    assert plan.unschedulable == {1: "unschedulable: no live worker has gpu=a100"}


def test_constraints_each_met_but_never_together_are_named_together() -> None:
    """Each constraint holds on some worker but none holds both: the reason names both."""
    job = PendingJob(
        job_id=1,
        cpu_millis=1,
        memory_mb=1,
        constraints=(parse_constraint("gpu=a100"), parse_constraint("zone=b")),
    )
    workers = [
        WorkerRoom(worker_id="w-1", cpu_millis=10, memory_mb=10, labels={"gpu": "a100", "zone": "a"}),
        WorkerRoom(worker_id="w-2", cpu_millis=10, memory_mb=10, labels={"gpu": "t4", "zone": "b"}),
    ]
    assert unschedulable_reason(job, workers) == (
        "unschedulable: no live worker satisfies gpu=a100, zone=b together"
    )


def test_a_job_larger_than_every_eligible_worker_says_so() -> None:
    """The size reason is judged among eligible workers only."""
    workers = [
        WorkerRoom(worker_id="w-1", cpu_millis=8000, memory_mb=1000),
        WorkerRoom(worker_id="w-2", cpu_millis=1000, memory_mb=1000, labels={"gpu": "a100"}),
    ]
    plan = place([_gpu_job(cpu=2000)], workers)
    assert plan.unschedulable == {1: "unschedulable: needs 2000 cpu_millis, largest eligible worker has 1000"}


def test_a_constrained_job_reserves_only_an_eligible_worker() -> None:
    """A constrained job that fits no free room reserves a worker it may use, never another."""
    workers = [
        WorkerRoom(worker_id="w-1", cpu_millis=1000, memory_mb=1000, cpu_allocated_millis=900),
        WorkerRoom(
            worker_id="w-2", cpu_millis=1000, memory_mb=1000, cpu_allocated_millis=950, labels={"gpu": "a100"}
        ),
    ]
    plan = place([_gpu_job(cpu=500)], workers, max_reservations=1)
    assert plan.reservations == {"w-2": 1}


_LABELS = st.dictionaries(st.sampled_from(["gpu", "zone"]), st.sampled_from(["a", "b"]), max_size=2)
_CONSTRAINTS = st.lists(
    st.sampled_from(["gpu=a", "gpu!=a", "zone", "zone in (a,b)", "zone=b"]), max_size=2, unique=True
)


@given(
    workers=st.lists(st.tuples(st.integers(1, 4000), st.integers(1, 4000), _LABELS), min_size=1, max_size=6),
    jobs=st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 3000), _CONSTRAINTS), max_size=20),
    reservations=st.integers(0, 2),
)
def test_every_placement_satisfies_its_jobs_constraints_and_overcommits_nothing(
    workers: list[tuple[int, int, dict[str, str]]],
    jobs: list[tuple[int, int, list[str]]],
    reservations: int,
) -> None:
    """For any workers, labels and constrained jobs: each job goes to a worker whose labels
    satisfy all its constraints, no worker gets more than its room, and a job with a reason
    is one no live worker could ever hold."""
    rooms = [
        WorkerRoom(worker_id=f"w-{i}", cpu_millis=c, memory_mb=m, labels=labels)
        for i, (c, m, labels) in enumerate(workers)
    ]
    pending = [
        PendingJob(
            job_id=i + 1, cpu_millis=c, memory_mb=m, constraints=tuple(parse_constraint(t) for t in texts)
        )
        for i, (c, m, texts) in enumerate(jobs)
    ]
    plan = place(pending, rooms, max_reservations=reservations)
    by_id = {w.worker_id: w for w in rooms}
    used: dict[str, list[int]] = {w.worker_id: [0, 0] for w in rooms}
    for job_id, worker_id in plan.placements:
        job, worker = pending[job_id - 1], by_id[worker_id]
        assert satisfied(job.constraints, worker.labels)
        used[worker_id][0] += job.cpu_millis
        used[worker_id][1] += job.memory_mb
    for worker_id, (cpu, mem) in used.items():
        assert cpu <= by_id[worker_id].cpu_millis and mem <= by_id[worker_id].memory_mb
    for job_id in plan.unschedulable:
        job = pending[job_id - 1]
        assert not any(
            satisfied(job.constraints, w.labels)
            and job.cpu_millis <= w.cpu_millis
            and job.memory_mb <= w.memory_mb
            for w in rooms
        )
