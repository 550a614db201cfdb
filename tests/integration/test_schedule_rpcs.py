"""The schedule RPCs over mutual TLS on a real PostgreSQL: add, list, pause, resume, remove,
each once per key and audited; bad input refused naming the field, nothing stored; a viewer
may only list; a user's schedule is its own account's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serving import mtls_control_plane
from test_accounts import call, fetch

from ops import certs as certs_module
from protocol import pb
from runtime.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from runtime.idempotency_keys import with_idempotency_key


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The certificates ``stockade certs init`` issues (cp-1, operator, viewer...), the users
    alice and bob, and v-alice, a viewer of alice's account."""
    folder = tmp_path_factory.mktemp("schedules") / "certs"
    certs_module.init_cluster(folder)
    certs_module.issue(folder, role="user", id="alice")
    certs_module.issue(folder, role="user", id="bob")
    certs_module.issue(folder, role="viewer", id="v-alice", account="alice")
    return folder


def add_request(name: str = "tick", **fields: object) -> pb.AddScheduleRequest:
    job = pb.JobSpec(name="tick-job", cpu_millis=100, memory_mb=64, sleep=pb.SleepRuntime(duration_ms=1000))
    values: dict[str, object] = {"name": name, "cron": "*/5 * * * *", "tz": "Europe/Berlin", "job": job}
    values.update(fields)
    return with_idempotency_key(pb.AddScheduleRequest(spec=pb.ScheduleSpec(**values)))  # type: ignore[arg-type]


def by_name(name: str) -> pb.ScheduleNameRequest:
    return with_idempotency_key(pb.ScheduleNameRequest(name=name))


async def test_a_user_adds_lists_pauses_resumes_and_removes_its_schedule(
    database_url: str, certs: Path
) -> None:
    """The schedule belongs to alice; each change is audited with its action and name; the list
    shows its next slot while active and none while paused; a replayed add stores nothing again."""
    async with mtls_control_plane(database_url, certs) as address:
        request = add_request()
        added = await call(address, certs, "alice", "add_schedule", request)
        again = await call(address, certs, "alice", "add_schedule", request)
        assert again.id == added.id
        assert (added.owner, added.spec.concurrency_policy, added.spec.starting_deadline_s) == (
            "alice",
            "allow",
            60,
        )
        assert added.next_slot_at_ms > 0 and added.next_slot_at_ms % 300_000 == 0
        paused = await call(address, certs, "alice", "pause_schedule", by_name("tick"))
        assert paused.paused and paused.next_slot_at_ms == 0
        listed = await call(address, certs, "v-alice", "list_schedules", pb.ListSchedulesRequest())
        assert [s.spec.name for s in listed.schedules] == ["tick"]
        resumed = await call(address, certs, "alice", "resume_schedule", by_name("tick"))
        assert not resumed.paused and resumed.next_slot_at_ms > 0
        removed = await call(address, certs, "alice", "remove_schedule", by_name("tick"))
        assert removed.spec.cron == "*/5 * * * *"
        assert (
            await call(address, certs, "operator", "list_schedules", pb.ListSchedulesRequest())
        ).schedules == []
    rows = await fetch(
        database_url, "SELECT role, actor_id, account, action, arguments::text FROM audit_log ORDER BY id"
    )
    assert [(r[0], r[1], r[2], r[3], json.loads(r[4])["name"]) for r in rows] == [
        ("user", "alice", "alice", action, "tick")
        for action in ("schedule_add", "schedule_pause", "schedule_resume", "schedule_remove")
    ]


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"cron": "*/5 * *"}, "cron", "cron expression of 5 fields"),
        ({"cron": "0 0 30 2 *"}, "cron", "within 5 years (CRON_HORIZON_YEARS)"),
        ({"tz": "Europe/Atlantis"}, "tz", "IANA time zone"),
        ({"concurrency_policy": "queue"}, "concurrency_policy", "allow, forbid, replace"),
        ({"starting_deadline_s": 10**6}, "starting_deadline_s", "between 1 and 604800"),
        ({"name": "no spaces"}, "name", ""),
    ],
)
async def test_bad_input_is_refused_naming_the_field_and_nothing_is_stored(
    database_url: str,
    certs: Path,
    fields: dict[str, object],
    field: str,
    words: str,
) -> None:
    """Each bad field is InvalidArgument naming the field, the value and the rule; no schedule,
    no audit row, no key is stored."""
    async with mtls_control_plane(database_url, certs) as address:
        with pytest.raises(InvalidArgument) as refused:
            await call(address, certs, "operator", "add_schedule", add_request(**fields))
    assert field in str(refused.value) and words in str(refused.value)
    assert repr(fields[field]) in str(refused.value)
    for table in ("schedules", "audit_log", "idempotency_keys"):
        assert await fetch(database_url, f"SELECT * FROM {table}") == []


async def test_a_second_schedule_of_the_same_name_is_refused(database_url: str, certs: Path) -> None:
    """FailedPrecondition names the schedule; the first is kept as it was."""
    async with mtls_control_plane(database_url, certs) as address:
        await call(address, certs, "operator", "add_schedule", add_request())
        with pytest.raises(FailedPrecondition, match="schedule 'tick' exists"):
            await call(address, certs, "operator", "add_schedule", add_request(cron="* * * * *"))
    assert await fetch(database_url, "SELECT cron FROM schedules") == [("*/5 * * * *",)]


async def test_a_viewer_may_only_list_and_a_user_not_change_anothers(database_url: str, certs: Path) -> None:
    """A viewer's add and pause are PermissionDenied; bob's pause of alice's schedule is NotFound."""
    async with mtls_control_plane(database_url, certs) as address:
        await call(address, certs, "alice", "add_schedule", add_request())
        with pytest.raises(PermissionDenied):
            await call(address, certs, "viewer", "add_schedule", add_request("other"))
        with pytest.raises(PermissionDenied):
            await call(address, certs, "viewer", "pause_schedule", by_name("tick"))
        with pytest.raises(NotFound):
            await call(address, certs, "bob", "pause_schedule", by_name("tick"))
        mine = await call(address, certs, "bob", "list_schedules", pb.ListSchedulesRequest())
        assert mine.schedules == []
    assert await fetch(database_url, "SELECT paused FROM schedules") == [(False,)]


async def test_a_removal_answers_the_slots_the_schedule_fired_and_skipped(
    database_url: str, certs: Path
) -> None:
    """The schedule a removal answers carries its real counts (2 fired, 1 skipped), read before
    its slots' records went with it, not 0."""
    async with mtls_control_plane(database_url, certs) as address:
        added = await call(address, certs, "alice", "add_schedule", add_request())
        await fetch(
            database_url,
            "INSERT INTO schedule_slots (schedule_id, slot_at, outcome, reason, job_id, epoch)"
            " SELECT $1, now() - make_interval(mins => n), CASE WHEN n < 3 THEN 'fired' ELSE 'skipped' END,"
            " '', CASE WHEN n < 3 THEN 900 + n END, 1 FROM generate_series(1, 3) AS n RETURNING 1",
            added.id,
        )
        removed = await call(address, certs, "alice", "remove_schedule", by_name("tick"))
        assert (removed.fired, removed.skipped) == (2, 1)
    assert await fetch(database_url, "SELECT count(*) FROM schedule_slots") == [(0,)]
