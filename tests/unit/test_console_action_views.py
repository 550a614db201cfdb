"""What the console's actions send and answer, and the pure parts of its newer pages
(actors.console.actions, actors.console.views): the requests built from a page's JSON, the
words an action's result reads, the jobs search's ``name[index]``, the history's lines."""

from __future__ import annotations

from typing import Any

import pytest

from actors.console.actions import action_request
from actors.console.views import action_outcome, event_of, size, task_filter, whole_number
from protocol import pb
from runtime.errors import InvalidArgument


def test_a_cancel_builds_the_request_of_stockade_cancel() -> None:
    """``cancel`` asks to cancel the job (an array whole), ``cancel-task`` one task only."""
    body = {"idempotency_key": "k-1"}
    assert action_request("cancel", "7", body) == pb.CancelJobRequest(job_id=7, idempotency_key="k-1")
    assert action_request("cancel-task", "7", body) == pb.CancelJobRequest(
        job_id=7, idempotency_key="k-1", only_this_task=True
    )


def test_a_drain_carries_its_deadline_in_milliseconds_or_none() -> None:
    """A drain's ``deadline_s`` becomes the request's ``deadline_ms``; null means no deadline."""
    with_deadline = action_request("drain", "w-1", {"idempotency_key": "k", "deadline_s": 2.5})
    assert with_deadline == pb.DrainWorkerRequest(
        worker_id="w-1", idempotency_key="k", has_deadline=True, deadline_ms=2500
    )
    none = action_request("drain", "w-1", {"idempotency_key": "k", "deadline_s": None})
    assert none == pb.DrainWorkerRequest(worker_id="w-1", idempotency_key="k")


@pytest.mark.parametrize(
    ("action", "target", "body", "named"),
    [
        ("cancel", "12abc", {"idempotency_key": "k"}, "job_id must be a whole number, got '12abc'"),
        ("cancel", "7", {}, "idempotency_key must be text, got None"),
        ("drain", "w-1", {"idempotency_key": "k", "deadline_s": True}, "deadline_s must be a number"),
        (
            "drain",
            "w-1",
            {"idempotency_key": "k", "deadline_s": -1},
            "deadline_s must be between 0 and 604800 seconds",
        ),
        ("drain", "w-1", {"idempotency_key": "k", "deadline_s": float("inf")}, "deadline_s must be between"),
        ("drain", "w-1", {"idempotency_key": "k", "deadline_s": float("nan")}, "deadline_s must be between"),
        ("reboot", "w-1", {"idempotency_key": "k"}, "action must be one of cancel, cancel-task"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_value(
    action: str, target: str, body: dict[str, Any], named: str
) -> None:
    with pytest.raises(InvalidArgument, match=named):
        action_request(action, target, body)


def test_an_actions_result_reads_what_the_reply_says() -> None:
    """A cancel says the state (and an array's task count); a worker's action its marks and
    its active jobs."""
    assert action_outcome("cancel", "7", pb.CancelJobReply(state="cancelling")) == "job 7: cancelling"
    assert action_outcome("cancel", "7", pb.CancelJobReply(state="cancelled", tasks=3)) == (
        "job 7: cancelled (3 tasks)"
    )
    drained = pb.WorkerScheduleReply(worker_id="w-1", cordoned=True, drained=True)
    assert action_outcome("drain", "w-1", drained) == "worker w-1: cordoned, drained; 0 active jobs"
    back = pb.WorkerScheduleReply(worker_id="w-1", job_ids=[4])
    assert action_outcome("uncordon", "w-1", back) == "worker w-1: takes placements; 1 active job"


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("sh[3]", ("sh", 3)),
        ("sh", ("sh", None)),
        ("a[b]", ("a[b]", None)),
        ("[0]", ("", 0)),
        ("x[]", ("x[]", None)),
    ],
)
def test_a_name_filter_of_name_and_index_finds_one_task(name: str, parts: tuple[str, int | None]) -> None:
    assert task_filter(name) == parts


def test_numbers_and_sizes() -> None:
    """Only ASCII digits, at most 19, are a whole number; sizes read in B, KiB, MiB."""
    assert whole_number("42") == 42 and whole_number("٤٢") is None and whole_number("1" * 20) is None
    assert (size(512), size(64 * 1024), size(3 * 1024 * 1024)) == ("512 B", "64.0 KiB", "3.0 MiB")


def event(**fields: Any) -> dict[str, Any]:
    row = dict.fromkeys(
        ("worker_id", "assignment_id", "incarnation", "epoch", "leader", "state", "reason", "outcome"), None
    )
    row |= {"exit_code": None, "detail": None, "not_before_unix_s": None, "at_unix_s": 0.0}
    return row | fields


def test_a_history_line_says_what_applies_once() -> None:
    """An ended run reads its assignment, its end and exit code (a detail that only repeats the
    exit code is left out); a placement names its epoch's leader."""
    ended = event(
        kind="ended",
        worker_id="w-1",
        assignment_id=4,
        state="finished",
        reason="succeeded",
        outcome="succeeded",
        exit_code=0,
        detail="exit code 0",
    )
    assert event_of(ended)["what"] == "assignment 4; finished succeeded, exit code 0"
    placed = event(kind="placed", assignment_id=4, incarnation=2, epoch=3, leader="cp-2")
    assert event_of(placed) == {
        "kind": "placed",
        "at_unix_s": 0.0,
        "worker_id": None,
        "what": "assignment 4; incarnation 2; epoch 3 (cp-2)",
    }
