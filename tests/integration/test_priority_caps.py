"""Priority caps over real gRPC with mutual TLS and a real PostgreSQL: a user's job may not have a
priority above its account's max_priority (0 unless an operator set one); operators are not
capped; a refused submission stores nothing and writes no audit row (docs/quotas.md, "Priority
cap")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serving import mtls_control_plane, serve_ingests
from test_accounts import AUDIT_ROWS, CALL_TIMEOUT_S, call, certs, fetch, sleep_job, submit
from test_quotas import set_account

from protocol import pb
from runtime.accounts import DEFAULT_MAX_PRIORITY
from runtime.aio import GrpcChannel
from runtime.errors import InvalidArgument, PermissionDenied
from runtime.idempotency_keys import with_idempotency_key
from runtime.jobs import MAX_PRIORITY
from runtime.settings.control_plane import IngestSettings

__all__ = ["certs"]  # the module's certificates, a fixture

JOBS = "SELECT owner, priority FROM jobs ORDER BY id"


def job_at(priority: int, array: pb.JobArray | None = None) -> pb.SubmitJobRequest:
    """A sleep job of ``priority`` (an array when ``array`` is given)."""
    request = sleep_job(array=array)
    request.spec.priority = priority
    return request


def batch_at(*priorities: int) -> pb.SubmitJobsRequest:
    """A SubmitJobs batch of sleep jobs, one per priority, in order."""
    specs = [job_at(p).spec for p in priorities]
    return with_idempotency_key(pb.SubmitJobsRequest(specs=specs))


async def test_a_users_job_above_the_default_cap_is_refused_and_nothing_is_stored(
    database_url: str, certs: Path
) -> None:
    """With no max_priority set, a user's job, array or batch of priority above 0 is refused
    whole (InvalidArgument naming the field, the value, the account's cap and how to raise it):
    no job, no audit row."""
    over = DEFAULT_MAX_PRIORITY + 1
    rule = rf"must be at most account alice's max_priority {DEFAULT_MAX_PRIORITY}, got {over}"
    hint = r"\(an operator may raise it: stockade account set alice --max-priority N\)"
    async with mtls_control_plane(database_url, certs) as address:
        with pytest.raises(InvalidArgument, match=rf"^priority {rule} {hint}$"):
            await submit(address, certs, "alice", job_at(over))
        with pytest.raises(InvalidArgument, match=rf"^priority {rule}"):
            await submit(
                address, certs, "alice", job_at(over, array=pb.JobArray(first_index=0, last_index=3))
            )
        with pytest.raises(InvalidArgument, match=rf"^specs\[1\]\.priority {rule}"):
            await call(address, certs, "alice", "submit_jobs", batch_at(DEFAULT_MAX_PRIORITY, over, -3))
    assert await fetch(database_url, JOBS) == []
    assert await fetch(database_url, AUDIT_ROWS) == []


async def test_a_users_job_at_or_below_the_cap_is_accepted(database_url: str, certs: Path) -> None:
    """A user may submit at the default cap and below it (lowering its own jobs' priority), and,
    once an operator set max_priority 10, up to 10 but not 11."""
    async with mtls_control_plane(database_url, certs) as address:
        await submit(address, certs, "alice", job_at(DEFAULT_MAX_PRIORITY))
        await call(address, certs, "alice", "submit_jobs", batch_at(-5, -MAX_PRIORITY))
        await call(address, certs, "operator", "set_account", set_account("alice", max_priority=10))
        await submit(address, certs, "alice", job_at(10))
        with pytest.raises(
            InvalidArgument, match="priority must be at most account alice's max_priority 10, got 11"
        ):
            await submit(address, certs, "alice", job_at(11))
    assert await fetch(database_url, JOBS) == [
        ("alice", 0),
        ("alice", -5),
        ("alice", -MAX_PRIORITY),
        ("alice", 10),
    ]


async def test_an_operator_is_not_capped(database_url: str, certs: Path) -> None:
    """An operator's jobs may have any priority of the job range, even with its account's
    max_priority set below it."""
    async with mtls_control_plane(database_url, certs) as address:
        await call(address, certs, "operator", "set_account", set_account("operator", max_priority=-10))
        await submit(address, certs, "operator", job_at(MAX_PRIORITY))
        await call(address, certs, "operator", "submit_jobs", batch_at(50, MAX_PRIORITY))
    assert await fetch(database_url, JOBS) == [
        ("operator", MAX_PRIORITY),
        ("operator", 50),
        ("operator", MAX_PRIORITY),
    ]


async def test_a_plaintext_caller_is_not_capped(database_url: str) -> None:
    """On a server run with --insecure the one caller, anonymous, has operator rights: its jobs
    are not capped."""
    settings = IngestSettings(pool_size=2, liveness_reserved_connections=1)
    async with serve_ingests(database_url, "cp-1", settings=settings) as (ingest,):
        channel = GrpcChannel(ingest.address)
        try:
            stub = channel.stub(pb.ControlPlaneStub)
            await channel.call(stub.submit_job, job_at(100), timeout_s=CALL_TIMEOUT_S)
        finally:
            channel.close()
    assert await fetch(database_url, JOBS) == [("anonymous", 100)]


async def test_a_cap_set_or_cleared_by_an_operator_holds_at_once(database_url: str, certs: Path) -> None:
    """The next submission after SetAccount sees the new max_priority; cleared, the default holds
    again; another account keeps its own cap. Each change is an account_set audit row."""
    async with mtls_control_plane(database_url, certs) as address:
        info = await call(address, certs, "operator", "set_account", set_account("alice", max_priority=50))
        assert (info.has_max_priority, info.max_priority) == (True, 50)
        await submit(address, certs, "alice", job_at(50))
        with pytest.raises(
            InvalidArgument, match="priority must be at most account bob's max_priority 0, got 50"
        ):
            await submit(address, certs, "bob", job_at(50))
        info = await call(address, certs, "operator", "set_account", set_account("alice", max_priority=-1))
        with pytest.raises(InvalidArgument, match="alice's max_priority -1, got 0"):
            await submit(address, certs, "alice", job_at(0))
        info = await call(
            address, certs, "operator", "set_account", set_account("alice", clear=["max_priority"])
        )
        assert info.has_max_priority is False
        await submit(address, certs, "alice", job_at(0))
        with pytest.raises(InvalidArgument, match="alice's max_priority 0, got 50"):
            await submit(address, certs, "alice", job_at(50))
        shown = await call(address, certs, "alice", "get_account", pb.GetAccountRequest(name="alice"))
        assert shown.has_max_priority is False
    assert await fetch(database_url, JOBS) == [("alice", 50), ("alice", 0)]
    rows = await fetch(database_url, AUDIT_ROWS)
    assert [(r[4], json.loads(r[6])) for r in rows if r[4] == "account_set"] == [
        ("account_set", {"max_priority": 50}),
        ("account_set", {"max_priority": -1}),
        ("account_set", {"clear": ["max_priority"]}),
    ]


async def test_a_user_may_not_set_a_cap_and_a_bad_cap_is_refused(database_url: str, certs: Path) -> None:
    """SetAccount's max_priority is an operator's: a user's is refused (PermissionDenied); a
    value outside the job priority range, or given and cleared at once, is refused naming the
    field, the value and the limit; nothing is stored."""
    async with mtls_control_plane(database_url, certs) as address:
        with pytest.raises(PermissionDenied, match="set_account needs operator"):
            await call(address, certs, "alice", "set_account", set_account("alice", max_priority=100))
        for request, message in [
            (
                set_account("alice", max_priority=MAX_PRIORITY + 1),
                f"max_priority must be between {-MAX_PRIORITY} and {MAX_PRIORITY}, got {MAX_PRIORITY + 1}",
            ),
            (
                set_account("alice", max_priority=-MAX_PRIORITY - 1),
                f"max_priority must be between {-MAX_PRIORITY} and {MAX_PRIORITY}",
            ),
            (
                set_account("alice", max_priority=1, clear=["max_priority"]),
                "clear must not name a cap also given",
            ),
        ]:
            with pytest.raises(InvalidArgument, match=message):
                await call(address, certs, "operator", "set_account", request)
        with pytest.raises(InvalidArgument, match="alice's max_priority 0, got 100"):
            await submit(address, certs, "alice", job_at(100))
    assert await fetch(database_url, "SELECT count(*) FROM accounts") == [(0,)]
    assert await fetch(database_url, AUDIT_ROWS) == []


async def test_the_priority_cap_is_judged_before_max_pending(database_url: str, certs: Path) -> None:
    """A submission over both the priority cap and max_pending is refused as bad input
    (InvalidArgument), not as a full queue."""
    async with mtls_control_plane(database_url, certs) as address:
        await call(address, certs, "operator", "set_account", set_account("alice", max_pending=0))
        with pytest.raises(InvalidArgument, match="alice's max_priority 0, got 5"):
            await submit(address, certs, "alice", job_at(5))
    assert await fetch(database_url, JOBS) == []
