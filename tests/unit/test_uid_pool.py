"""The pool of job uids: claims, the order uids come back in, quarantine, the size a worker
needs, the operator's range, and the blocks agents on one machine claim (agent/identities.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio
from test_agent_heartbeat import agent_settings

from agent import identities, uid_cleanup
from agent.fleet import split_uid_range
from agent.identities import (
    BLOCK_BASE_UID,
    BLOCK_RECORD,
    BLOCK_UIDS,
    JobIdentities,
    NoUidBlock,
    UidPool,
    claim_block,
)
from runtime.errors import InvalidArgument


def test_each_claim_gives_a_uid_no_running_job_holds() -> None:
    """Claims give distinct uids of the range until none is free, then None."""
    pool = UidPool(5000, 5002)
    got = [pool.claim(), pool.claim(), pool.claim()]
    assert sorted(got) == [5000, 5001, 5002]  # type: ignore[type-var]
    assert pool.claim() is None


def test_uids_come_back_least_recently_used_first() -> None:
    """A uid given back is given out after every uid that was free before it, in the order
    they came back."""
    pool = UidPool(5000, 5003)
    a, b = pool.claim(), pool.claim()
    assert (a, b) == (5000, 5001)
    pool.give_back(b)
    pool.give_back(a)
    assert [pool.claim() for _ in range(4)] == [5002, 5003, 5001, 5000]


def test_a_quarantined_uid_is_never_given_out_again() -> None:
    """A uid whose clean-up failed stays out of the pool."""
    pool = UidPool(5000, 5001)
    uid = pool.claim()
    assert uid is not None
    pool.quarantine(uid)
    pool.give_back(uid)  # a late give-back changes nothing
    assert pool.claim() == 5001
    assert pool.claim() is None
    assert pool.quarantined == {5000}


def test_a_held_uid_of_a_job_taken_over_is_not_given_out() -> None:
    """A uid a job taken over from the previous agent process runs as is held: not given out
    until that job gives it back."""
    pool = UidPool(5000, 5001)
    pool.hold(5000)
    assert pool.claim() == 5001
    assert pool.claim() is None
    pool.give_back(5000)
    assert pool.claim() == 5000


def test_a_pool_smaller_than_the_jobs_a_worker_can_run_is_refused(tmp_path: Path) -> None:
    """A job_uids range with fewer uids than min(cpu_millis, memory_mb) is refused at start,
    naming both numbers."""
    rule = r"must hold at least min\(cpu_millis, memory_mb\) = min\(4000, 2048\) = 2048 uids"
    with pytest.raises(InvalidArgument, match=f"job_uids {rule}.*'100000-100999' \\(it holds 1000\\)"):
        agent_settings(tmp_path, cpu_millis=4000, memory_mb=2048, job_uids="100000-100999")
    fits = agent_settings(tmp_path, cpu_millis=4000, memory_mb=1000, job_uids="100000-100999")
    assert fits.job_uids == (100000, 100999)


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("0-5000", "must not hold uid 0"),
        ("999-5000", "must start at uid 1000 or above"),
        ("5000-4999", "must have START at most END"),
        (f"5000-{2**30}", f"must end at uid {2**30 - 1} or below"),
        ("5000", "must be START-END"),
        ("a-b", "must be START-END"),
    ],
)
def test_a_bad_job_uids_range_is_refused(tmp_path: Path, value: str, rule: str) -> None:
    """A job_uids range holding root, system uids, uids from 2**30 up (the agents' own blocks),
    or upside down is refused,
    naming the field and the value."""
    with pytest.raises(InvalidArgument, match=f"job_uids {rule}.*got '{value}'"):
        agent_settings(tmp_path, job_uids=value)


def test_job_uids_and_a_shared_job_user_exclude_each_other(tmp_path: Path) -> None:
    """Both modes at once is refused."""
    with pytest.raises(InvalidArgument, match="job_uids must not be set with job_user"):
        agent_settings(tmp_path, job_uids="100000-200000", job_user="stockade-job")


def test_two_agents_on_one_machine_claim_blocks_that_do_not_overlap(tmp_path: Path) -> None:
    """Two claims from the same lock folder get different whole blocks while both are held; a
    block given up is free again, taken before any block above the one still held. (Which block
    comes first depends on the machine: a block whose uids another agent's jobs run in is
    skipped, so the test does not ask for the first one.)"""
    locks = tmp_path / "locks"
    first = claim_block(100, work_dir=tmp_path / "a", lock_dir=locks)
    second = claim_block(100, work_dir=tmp_path / "b", lock_dir=locks)
    try:
        for block in (first, second):
            assert block.first_uid >= BLOCK_BASE_UID
            assert (block.first_uid - BLOCK_BASE_UID) % BLOCK_UIDS == 0
            assert block.last_uid == block.first_uid + BLOCK_UIDS - 1
        assert first.last_uid < second.first_uid or second.last_uid < first.first_uid
    finally:
        first.close()
    third = claim_block(100, work_dir=tmp_path / "c", lock_dir=locks)
    try:
        assert third.last_uid < second.first_uid or second.last_uid < third.first_uid
        assert third.first_uid <= max(first.first_uid, second.first_uid)
    finally:
        second.close()
        third.close()


def test_a_worker_needing_more_than_one_block_claims_consecutive_ones(tmp_path: Path) -> None:
    """A worker that can run more jobs than one block holds claims enough whole blocks."""
    block = claim_block(BLOCK_UIDS + 1, work_dir=tmp_path / "a", lock_dir=tmp_path / "locks")
    try:
        assert block.last_uid - block.first_uid + 1 == 2 * BLOCK_UIDS
    finally:
        block.close()


def test_a_restarted_agent_claims_its_recorded_block_first(tmp_path: Path) -> None:
    """The block is recorded in the work folder, and the next agent there claims it again,
    not the first free one."""
    locks = tmp_path / "locks"
    a = claim_block(10, work_dir=tmp_path / "a", lock_dir=locks)
    b = claim_block(10, work_dir=tmp_path / "b", lock_dir=locks)
    b_uids = (b.first_uid, b.last_uid)
    a.close()
    b.close()
    assert (tmp_path / "b" / BLOCK_RECORD).read_text() == f"{b_uids[0]}-{b_uids[1]}\n"
    again = claim_block(10, work_dir=tmp_path / "b", lock_dir=locks)
    try:
        assert (again.first_uid, again.last_uid) == b_uids
    finally:
        again.close()


def test_an_operators_range_held_by_another_agent_is_refused(tmp_path: Path) -> None:
    """Two agents given the same job_uids on one machine: the second does not start."""
    locks = tmp_path / "locks"
    held = claim_block(10, work_dir=tmp_path / "a", job_uids=(100000, 100099), lock_dir=locks)
    try:
        assert (held.first_uid, held.last_uid) == (100000, 100099)
        with pytest.raises(NoUidBlock, match="100000-100099 is held by another agent"):
            claim_block(10, work_dir=tmp_path / "b", job_uids=(100000, 100099), lock_dir=locks)
    finally:
        held.close()


def test_a_block_some_process_still_runs_in_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A free block whose uids a process still has (a killed agent's job) is not claimed."""
    monkeypatch.setattr(identities, "_uids_running", lambda low: {BLOCK_BASE_UID + 7})
    block = claim_block(10, work_dir=tmp_path / "a", lock_dir=tmp_path / "locks")
    try:
        assert block.first_uid == BLOCK_BASE_UID + BLOCK_UIDS
    finally:
        block.close()


def test_a_fleet_splits_the_operators_range_among_its_workers() -> None:
    """Each worker of a fleet gets an equal part of job_uids, none shared."""
    assert split_uid_range((10000, 10999), 3) == [(10000, 10332), (10333, 10665), (10666, 10998)]
    with pytest.raises(InvalidArgument, match="at least one uid per worker"):
        split_uid_range((10000, 10001), 3)


async def test_a_uid_whose_clean_up_fails_is_quarantined_and_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When something of a job's uid is left after its clean-up, the uid is not given back:
    quarantined, with an error log naming it and what was left."""
    logged: list[tuple[str, dict[str, Any]]] = []

    class Logger:
        def error(self, message: str, **fields: Any) -> None:
            logged.append((message, fields))

    pool = UidPool(5000, 5001)
    ids = JobIdentities(pool=pool, logger=Logger())
    monkeypatch.setattr(
        uid_cleanup, "clean_uids", lambda folders, owner: {u: ["processes still running"] for u in folders}
    )
    uid = pool.claim()
    assert uid == 5000
    assert not await ids.release(uid, tmp_path)
    assert pool.quarantined == {5000}
    assert logged[0][1]["uid"] == 5000 and logged[0][1]["problems"] == ["processes still running"]
    monkeypatch.setattr(uid_cleanup, "clean_uids", lambda folders, owner: {})
    other = pool.claim()
    assert other == 5001
    assert await ids.release(other, None)
    assert pool.claim() == 5001


def test_a_process_that_outlives_sigkill_is_reported_and_nothing_else_is_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """clean_uids reports a uid whose process is still there after SIGKILL and the wait, and
    leaves its folders alone (a live process could make new files meanwhile)."""
    uid = BLOCK_BASE_UID + 5
    monkeypatch.setattr(uid_cleanup, "process_uids", lambda: {12345: (uid, uid, uid, uid)})
    killed: list[int] = []
    monkeypatch.setattr(uid_cleanup.os, "kill", lambda pid, sig: killed.append(pid))
    given: list[Path] = []
    monkeypatch.setattr(uid_cleanup, "give_back", lambda folder, u, g: given.append(folder))
    problems = uid_cleanup.clean_uids({uid: [tmp_path]}, owner=(0, 0), wait_s=0.05)
    assert problems == {uid: ["processes still running after SIGKILL: [12345]"]}
    assert killed and set(killed) == {12345} and not given


def test_the_job_record_keeps_the_jobs_uid() -> None:
    """A record written with a job uid reads back with it; an older record without one reads
    as None."""
    from agent.job_record import JobRecord
    from runtime.jobs import CommandRuntime

    record = JobRecord(
        worker_id="w-1",
        assignment_id=2,
        job_id=1,
        incarnation=1,
        epoch=1,
        cpu_millis=10,
        memory_mb=10,
        runtime=CommandRuntime(argv=("true",)),
        started_monotonic_s=1.0,
        began_monotonic_s=1.0,
        job_uid=BLOCK_BASE_UID + 3,
    )
    assert JobRecord.from_json(record.to_json()).job_uid == BLOCK_BASE_UID + 3
    older = record.to_json().replace(f', "job_uid": {BLOCK_BASE_UID + 3}', "")
    assert JobRecord.from_json(older).job_uid is None


def test_the_start_sweep_cleans_every_uid_but_those_of_jobs_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At start, what every uid of the pool left is removed, except the uids of running jobs
    the agent takes over; a uid whose process outlives SIGKILL is quarantined."""
    pool = UidPool(5000, 5003)
    ids = JobIdentities(pool=pool, owner=(0, 0))
    ids.hold(5001)
    swept: dict[str, set[int]] = {}

    def kill(uids: set[int]) -> list[int]:
        swept["killed"] = set(uids)
        return [99]

    monkeypatch.setattr(uid_cleanup, "kill_processes", kill)
    monkeypatch.setattr(uid_cleanup, "process_uids", lambda: {99: (5003, 5003, 5003, 5003)})
    monkeypatch.setattr(
        uid_cleanup, "remove_temp_files", lambda uids, owner: swept.setdefault("temp", set(uids)) and []
    )
    monkeypatch.setattr(uid_cleanup, "remove_ipc", lambda uids: swept.setdefault("ipc", set(uids)) and [])
    assert ids.sweep(tmp_path / "jobs") == [5003]
    assert swept == {"killed": {5000, 5002, 5003}, "temp": {5000, 5002}, "ipc": {5000, 5002}}
    assert pool.quarantined == {5003}
    assert [pool.claim(), pool.claim(), pool.claim()] == [5000, 5002, None]


async def test_the_start_sweeps_of_one_process_run_one_at_a_time_together_and_set_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet's workers start at once: their start sweeps (each a walk of the temp folders)
    never run side by side, those asking while one runs are swept together in one call, and
    each worker's pool is marked swept, so its first job takes a uid only after its own."""
    at_once = 0
    most = 0
    calls: list[list[int]] = []
    first_may_end = threading.Event()

    def sweep_pools(members: list[tuple[JobIdentities, Path]]) -> list[list[int]]:
        nonlocal at_once, most
        at_once += 1
        most = max(most, at_once)
        calls.append([ids.pool.first_uid for ids, _ in members])
        first_may_end.wait(10)
        at_once -= 1
        return [[] for _ in members]

    monkeypatch.setattr(identities, "sweep_pools", sweep_pools)
    pools = [JobIdentities(pool=UidPool(5000 + 10 * n, 5009 + 10 * n), owner=(0, 0)) for n in range(4)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pools[0].sweep_at_start, tmp_path / "jobs")
        while not calls:  # noqa: ASYNC110 (a thread's list)
            await trio.sleep(0.01)  # the first sweep runs; the others ask meanwhile
        for ids in pools[1:]:
            nursery.start_soon(ids.sweep_at_start, tmp_path / "jobs")
        await trio.sleep(0.05)
        assert not any(ids.swept.is_set() for ids in pools)
        first_may_end.set()
    assert most == 1
    assert [sorted(call) for call in calls] == [[5000], [5010, 5020, 5030]]
    assert all(ids.swept.is_set() for ids in pools)


def test_one_sweep_of_several_pools_cleans_each_but_the_uids_of_jobs_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two pools swept as one: every uid of both but the held ones is killed, walked for and
    its IPC removed, through a set that never lists each uid; a uid whose file cannot be
    removed is quarantined in its own pool only."""
    a, b = (
        JobIdentities(pool=UidPool(5000, 5003), owner=(0, 0)),
        JobIdentities(pool=UidPool(7000, 7001), owner=(0, 0)),
    )
    a.hold(5001)
    seen: dict[str, set[int]] = {}
    monkeypatch.setattr(
        uid_cleanup, "kill_processes", lambda uids: seen.setdefault("killed", set(uids)) and []
    )

    def remove_temp_files(uids: Any, owner: tuple[int, int]) -> dict[int, list[str]]:
        assert isinstance(uids, uid_cleanup.UidRanges)
        seen["temp"] = set(uids)
        return {7001: ["/tmp/stuck"]}

    monkeypatch.setattr(uid_cleanup, "remove_temp_files", remove_temp_files)
    monkeypatch.setattr(uid_cleanup, "remove_ipc", lambda uids: seen.setdefault("ipc", set(uids)) and [])
    assert identities.sweep_pools([(a, tmp_path / "a"), (b, tmp_path / "b")]) == [[], [7001]]
    assert seen["killed"] == seen["temp"] == seen["ipc"] == {5000, 5002, 5003, 7000, 7001}
    assert b.pool.quarantined == {7001} and not a.pool.quarantined
    ranges = uid_cleanup.UidRanges.of([(7000, 7001), (5000, 5003), (5002, 5009)], excluded=[5004])
    assert ranges.ranges == ((5000, 5009), (7000, 7001))
    assert [u in ranges for u in (4999, 5000, 5004, 5009, 5010, 7001, 7002)] == [
        False,
        True,
        False,
        True,
        False,
        True,
        False,
    ]
    assert len(ranges) == 11 and len(ranges.without([7000, 1])) == 10
