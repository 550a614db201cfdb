"""``stockade audit``: the audit trail as a table or as JSON, the filters it sends, and the input
it refuses before sending anything; ``stockade list`` shows each job's owner and passes
``--account``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from ops.cli import EXIT_INVALID, app
from ops.config import INSECURE_ENV
from protocol import pb
from runtime.client import ControlPlaneClient

CANCEL = pb.AuditEntry(
    id=12,
    at_unix_s=1_700_000_010.5,
    role="user",
    actor_id="alice",
    account="alice",
    address="127.0.0.1:50312",
    action="cancel",
    target_ids_json="[41]",
    arguments_json='{"only_this_task": false}',
)
CORDON = pb.AuditEntry(
    id=11,
    at_unix_s=1_700_000_009.0,
    role="operator",
    actor_id="operator",
    account="operator",
    address="10.0.0.7:41000",
    action="cordon",
    target_ids_json='["w-2"]',
    arguments_json="{}",
)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """The control plane answers list_audit with both rows and list_jobs with one job of
    alice's; the calls made are recorded."""
    made: list[tuple[str, Any]] = []

    async def replica(self: ControlPlaneClient, index: int, name: str, request: Any, **_: object) -> Any:
        made.append((name, request))
        if name == "list_audit":
            return pb.ListAuditReply(entries=[CANCEL, CORDON])
        spec = pb.JobSpec(name="nap", cpu_millis=100, memory_mb=16, sleep=pb.SleepRuntime(duration_ms=1000))
        return pb.ListJobsReply(jobs=[pb.JobInfo(job_id=41, spec=spec, state="pending", owner="alice")])

    monkeypatch.setattr(ControlPlaneClient, "_attempt", replica)
    monkeypatch.setenv(INSECURE_ENV, "1")  # the scripted replica needs no certificate
    monkeypatch.setenv("COLUMNS", "120")  # wide enough for a row on one line
    return made


def run(*args: str) -> Any:
    return CliRunner().invoke(app, [*args, "--control-planes", "127.0.0.1:1"])


def test_audit_json_prints_each_row_with_stable_keys(calls: list[tuple[str, Any]]) -> None:
    """``--json``: ``{"entries": [...]}`` newest first, target ids and arguments as JSON values."""
    result = run("audit", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["entries"][0] == {
        "id": 12,
        "at_unix_s": 1_700_000_010.5,
        "role": "user",
        "actor_id": "alice",
        "account": "alice",
        "address": "127.0.0.1:50312",
        "action": "cancel",
        "target_ids": [41],
        "arguments": {"only_this_task": False},
    }
    assert data["entries"][1]["target_ids"] == ["w-2"]
    assert calls == [("list_audit", pb.ListAuditRequest(limit=50))]


def test_audit_table_names_who_what_and_from_where(calls: list[tuple[str, Any]]) -> None:
    """The table shows each row's caller as role/id, its account, address, action and targets."""
    result = run("audit")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.strip().startswith("12 "))
    for shown in ("user/alice", "alice", "127.0.0.1:50312", "cancel", "41", "only_this_task=false"):
        assert shown in row
    assert "operator/operator" in result.output and "w-2" in result.output
    assert result.output.rstrip().endswith("2 rows")


def test_audit_sends_its_filters(calls: list[tuple[str, Any]]) -> None:
    """--account, --action, --since-s and --limit are sent as the request's fields."""
    result = run("audit", "--account", "alice", "--action", "cancel", "--since-s", "3600", "--limit", "5")
    assert result.exit_code == 0, result.output
    assert calls == [
        (
            "list_audit",
            pb.ListAuditRequest(account="alice", action="cancel", has_since_s=True, since_s=3600.0, limit=5),
        )
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--action", "delete"],
            "error: action must be empty or one of submit, cancel, drain, cordon, uncordon, account_set, "
            "schedule_add, schedule_pause, schedule_resume, schedule_remove, got 'delete'",
        ),
        (["--since-s", "-1"], "error: since_s must be a number of seconds from 0 to 1000000000, got -1.0"),
        (
            ["--since-s", "1e12"],
            "error: since_s must be a number of seconds from 0 to 1000000000, got 1000000000000.0",
        ),
        (
            ["--account", "al/ice"],
            "error: account must be 1-64 characters of A-Z a-z 0-9 . _ - starting with a letter or digit, "
            "got 'al/ice'",
        ),
    ],
)
def test_audit_refuses_bad_input_before_sending(
    calls: list[tuple[str, Any]], args: list[str], message: str
) -> None:
    """An unknown action, a negative --since-s or an account that breaks the id rules: one line
    naming the field, the value and the rule, exit 2, nothing sent."""
    result = run("audit", *args)
    assert result.exit_code == EXIT_INVALID
    assert [line for line in result.output.splitlines() if line.strip()] == [message]
    assert calls == []


def test_list_shows_the_owner_and_passes_the_account(calls: list[tuple[str, Any]]) -> None:
    """``stockade list --account alice`` asks for alice's jobs and shows an owner column."""
    result = run("list", "--account", "alice")
    assert result.exit_code == 0, result.output
    assert calls == [("list_jobs", pb.ListJobsRequest(limit=50, account="alice"))]
    header = next(line for line in result.output.splitlines() if "state" in line)
    assert "owner" in header
    assert "alice" in next(line for line in result.output.splitlines() if line.strip().startswith("41 "))
