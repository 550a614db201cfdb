"""The checker on crafted histories and logs: it catches a double placement and a double run,
and passes a clean run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import attrs
import pytest

from ops.checker import check_logs, load_runs, parse_fault, placement_recoveries_s, runs_from_records
from ops.checker_records import KILLED_AGENT_RUN_ON_S, AssignmentRecord, DeathRecord, FaultEvent, History
from ops.checker_report import report_rows
from ops.invariants import check
from runtime.errors import InvalidArgument


def assignment(
    aid: int,
    job: int,
    worker: str,
    epoch: int,
    state: str,
    start: float,
    end: float | None,
    end_reason: str | None = None,
    outcome: str | None = None,
) -> AssignmentRecord:
    return AssignmentRecord(
        assignment_id=aid,
        job_id=job,
        worker_id=worker,
        incarnation=1,
        epoch=epoch,
        state=state,
        created_at=start,
        ended_at=end,
        # A finished assignment ended as its run did; these runs succeeded unless told.
        end_reason=end_reason if end_reason is not None or state != "finished" else "succeeded",
        outcome=outcome,
    )


def record(
    event: str, worker: str, job: int, aid: int, time: float, incarnation: int = 1, **extra: object
) -> dict[str, object]:
    return {
        "event": event,
        "worker_id": worker,
        "incarnation": incarnation,
        "job_id": job,
        "assignment_id": aid,
        "epoch": 1,
        "time": time,
        **extra,
    }


CLEAN = History(
    assignments=(
        assignment(1, 1, "w-1", 1, "finished", 0.0, 5.0),
        assignment(2, 2, "w-1", 1, "lost", 0.0, 9.0),  # w-1 killed at 3, declared dead at 9
        assignment(3, 2, "w-2", 2, "finished", 9.1, 12.0),  # requeued, ran again elsewhere
    ),
    deaths=(DeathRecord(worker_id="w-1", incarnation=1, epoch=2, declared_at=9.0, last_heartbeat_at=3.0),),
    job_states={1: "succeeded", 2: "succeeded"},
    stale_writes_rejected=1,
)
CLEAN_LOGS = [
    record("start", "w-1", 1, 1, 0.1),
    record("stop", "w-1", 1, 1, 2.0),
    record("start", "w-1", 2, 2, 0.1),  # no stop: its worker was killed at 3.0
    record("start", "w-2", 2, 3, 9.2),
    record("stop", "w-2", 2, 3, 11.0),
]
KILL_W1 = [FaultEvent(kind="kill", target="w-1", at=3.0, until=3.0)]


def test_a_clean_run_passes() -> None:
    """A job requeued after its worker was killed and declared dead is neither a double
    placement nor a double run, and the death is no false death."""
    report = check(CLEAN, runs_from_records(CLEAN_LOGS, KILL_W1), KILL_W1)
    assert report.to_json() | {"details": []} == {
        "double_placements": 0,
        "double_runs": 0,
        "false_deaths": 0,
        "lost_successes": 0,
        "stale_writes_rejected": 1,
        "jobs_submitted": 2,
        "jobs_finished": 2,
        "jobs_cancelled": 0,
        "unfinished_job_ids": [],
        "jobs_unfinished": {},
        "finish_required": True,
        "elections": 0,
        "worker_deaths": 1,
        "self_fences": 0,
        "pauses": 0,
        "extra_assignments": 1,
        "worker_leaves": 0,
        "preemptions": 0,
        "jobs_killed_by_outage": 0,
        "acknowledged_submissions_lost": 0,
        "wrong_final_states": 0,
        "schedule_slots_fired": 0,
        "schedule_slots_skipped": 0,
        "schedule_slot_errors": 0,
        "shared_units": 0,
        "device_assignments": 0,
        "gang_violations": 0,
        "gang_attempts": 0,
        "details": [],
        "ok": True,
    }


def test_catches_two_assignments_active_at_once() -> None:
    """Two assignments of one job whose active intervals overlap are a double placement."""
    history = History(
        assignments=(
            assignment(1, 7, "w-1", 1, "finished", 0.0, 5.0),
            assignment(2, 7, "w-2", 2, "finished", 4.0, 6.0),
        ),
        job_states={7: "succeeded"},
    )
    report = check(history, [])
    assert report.double_placements == 1 and not report.ok
    assert "job 7: assignments 1 (epoch 1, w-1) and 2 (epoch 2, w-2)" in report.details[0]


def test_catches_a_job_placed_again_after_it_finished() -> None:
    """A stale leader's placement of a job that already finished is a double placement."""
    history = History(
        assignments=(
            assignment(1, 7, "w-1", 2, "finished", 0.0, 5.0),
            assignment(2, 7, "w-2", 1, "finished", 6.0, 8.0),
        ),
        job_states={7: "succeeded"},
    )
    report = check(history, [])
    assert report.double_placements == 1
    assert "placed again as assignment 2 (epoch 1) after assignment 1 finished" in report.details[0]


def test_catches_a_job_running_on_two_workers_at_once() -> None:
    """A job still running on a cut-off worker (no stop, no kill) while it runs elsewhere is
    a double run, found from the workers' logs alone."""
    logs = [
        record("start", "w-1", 3, 5, 1.0),
        record("start", "w-2", 3, 6, 8.0),
        record("stop", "w-2", 3, 6, 10.0),
    ]
    report = check(History(assignments=(), job_states={3: "succeeded"}), runs_from_records(logs))
    assert report.double_runs == 1 and not report.ok
    assert "job 3: ran on w-1 (assignment 5) and on w-2 (assignment 6)" in report.details[0]


def test_a_run_ends_at_its_stop_or_at_its_workers_kill() -> None:
    """Without the kill record the killed worker's run would never end; with it, it ends then."""
    logs = [record("start", "w-1", 3, 5, 1.0), record("start", "w-2", 3, 6, 8.0)]
    assert check(History(assignments=()), runs_from_records(logs, KILL_W1)).double_runs == 0
    runs = runs_from_records(logs)
    assert sorted(r.ended_at for r in runs) == [math.inf, math.inf]


def test_a_killed_agents_run_lasts_the_fence_span_past_the_kill() -> None:
    """A killed agent's reaper runs its job on until the fence deadline: with no stop line, the
    run ends the fence span after the kill, so a run elsewhere that starts within it overlaps,
    and one that starts after it does not."""
    start = record("start", "w-1", 3, 5, 1.0)
    early = [start, record("start", "w-2", 3, 6, 3.0 + KILLED_AGENT_RUN_ON_S - 0.2)]
    late = [start, record("start", "w-2", 3, 6, 3.0 + KILLED_AGENT_RUN_ON_S + 0.2)]
    assert check(History(assignments=()), runs_from_records(early, KILL_W1)).double_runs == 1
    assert check(History(assignments=()), runs_from_records(late, KILL_W1)).double_runs == 0


def test_a_run_taken_over_by_a_restarted_agent_ends_at_its_stop_line() -> None:
    """The agent started again on a killed worker's folder writes the stop line of the job it
    took over (same incarnation): the run lasts from the first process's start line to it."""
    logs = [record("start", "w-1", 3, 5, 1.0), record("stop", "w-1", 3, 5, 20.0, reason="succeeded")]
    (run,) = runs_from_records(logs, KILL_W1)
    assert (run.started_at, run.ended_at, run.stop_reason) == (1.0, 20.0, "succeeded")


PREEMPTED = History(
    assignments=(
        assignment(5, 3, "w-1", 1, "stopped", 0.0, 4.0, end_reason="preempted"),
        assignment(6, 3, "w-2", 1, "finished", 4.1, 10.0),
    ),
    job_states={3: "succeeded"},
)


def test_a_preempted_run_followed_by_a_new_run_is_no_double_run() -> None:
    """A preempted run whose stop record the worker dated a little after the database's end of
    the preemption (or wrote none) ended by that end: the job's next run, placed after it, is no
    double run; the preemption is counted."""
    logs = [
        record("start", "w-1", 3, 5, 0.5),
        record("stop", "w-1", 3, 5, 4.3),  # the worker's clock, a round trip off the database's
        record("start", "w-2", 3, 6, 4.2),
        record("stop", "w-2", 3, 6, 9.0),
    ]
    report = check(PREEMPTED, runs_from_records(logs))
    assert (report.double_runs, report.preemptions, report.ok) == (0, 1, True)
    assert ("preemptions", "1", None) in report_rows(report)
    no_stop = [r for r in logs if not (r["event"] == "stop" and r["assignment_id"] == 5)]
    assert check(PREEMPTED, runs_from_records(no_stop)).double_runs == 0


def test_a_run_beside_a_preempted_one_before_its_end_is_a_double_run() -> None:
    """A new run that began before the preemption's end, or a run of a job that no preemption
    ended, at the same time as another, is still a double run."""
    early = [
        record("start", "w-1", 3, 5, 0.5),
        record("stop", "w-1", 3, 5, 4.0),
        record("start", "w-2", 3, 6, 2.0),
        record("stop", "w-2", 3, 6, 9.0),
    ]
    report = check(PREEMPTED, runs_from_records(early))
    assert report.double_runs == 1 and not report.ok
    not_preempted = attrs.evolve(
        PREEMPTED,
        assignments=(
            assignment(5, 3, "w-1", 1, "stopped", 0.0, 4.0, end_reason="drained"),
            PREEMPTED.assignments[1],
        ),
    )
    late = [
        record("start", "w-1", 3, 5, 0.5),
        record("stop", "w-1", 3, 5, 4.3),
        record("start", "w-2", 3, 6, 4.2),
        record("stop", "w-2", 3, 6, 9.0),
    ]
    assert check(not_preempted, runs_from_records(late)).double_runs == 1


def test_a_death_no_fault_explains_is_a_false_death() -> None:
    """A worker declared dead with no kill, freeze or partition of it is counted."""
    report = check(History(assignments=(), deaths=CLEAN.deaths), [], faults=[])
    assert report.false_deaths == 1
    assert "worker w-1 (incarnation 1) declared dead under epoch 2" in report.details[0]
    other = [FaultEvent(kind="kill", target="w-2", at=3.0, until=3.0)]
    assert check(History(assignments=(), deaths=CLEAN.deaths), [], faults=other).false_deaths == 1


def test_unfinished_jobs_fail_the_check() -> None:
    """A job still pending or running at the end is reported by id."""
    report = check(History(assignments=(), job_states={1: "succeeded", 2: "running", 3: "pending"}), [])
    assert report.unfinished_job_ids == (2, 3) and not report.ok


def test_cancelled_jobs_are_counted_apart_from_the_finished_and_the_unfinished() -> None:
    """A cancelled job has ended but neither succeeded nor failed: its own row and key, so the
    submitted add up; with none cancelled the table has no such row."""
    states = {1: "succeeded", 2: "failed", 3: "cancelled", 4: "cancelled", 5: "running"}
    report = check(History(assignments=(), job_states=states), [], finish_required=False)
    assert (report.jobs_submitted, report.jobs_finished, report.jobs_cancelled) == (5, 2, 2)
    assert report.unfinished_job_ids == (5,) and report.to_json()["jobs_cancelled"] == 2
    rows = {name: (value, verdict) for name, value, verdict in report_rows(report)}
    assert rows["jobs_cancelled"] == ("2", None)
    none_cancelled = check(History(assignments=(), job_states={1: "succeeded"}), [])
    assert "jobs_cancelled" not in {name for name, _, _ in report_rows(none_cancelled)}


def test_unfinished_jobs_are_running_not_a_failure_when_finishing_is_not_required() -> None:
    """A look at a cluster still at work (finish_required False) passes with its unfinished jobs
    counted by state, jobs_finished reading ``running``; a safety count still fails it."""
    states = {2: "running", 3: "pending", 4: "running", 5: "assigned"}
    report = check(History(assignments=(), job_states=states), [], finish_required=False)
    assert report.ok and report.unfinished_job_ids == (2, 3, 4, 5)
    assert report.unfinished_states == {"pending": 1, "assigned": 1, "running": 2}
    rows = {name: (value, verdict) for name, value, verdict in report_rows(report)}
    assert rows["jobs_finished"] == ("0", "running")
    assert rows["jobs_unfinished"] == ("4 (pending 1, assigned 1, running 2)", None)
    assert report.to_json()["jobs_unfinished"] == {"pending": 1, "assigned": 1, "running": 2}
    assert report.to_json()["ok"] is True
    dead = History(assignments=(), deaths=CLEAN.deaths, job_states=states)
    assert not check(dead, [], faults=[], finish_required=False).ok


def test_logs_with_a_torn_last_line_are_read(tmp_path: Path) -> None:
    """A worker killed mid-write leaves a partial line; the records before it still count."""
    worker = tmp_path / "w-1"
    worker.mkdir()
    lines = [json.dumps(r) for r in CLEAN_LOGS[:2]] + ['{"event": "sta']
    (worker / "agent.jsonl").write_text("\n".join(lines))
    runs = load_runs([worker])
    assert [(r.job_id, r.started_at, r.ended_at) for r in runs] == [(1, 0.1, 2.0)]


def test_a_start_that_never_became_a_run_is_not_a_run() -> None:
    """A start whose stop record says ``started: false`` (the reaper found the fence deadline
    passed) is no run: it cannot overlap the job's run elsewhere."""
    logs = [
        record("start", "w-1", 3, 5, 1.0),
        record("stop", "w-1", 3, 5, 9.0, reason="self_fence", started=False),
        record("start", "w-2", 3, 6, 8.0),
        record("stop", "w-2", 3, 6, 10.0, reason="succeeded"),
    ]
    runs = runs_from_records(logs)
    assert [(r.worker_id, r.assignment_id) for r in runs] == [("w-2", 6)]
    assert check(History(assignments=(), job_states={3: "succeeded"}), runs).double_runs == 0


def test_a_success_the_database_does_not_hold_is_lost() -> None:
    """A job that succeeded on w-1 whose assignment the database ended as lost is a lost
    success; a late report recorded on the assignment, or a kill of w-1 right after the run
    (it could not report), is not."""
    logs = [
        record("start", "w-1", 4, 7, 1.0),
        record("stop", "w-1", 4, 7, 2.0, reason="succeeded", exit_code=0),
        record("start", "w-2", 4, 8, 6.0),
        record("stop", "w-2", 4, 8, 7.0, reason="succeeded", exit_code=0),
    ]
    lost = (
        assignment(7, 4, "w-1", 1, "lost", 0.5, 5.0, "worker_restarted"),
        assignment(8, 4, "w-2", 1, "finished", 5.5, 7.0, "succeeded"),
    )
    report = check(History(assignments=lost, job_states={4: "succeeded"}), runs_from_records(logs))
    assert report.lost_successes == 1 and not report.ok
    assert "job 4: succeeded on w-1 (assignment 7), but the assignment is recorded lost" in report.details[0]
    reported_late = (attrs.evolve(lost[0], outcome="succeeded"), lost[1])
    assert check(History(assignments=reported_late), runs_from_records(logs)).lost_successes == 0
    killed = [FaultEvent(kind="kill", target="w-1", at=3.0, until=3.0)]
    assert check(History(assignments=lost), runs_from_records(logs, killed), killed).lost_successes == 0
    # Still active: not reported yet (the worker's next heartbeat carries it), so not lost; a
    # check that waited for every job fails it as unfinished instead.
    unreported = (assignment(7, 4, "w-1", 1, "active", 0.5, None, None), lost[1])
    assert check(History(assignments=unreported), runs_from_records(logs)).lost_successes == 0


def test_a_success_recorded_late_on_the_last_assignment_of_a_job_that_ended_otherwise_is_lost() -> None:
    """The job succeeded on w-1, whose worker was then declared dead while a cancel was asked:
    the late report sits on the lost assignment, but the job ended cancelled. That success was
    thrown away, even though the assignment holds it; a job placed again after it is not."""
    logs = [
        record("start", "w-1", 4, 7, 1.0),
        record("stop", "w-1", 4, 7, 2.0, reason="succeeded", exit_code=0),
    ]
    late = (assignment(7, 4, "w-1", 1, "lost", 0.5, 5.0, "worker_dead", outcome="succeeded"),)
    report = check(History(assignments=late, job_states={4: "cancelled"}), runs_from_records(logs))
    assert report.lost_successes == 1 and not report.ok
    assert report.details[0].startswith("job 4: its last assignment 7 (on w-1) recorded a success")
    assert check(History(assignments=late, job_states={4: "succeeded"}), runs_from_records(logs)).ok
    again = (*late, assignment(9, 4, "w-2", 1, "cancelled", 6.0, 7.0, "cancelled"))
    assert (
        check(History(assignments=again, job_states={4: "cancelled"}), runs_from_records(logs)).lost_successes
        == 0
    )


def test_disturbances_are_counted() -> None:
    """Elections, deaths, self-fences and assignments beyond one per job are counted, and a run
    with any of them beyond the first election is not undisturbed (but may still be ok)."""
    history = attrs.evolve(CLEAN, elections=2)
    report = check(history, runs_from_records(CLEAN_LOGS, KILL_W1), KILL_W1, self_fences=3)
    assert (report.elections, report.worker_deaths, report.self_fences, report.extra_assignments) == (
        2,
        1,
        3,
        1,
    )
    assert report.ok and not report.undisturbed
    calm = check(History(assignments=(CLEAN.assignments[0],), elections=1), [])
    assert calm.undisturbed


def test_a_death_after_a_logged_clean_stop_is_no_false_death(tmp_path: Path) -> None:
    """w-1 stopped cleanly at 10.0 (its ``leave`` line; its leave did not get through) and was
    declared dead at 13.0: that death is explained. w-2, which logged no clean stop, is a
    false death, and so is w-1's death in a later life, long after the clean stop."""
    for worker, lines in {
        "w-1": [record("register", "w-1", 0, 0, 1.0), record("leave", "w-1", 0, 0, 10.0, left=False)],
        "w-2": [record("register", "w-2", 0, 0, 1.0)],
    }.items():
        (tmp_path / worker).mkdir()
        (tmp_path / worker / "agent.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    deaths = (
        DeathRecord(worker_id="w-1", incarnation=1, epoch=1, declared_at=13.0, last_heartbeat_at=9.9),
        DeathRecord(worker_id="w-2", incarnation=2, epoch=1, declared_at=13.0, last_heartbeat_at=9.9),
        DeathRecord(worker_id="w-1", incarnation=3, epoch=1, declared_at=63.0, last_heartbeat_at=60.0),
    )
    report = check_logs(History(assignments=(), deaths=deaths), [tmp_path / "w-1", tmp_path / "w-2"])
    assert report.false_deaths == 2 and report.worker_deaths == 3
    assert [d.split(" declared")[0] for d in report.details] == [
        "worker w-2 (incarnation 2)",
        "worker w-1 (incarnation 3)",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kill:w-3@1764538392.5", FaultEvent(kind="kill", target="w-3", at=1764538392.5, until=1764538392.5)),
        ("freeze:cp-1@100..104.5", FaultEvent(kind="freeze", target="cp-1", at=100.0, until=104.5)),
        (
            "partition:w-2@2026-11-30T21:33:12+00:00..2026-11-30T21:33:16+00:00",
            FaultEvent(kind="partition", target="w-2", at=1796074392.0, until=1796074396.0),
        ),
    ],
)
def test_a_fault_given_by_hand_is_read(text: str, expected: FaultEvent) -> None:
    """KIND:ID@TIME[..UNTIL], times in Unix seconds or ISO 8601; UNTIL defaults to TIME."""
    assert parse_fault(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("w-3@100", "fault must be KIND:ID@TIME or KIND:ID@TIME..UNTIL"),
        ("kill:w-3", "fault must be KIND:ID@TIME"),
        ("sigkill:w-3@100", "fault kind must be one of kill, freeze, partition"),
        ("kill:w-3@yesterday", "fault TIME must be Unix seconds or an ISO 8601 date-time"),
        ("freeze:w-3@100..99", "fault UNTIL must not be before TIME 100"),
        ("kill:w-3@-5", "fault TIME must be a time after 1970-01-01"),
    ],
)
def test_a_malformed_fault_is_refused_naming_the_part_and_the_value(text: str, message: str) -> None:
    """Each malformed fault names the part that is wrong, the rule and the value given."""
    with pytest.raises(InvalidArgument, match=message) as raised:
        parse_fault(text)
    assert "got " in str(raised.value)


# ---------------------------------------------------------------- outages

OUTAGE = FaultEvent(kind="db_outage", target="database", at=20.0, until=28.0)


def test_a_run_the_cluster_stopped_during_an_outage_was_killed_by_it() -> None:
    """A run stopped by its worker's fence during a database outage (or shortly after) counts;
    one on a worker cut off on its own at the time, one that succeeded, and one stopped long
    after do not."""
    runs = runs_from_records(
        [
            record("start", "w-1", 1, 1, 10.0),
            record("stop", "w-1", 1, 1, 21.5, reason="self_fence"),
            record("start", "w-2", 2, 2, 10.0),
            record("stop", "w-2", 2, 2, 29.0, reason="reregister"),
            record("start", "w-3", 3, 3, 10.0),
            record("stop", "w-3", 3, 3, 22.0, reason="succeeded"),
            record("start", "w-1", 4, 4, 50.0),
            record("stop", "w-1", 4, 4, 60.0, reason="self_fence"),
        ]
    )
    partition_w2 = FaultEvent(kind="partition", target="w-2", at=21.0, until=35.0)
    history = History(assignments=(), job_states={1: "running", 2: "running", 3: "succeeded", 4: "running"})
    alone = check(history, runs, [OUTAGE])
    assert alone.jobs_killed_by_outage == 2 and not alone.ok
    assert check(history, runs, [OUTAGE, partition_w2]).jobs_killed_by_outage == 1


def test_an_acknowledged_submission_the_database_lacks_is_lost() -> None:
    """Job ids a client was given must all be in the database."""
    history = History(assignments=(), job_states={1: "succeeded", 2: "succeeded"})
    report = check(history, [], [], acknowledged_job_ids=[1, 2, 3])
    assert report.acknowledged_submissions_lost == 1 and not report.ok
    assert any("job 3" in line for line in report.details)


def test_time_from_the_database_back_to_the_first_placement_after_it() -> None:
    """Per outage, the first assignment committed at or after the database was up again."""
    assignments = [
        assignment(1, 1, "w-1", 1, "finished", 5.0, 9.0),
        assignment(2, 2, "w-1", 2, "finished", 29.5, 31.0),
        assignment(3, 3, "w-2", 2, "finished", 30.0, 33.0),
    ]
    later = FaultEvent(kind="db_outage", target="database", at=40.0, until=45.0)
    assert placement_recoveries_s(assignments, [OUTAGE, later]) == [1.5]


def test_a_retry_after_a_failed_run_is_no_double_placement() -> None:
    """A job placed again after a run that failed (a retry) is no double placement, and ends
    failed once its attempts are spent."""
    history = History(
        assignments=(
            assignment(1, 7, "w-1", 1, "finished", 0.0, 1.0, end_reason="failed"),
            assignment(2, 7, "w-2", 1, "finished", 2.0, 3.0, end_reason="timeout"),
        ),
        job_states={7: "failed"},
        job_attempts={7: (2, 2)},
    )
    report = check(history, [], expected_final_states={7: "failed"})
    assert report.double_placements == 0 and report.wrong_final_states == 0 and report.ok


def test_a_failure_policy_may_end_a_job_failed_with_attempts_left() -> None:
    """A job whose failure policy refused a retry (retry_on_exit, no_retry_on) ended failed
    with attempts left, which is no wrong final state."""
    history = History(
        assignments=(assignment(1, 7, "w-1", 1, "finished", 0.0, 1.0, end_reason="failed"),),
        job_states={7: "failed"},
        job_attempts={7: (1, 3)},
        policy_jobs=frozenset({7}),
    )
    report = check(history, [], expected_final_states={7: "failed"})
    assert report.wrong_final_states == 0 and report.ok


def test_wrong_final_states_are_caught() -> None:
    """More failed runs than max_attempts, a failure with attempts left, a success no run
    reported, and a final state other than the one expected are each caught."""
    history = History(
        assignments=(
            assignment(1, 1, "w-1", 1, "finished", 0.0, 1.0, end_reason="failed"),
            assignment(2, 1, "w-1", 1, "finished", 2.0, 3.0, end_reason="failed"),
            assignment(3, 2, "w-1", 1, "finished", 0.0, 1.0, end_reason="failed"),
            assignment(4, 3, "w-1", 1, "lost", 0.0, 1.0, end_reason="worker_dead"),
            assignment(5, 4, "w-1", 1, "finished", 0.0, 1.0),
        ),
        job_states={1: "failed", 2: "failed", 3: "succeeded", 4: "succeeded"},
        job_attempts={1: (2, 1), 2: (1, 3), 3: (0, 1), 4: (0, 1)},
    )
    report = check(history, [], expected_final_states={4: "failed"})
    assert report.wrong_final_states == 4 and not report.ok
    assert "job 1: 2 failed runs, more than its max_attempts 1" in report.details
    assert "job 2: failed with attempts left (1 of 3 spent)" in report.details
    assert "job 3: succeeded, but no run of it reported a success" in report.details
    assert "job 4: ended succeeded, expected failed" in report.details


def test_a_dependant_cancelled_for_a_dependency_that_succeeded_is_caught() -> None:
    """A job cancelled as dependency_failed naming a job that ended succeeded is a wrong
    final state; naming one that failed is not."""
    history = History(
        assignments=(assignment(1, 1, "w-1", 1, "finished", 0.0, 1.0),),
        job_states={1: "succeeded", 2: "cancelled", 3: "failed", 4: "cancelled"},
        dependency_cancels={2: 1, 4: 3},
    )
    report = check(history, [])
    assert report.wrong_final_states == 1
    assert "job 2: cancelled as dependency_failed: job 1, which ended succeeded" in report.details


def test_a_dependant_of_an_array_whose_task_failed_is_not_caught() -> None:
    """Job 2 cancelled as dependency_failed: job 1, where 1 is an array's id whose first task
    succeeded but another task failed: the array, as a dependency, failed; no wrong state."""
    history = History(
        assignments=(assignment(1, 1, "w-1", 1, "finished", 0.0, 1.0),),
        job_states={1: "succeeded", 2: "cancelled", 3: "failed"},
        dependency_cancels={2: 1},
        dependency_states={1: "failed"},
    )
    assert check(history, []).wrong_final_states == 0
