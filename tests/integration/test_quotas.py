"""Quotas over real gRPC with mutual TLS and a real PostgreSQL: an operator sets an account's
caps (audited as account_set), users and viewers read them, bad input stores nothing, and a
submission past the account's max_pending is refused whole (docs/quotas.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from serving import mtls_control_plane, serve_ingests
from test_accounts import AUDIT_ROWS, call, certs, fetch, sleep_job, submit

from protocol import pb
from runtime.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from runtime.idempotency_keys import with_idempotency_key
from runtime.settings.control_plane import IngestSettings
from runtime.tls import TlsFiles, server_context

__all__ = ["certs"]  # the module's certificates, a fixture


def set_account(name: str, **fields: object) -> pb.SetAccountRequest:
    """A SetAccount request giving ``fields`` (``clear``: a list; the others with their has_)."""
    request = pb.SetAccountRequest(name=name, clear=list(fields.pop("clear", [])))  # type: ignore[call-overload]
    for field, value in fields.items():
        setattr(request, f"has_{field}", True)
        setattr(request, field, value)
    return with_idempotency_key(request)


async def test_an_operator_sets_caps_and_the_audit_names_them(database_url: str, certs: Path) -> None:
    """SetAccount stores the caps given, keeps the rest, clears those named, answers the account
    with its use, and writes one account_set row per change; a replayed copy writes none."""
    async with mtls_control_plane(database_url, certs) as address:
        first = set_account("alice", cpu_millis=32000, memory_mb=65536, max_pending=10000)
        info = await call(address, certs, "operator", "set_account", first)
        await call(address, certs, "operator", "set_account", first)  # a retry: replayed
        assert (info.cpu_millis, info.memory_mb, info.max_pending, info.weight) == (32000, 65536, 10000, 1.0)
        info = await call(address, certs, "operator", "set_account", set_account("alice", weight=2.5))
        assert (info.cpu_millis, info.weight) == (32000, 2.5)
        cleared = set_account("alice", clear=["cpu_millis"])
        info = await call(address, certs, "operator", "set_account", cleared)
        assert (info.has_cpu_millis, info.has_memory_mb, info.memory_mb) == (False, True, 65536)
    rows = await fetch(database_url, AUDIT_ROWS)
    assert [(r[1], r[4], json.loads(r[5]), json.loads(r[6])) for r in rows] == [
        (
            "operator",
            "account_set",
            ["alice"],
            {"cpu_millis": 32000, "memory_mb": 65536, "max_pending": 10000},
        ),
        ("operator", "account_set", ["alice"], {"weight": 2.5}),
        ("operator", "account_set", ["alice"], {"clear": ["cpu_millis"]}),
    ]


async def test_bad_caps_are_refused_naming_the_field_and_nothing_is_stored(
    database_url: str, certs: Path
) -> None:
    """A negative or absurd cap, a weight of 0 or not finite, a bad name or a cap both given and
    cleared is refused naming field, value and limit; no account row, no audit row."""
    async with mtls_control_plane(database_url, certs) as address:
        for request, message in [
            (set_account("alice", cpu_millis=-1), "cpu_millis must be between 0 and 10000000000, got -1"),
            (set_account("alice", memory_mb=2**40), "memory_mb must be between 0 and 167772160000"),
            (set_account("alice", max_pending=-5), "max_pending must be between 0 and 100000000, got -5"),
            (set_account("alice", weight=0.0), "weight must be a finite number >= 0.001"),
            (set_account("alice", weight=float("nan")), "weight must be a finite number >= 0.001"),
            (set_account("-alice", weight=1.0), "name must be 1-64 characters"),
            (
                set_account("alice", cpu_millis=1, clear=["cpu_millis"]),
                "clear must not name a cap also given",
            ),
        ]:
            with pytest.raises(InvalidArgument, match=message):
                await call(address, certs, "operator", "set_account", request)
    assert await fetch(database_url, "SELECT count(*) FROM accounts") == [(0,)]
    assert await fetch(database_url, AUDIT_ROWS) == []


async def test_users_read_their_own_account_only_and_may_not_set_one(database_url: str, certs: Path) -> None:
    """A user reads its own account (with what it uses) and lists only it; another account and
    SetAccount are refused; a viewer reads every account."""
    async with mtls_control_plane(database_url, certs) as address:
        await call(address, certs, "operator", "set_account", set_account("bob", max_pending=5))
        await submit(address, certs, "alice")
        own = await call(address, certs, "alice", "get_account", pb.GetAccountRequest(name="alice"))
        assert (own.name, own.has_cpu_millis, own.weight, own.queued_jobs) == ("alice", False, 1.0, 1)
        listed = await call(address, certs, "alice", "list_accounts", pb.ListAccountsRequest())
        assert [a.name for a in listed.accounts] == ["alice"]
        with pytest.raises(PermissionDenied, match="may read only account 'alice', not 'bob'"):
            await call(address, certs, "alice", "get_account", pb.GetAccountRequest(name="bob"))
        with pytest.raises(PermissionDenied, match="set_account needs operator"):
            await call(address, certs, "alice", "set_account", set_account("alice", max_pending=100))
        every = await call(address, certs, "viewer", "list_accounts", pb.ListAccountsRequest())
        assert [(a.name, a.max_pending, a.queued_jobs) for a in every.accounts] == [
            ("alice", 0, 1),
            ("bob", 5, 0),
        ]


async def test_a_submission_past_max_pending_is_refused_and_stores_nothing(
    database_url: str, certs: Path
) -> None:
    """With max_pending 3 and 2 queued, an array of 2 tasks and a batch of 2 are refused naming
    the account, its count and the cap (FailedPrecondition), storing no job and no audit row; one
    more job fits; another account is not held back."""
    async with mtls_control_plane(database_url, certs) as address:
        await call(address, certs, "operator", "set_account", set_account("alice", max_pending=3))
        await submit(address, certs, "alice")
        await submit(address, certs, "alice")
        array = sleep_job(array=pb.JobArray(first_index=0, last_index=1))
        refused = "quota: account alice has 2 pending and waiting jobs of max_pending 3; 2 more refused"
        with pytest.raises(FailedPrecondition, match=refused):
            await submit(address, certs, "alice", array)
        batch = pb.SubmitJobsRequest(specs=[sleep_job().spec, sleep_job().spec])
        with pytest.raises(FailedPrecondition, match=refused):
            await call(address, certs, "alice", "submit_jobs", with_idempotency_key(batch))
        await submit(address, certs, "alice")
        await submit(address, certs, "bob")
    assert await fetch(database_url, "SELECT owner, count(*) FROM jobs GROUP BY owner ORDER BY owner") == [
        ("alice", 3),
        ("bob", 1),
    ]
    assert [r[4] for r in await fetch(database_url, AUDIT_ROWS)] == ["account_set"] + ["submit"] * 4


async def test_waiting_jobs_count_against_max_pending(database_url: str, certs: Path) -> None:
    """A job waiting for its dependency counts as a pending one does: with max_pending 2, a
    pending job and one waiting for it leave no room for a third."""
    async with mtls_control_plane(database_url, certs) as address:
        await call(address, certs, "operator", "set_account", set_account("alice", max_pending=2))
        first = await submit(address, certs, "alice")
        after = sleep_job()
        after.spec.after = [first]
        await submit(address, certs, "alice", after)
        with pytest.raises(FailedPrecondition, match="alice has 2 pending and waiting jobs of max_pending 2"):
            await submit(address, certs, "alice")
    assert await fetch(database_url, "SELECT state FROM jobs ORDER BY id") == [("pending",), ("waiting",)]


async def test_concurrent_submissions_cannot_both_pass_max_pending(database_url: str, certs: Path) -> None:
    """Twenty single submissions at once, alternating between two replicas of four connections
    each, with max_pending 5: exactly five are stored, the rest refused naming the cap."""
    settings = IngestSettings(pool_size=5, liveness_reserved_connections=1)
    tls = server_context(TlsFiles.in_dir(certs, "cp-1"))
    async with serve_ingests(database_url, "cp-1", "cp-2", settings=settings, tls=tls) as ingests:
        addresses = [i.address for i in ingests]
        await call(addresses[0], certs, "operator", "set_account", set_account("alice", max_pending=5))
        outcomes: list[str] = []

        async def one(address: str) -> None:
            try:
                await submit(address, certs, "alice")
                outcomes.append("stored")
            except FailedPrecondition as exc:
                assert "max_pending 5" in str(exc)
                outcomes.append("refused")

        async with trio.open_nursery() as nursery:
            for n in range(20):
                nursery.start_soon(one, addresses[n % 2])
    assert sorted(outcomes) == ["refused"] * 15 + ["stored"] * 5
    assert await fetch(database_url, "SELECT count(*) FROM jobs") == [(5,)]


async def test_an_unknown_account_is_not_found_but_a_users_own_always_reads(
    database_url: str, certs: Path
) -> None:
    """An operator's read of a name with no settings and no jobs (a typo) is NOT_FOUND, naming it;
    once it has settings it reads. A user that has not submitted anything yet still reads its own
    account (its certificate names it)."""
    async with mtls_control_plane(database_url, certs) as address:
        with pytest.raises(NotFound, match="account 'alcie' is unknown: it has no settings and no jobs"):
            await call(address, certs, "operator", "get_account", pb.GetAccountRequest(name="alcie"))
        own = await call(address, certs, "bob", "get_account", pb.GetAccountRequest(name="bob"))
        assert (own.name, own.weight, own.queued_jobs) == ("bob", 1.0, 0)
        await call(address, certs, "operator", "set_account", set_account("alcie", max_pending=5))
        shown = await call(address, certs, "viewer", "get_account", pb.GetAccountRequest(name="alcie"))
        assert (shown.name, shown.max_pending) == ("alcie", 5)
