"""``stockade account``: set sends the caps given and the ones cleared, show and list print each
cap beside what the account uses (a table, or JSON), and bad input is refused before sending."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from ops.cli import EXIT_INVALID, app
from ops.config import INSECURE_ENV
from protocol import pb
from runtime.client import ControlPlaneClient

ALICE = pb.AccountInfo(
    name="alice",
    has_cpu_millis=True,
    cpu_millis=32000,
    has_memory_mb=True,
    memory_mb=65536,
    weight=1.0,
    used_cpu_millis=32000,
    used_memory_mb=16384,
    queued_jobs=7,
)
BOB = pb.AccountInfo(
    name="bob",
    has_max_pending=True,
    max_pending=10,
    has_max_priority=True,
    max_priority=5,
    weight=2.0,
    queued_jobs=3,
)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """The control plane answers every account call with alice (list: alice and bob); the calls
    made are recorded."""
    made: list[tuple[str, Any]] = []

    async def replica(self: ControlPlaneClient, index: int, name: str, request: Any, **_: object) -> Any:
        made.append((name, request))
        return pb.ListAccountsReply(accounts=[ALICE, BOB]) if name == "list_accounts" else ALICE

    monkeypatch.setattr(ControlPlaneClient, "_attempt", replica)
    monkeypatch.setenv(INSECURE_ENV, "1")
    monkeypatch.setenv("COLUMNS", "120")
    return made


def run(*args: str) -> Any:
    return CliRunner().invoke(app, [*args, "--control-planes", "127.0.0.1:1"])


def test_set_sends_the_caps_given_and_those_cleared(calls: list[tuple[str, Any]]) -> None:
    """--cpu-millis, --max-pending and --weight are sent with their has_ flags, --clear-memory-mb
    as a cap to clear; the others keep their stored values."""
    result = run(
        "account", "set", "alice", "--cpu-millis", "32000", "--max-pending", "10000", "--weight", "2"
    )
    assert result.exit_code == 0, result.output
    result = run("account", "set", "alice", "--clear-memory-mb")
    assert result.exit_code == 0, result.output
    (_, first), (_, second) = calls
    assert (first.name, first.has_cpu_millis, first.cpu_millis, first.has_memory_mb) == (
        "alice",
        True,
        32000,
        False,
    )
    assert (first.has_max_pending, first.max_pending, first.has_weight, first.weight) == (
        True,
        10000,
        True,
        2.0,
    )
    assert first.idempotency_key
    assert (second.has_cpu_millis, second.has_weight, second.clear) == (False, False, ["memory_mb"])


def test_set_sends_the_max_priority_given_or_cleared(calls: list[tuple[str, Any]]) -> None:
    """--max-priority is sent with its has_ flag (a negative one too); --clear-max-priority as a
    setting to clear."""
    assert run("account", "set", "alice", "--max-priority", "10").exit_code == 0
    assert run("account", "set", "alice", "--max-priority", "-3").exit_code == 0
    assert run("account", "set", "alice", "--clear-max-priority").exit_code == 0
    (_, first), (_, second), (_, third) = calls
    assert (first.has_max_priority, first.max_priority, first.has_cpu_millis) == (True, 10, False)
    assert (second.has_max_priority, second.max_priority) == (True, -3)
    assert (third.has_max_priority, third.clear) == (False, ["max_priority"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cpu-millis", "-1"], "error: cpu_millis must be between 0 and 10000000000, got -1"),
        (["--max-pending", "100000001"], "error: max_pending must be between 0 and 100000000, got 100000001"),
        (["--weight", "0"], "error: weight must be a finite number >= 0.001 and <= 1e+06, got 0.0"),
        (
            ["--max-priority", "1000001"],
            "error: max_priority must be between -1000000 and 1000000, got 1000001",
        ),
        (
            ["--max-priority", "1", "--clear-max-priority"],
            "error: clear must not name a cap also given (max_priority=1), got 'max_priority'",
        ),
        (["--weight", "inf"], "error: --weight must be a finite number, got 'inf'"),
        (
            ["--cpu-millis", "1", "--clear-cpu-millis"],
            "error: clear must not name a cap also given (cpu_millis=1), got 'cpu_millis'",
        ),
        ([], "error: account must be given a cap, a weight or a cap to clear (nothing to set), got 'alice'"),
    ],
)
def test_set_refuses_bad_input_before_sending(
    calls: list[tuple[str, Any]], args: list[str], message: str
) -> None:
    """A negative or absurd cap, a weight of 0 or not finite, a cap both given and cleared, or
    nothing to set: one line naming the field, the value and the limit, exit 2, nothing sent."""
    result = run("account", "set", "alice", *args)
    assert result.exit_code == EXIT_INVALID
    assert [line for line in result.output.splitlines() if line.strip()] == [message]
    assert calls == []


def test_a_name_breaking_the_id_rules_is_refused(calls: list[tuple[str, Any]]) -> None:
    """An account name that breaks the id rules is refused naming it, nothing sent."""
    result = run("account", "set", "al ice", "--cpu-millis", "1")
    assert result.exit_code == EXIT_INVALID
    assert "error: name must be 1-64 characters" in result.output and "'al ice'" in result.output
    assert calls == []


def test_list_shows_each_cap_beside_what_the_account_uses(calls: list[tuple[str, Any]]) -> None:
    """The table's rows: the account, used / cap for cpu_millis, memory_mb and queued jobs (``-``:
    no cap), the max priority (``0 (default)`` when not set), and the weight."""
    result = run("account", "list")
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip().startswith(("alice", "bob"))]
    assert rows == [
        ["alice", "32000", "/", "32000", "16384", "/", "65536", "7", "/", "-", "0", "(default)", "1"],
        ["bob", "0", "/", "-", "0", "/", "-", "3", "/", "10", "5", "2"],
    ]
    assert result.output.rstrip().endswith("2 accounts")


def test_show_json_prints_caps_weight_and_use(calls: list[tuple[str, Any]]) -> None:
    """``show --json``: the caps (null: none), the max priority (null: the default), the weight
    and what the account uses now."""
    result = run("account", "show", "alice", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {
        "name": "alice",
        "cpu_millis": 32000,
        "memory_mb": 65536,
        "max_pending": None,
        "max_priority": None,
        "weight": 1.0,
        "used_cpu_millis": 32000,
        "used_memory_mb": 16384,
        "queued_jobs": 7,
    }
    assert calls == [("get_account", pb.GetAccountRequest(name="alice"))]
