"""`stockade job ID --events` as people and programs read it (a scripted control plane answers),
an unknown job's exit status, and `stockade up --json-logs` handing --json-logs to every process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ops import cluster as cluster_module
from ops.cli import EXIT_INTERRUPTED, EXIT_INVALID, app
from ops.config import INSECURE_ENV
from protocol import pb
from runtime.client import ControlPlaneClient
from runtime.errors import NotFound

T0 = 1_700_000_000.0

HISTORY = pb.GetJobEventsReply(
    job_id=7,
    state="succeeded",
    events=[
        pb.JobEvent(kind="submitted", at_unix_s=T0),
        pb.JobEvent(
            kind="placed",
            at_unix_s=T0 + 0.1,
            assignment_id=11,
            worker_id="w-1",
            incarnation=4,
            epoch=2,
            leader="cp-1",
        ),
        pb.JobEvent(kind="confirmed", at_unix_s=T0 + 0.4, assignment_id=11, worker_id="w-1", incarnation=4),
        pb.JobEvent(
            kind="worker_dead",
            at_unix_s=T0 + 3.0,
            assignment_id=11,
            worker_id="w-1",
            incarnation=4,
            epoch=3,
            leader="cp-2",
            detail="last heartbeat 22:13:20.500 UTC",
        ),
        pb.JobEvent(
            kind="ended",
            at_unix_s=T0 + 3.0,
            assignment_id=11,
            worker_id="w-1",
            incarnation=4,
            epoch=3,
            leader="cp-2",
            state="lost",
            reason="worker_dead",
        ),
        pb.JobEvent(kind="requeued", at_unix_s=T0 + 3.0, assignment_id=11, not_before_unix_s=T0 + 3.4),
        pb.JobEvent(
            kind="placed",
            at_unix_s=T0 + 3.5,
            assignment_id=12,
            worker_id="w-2",
            incarnation=5,
            epoch=3,
            leader="cp-2",
        ),
        pb.JobEvent(
            kind="ended",
            at_unix_s=T0 + 6.0,
            assignment_id=12,
            worker_id="w-2",
            incarnation=5,
            state="finished",
            reason="succeeded",
            outcome="succeeded",
            has_exit_code=True,
            exit_code=0,
        ),
        pb.JobEvent(kind="final", at_unix_s=T0 + 6.0, state="succeeded", has_exit_code=True, exit_code=0),
    ],
)


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, object]]:
    """Every call answered as the job above (job 7; job 8 is it before it ended; NOT_FOUND for
    any other); the calls made."""
    calls: list[tuple[str, object]] = []

    async def replica(
        self: object, index: int, rpc: str, request: pb.GetJobEventsRequest, *a: object, **k: object
    ) -> object:
        calls.append((rpc, request))
        if request.job_id not in (7, 8):
            raise NotFound(f"job_id {request.job_id} not found")
        if request.job_id == 8:  # job 7 as it was while its second run went on
            return pb.GetJobEventsReply(job_id=8, state="running", events=list(HISTORY.events)[:-2])
        return HISTORY

    monkeypatch.setattr(ControlPlaneClient, "_attempt", replica)
    monkeypatch.setenv(INSECURE_ENV, "1")  # the scripted replica needs no certificate
    return calls


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args, "--control-planes", "127.0.0.1:1"], env={"COLUMNS": "200"})
    return result.exit_code, result.output


def test_events_tell_the_story_in_order(scripted: list[tuple[str, object]]) -> None:
    """One line per event, oldest first: the placement's worker, incarnation, epoch and leader, the
    death's epoch, the fenced end, the requeue's backoff, and the final state."""
    code, output = run("job", "7", "--events")
    assert code == 0, output
    assert [rpc for rpc, _ in scripted] == ["get_job_events"]
    lines = [line.rstrip() for line in output.splitlines()]
    kinds = [line.split()[2] for line in lines]
    assert kinds == [
        "submitted",
        "placed",
        "confirmed",
        "worker_dead",
        "ended",
        "requeued",
        "placed",
        "ended",
        "final",
    ]
    assert lines[1].endswith("assignment 11 on w-1 (incarnation 4), epoch 2 (cp-1)")
    assert "w-1 (incarnation 4) declared dead, epoch 3 (cp-2); last heartbeat 22:13:20.500 UTC" in lines[3]
    assert lines[4].endswith("assignment 11 lost (worker_dead), fenced at epoch 3 (cp-2)")
    assert "pending again after assignment 11, not placed before " in lines[5]
    assert lines[7].endswith("assignment 12 finished (succeeded), exit code 0")
    assert lines[8].split()[2:] == ["final", "succeeded,", "exit", "code", "0"]


def test_events_as_json_are_a_list_with_every_key(scripted: list[tuple[str, object]]) -> None:
    """--events --json prints a JSON list, one object per event, every key present (null where
    it does not apply)."""
    code, output = run("job", "7", "--events", "--json")
    assert code == 0, output
    events = json.loads(output)
    assert [e["kind"] for e in events][:2] == ["submitted", "placed"]
    assert events[1] == {
        "kind": "placed",
        "at_unix_s": T0 + 0.1,
        "assignment_id": 11,
        "worker_id": "w-1",
        "incarnation": 4,
        "epoch": 2,
        "leader": "cp-1",
        "state": None,
        "reason": None,
        "outcome": None,
        "exit_code": None,
        "detail": None,
        "not_before_unix_s": None,
    }
    assert (events[4]["reason"], events[4]["epoch"]) == ("worker_dead", 3)
    assert events[-1]["kind"] == "final" and events[-1]["state"] == "succeeded"


def test_events_of_a_job_that_has_not_ended_end_with_its_state_now(
    scripted: list[tuple[str, object]],
) -> None:
    """A job still running: the table's last row and the JSON list's last entry say its state
    now (kind ``now``, every other key null)."""
    code, output = run("job", "8", "--events")
    assert code == 0, output
    assert output.splitlines()[-1].split() == ["now", "running"]
    code, output = run("job", "8", "--events", "--json")
    assert code == 0, output
    last = json.loads(output)[-1]
    assert (last["kind"], last["state"]) == ("now", "running")
    assert {k for k, v in last.items() if v is not None} == {"kind", "state"}


def test_events_of_an_unknown_job_fail_with_exit_status_2(scripted: list[tuple[str, object]]) -> None:
    """An id no job has: one line naming it, exit status 2, as `stockade job` does."""
    code, output = run("job", "9", "--events")
    assert code == EXIT_INVALID
    assert output.strip().endswith("job_id 9 not found")


def test_up_with_json_logs_gives_every_new_process_the_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stockade up --json-logs` adds --json-logs to the control planes' and the agents' options,
    once, beside the options given with --cp-args and --agent-args."""
    seen: list[tuple[list[str], list[str]]] = []

    def up(self: cluster_module.LocalCluster, **_: object) -> object:
        seen.append((list(self.cp_args), list(self.agent_args)))
        raise KeyboardInterrupt

    monkeypatch.setenv("STOCKADE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(cluster_module.LocalCluster, "up", up)
    result = CliRunner().invoke(
        app,
        ["up", "--insecure", "--json-logs", "--cp-args", "--dead-after-s 5", "--agent-args", "--json-logs"],
    )
    assert result.exit_code == EXIT_INTERRUPTED, result.output
    assert seen == [(["--dead-after-s", "5", "--json-logs"], ["--json-logs"])]
