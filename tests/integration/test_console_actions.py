"""The console's actions and its newer reads, served for real (Hypercorn, Starlette, a real
PostgreSQL) over HTTPS with login tokens, asked over HTTP as a page's script would.

Actions (cancel, cordon, uncordon, drain) go through the ingest's handlers: the roles of
``CONTROL_PLANE_ACCESS``, the account scope, and an audit row naming the token's identity. A
request without the action header, or from an origin that is not one of the cluster's consoles,
changes nothing. The jobs page pages and searches by id, by name and by an array task's
``name[index]``; a job's page shows its history.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from seeding import insert_job
from test_console import console_on, get, seed_alice_and_bob

from actors.console import Console
from actors.console.actions import MAX_ACTION_BODY_BYTES
from ops.certs import init_cluster, issue
from runtime.aio import PgConnection, asyncio_bridge
from runtime.console_token import make_token
from runtime.tls import TlsFiles


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    folder = tmp_path / "certs"
    init_cluster(folder)
    issue(folder, role="user", id="alice")
    return folder


async def fetch(database_url: str, sql: str, *args: Any) -> list[Any]:
    async with asyncio_bridge():
        db = await PgConnection.connect(database_url)
        try:
            return list(await db.fetch(sql, *args))
        finally:
            await db.close()


def bearer(certs: Path, id: str) -> dict[str, str]:
    token = make_token(TlsFiles.in_dir(certs, id), now_unix_s=time.time(), lifetime_s=600)
    return {"Authorization": f"Bearer {token}"}


async def act(
    console: Console,
    path: str,
    headers: dict[str, str],
    body: dict[str, Any] | None = None,
    *,
    origin: str | None = "own",
    action_header: bool = True,
    content_type: str = "application/json",
) -> tuple[int, str]:
    """(status, body) of an action request as the page's script sends it, unless told otherwise."""
    sent = {**headers, "Content-Type": content_type}
    if origin is not None:
        sent["Origin"] = console.url if origin == "own" else origin
    if action_header:
        sent["X-Stockade-Action"] = "1"
    payload = json.dumps(body if body is not None else {"idempotency_key": f"k-{time.monotonic_ns()}"})
    status, _, text = await get(console, path, sent, method="POST", body=payload.encode())
    return status, text


async def test_an_operator_cancels_a_job_and_the_audit_trail_names_the_tokens_identity(
    database_url: str, certs: Path
) -> None:
    """An operator's cancel from the console cancels the pending job and writes one audit row
    naming the operator, as `stockade cancel` would."""
    alices, _ = await seed_alice_and_bob(database_url)
    async with console_on(database_url, tls=TlsFiles.in_dir(certs, "cp-1")) as console:
        status, body = await act(console, f"/action/jobs/{alices}/cancel", bearer(certs, "operator"))
    assert status == 200, body
    assert 'data-ok="yes"' in body and f"job {alices}: cancelled" in body
    (job,) = await fetch(database_url, "SELECT state FROM jobs WHERE id = $1", alices)
    assert job["state"] == "cancelled"
    rows = await fetch(database_url, "SELECT role, actor_id, action, target_ids FROM audit_log")
    assert [(r["role"], r["actor_id"], r["action"]) for r in rows] == [("operator", "operator", "cancel")]
    assert json.loads(rows[0]["target_ids"]) == [alices]


async def test_a_viewer_is_refused_every_action_and_nothing_changes(database_url: str, certs: Path) -> None:
    """A viewer's cancel, cordon, uncordon and drain are each refused (403, saying why); the job
    stays pending, the worker uncordoned, and the audit trail empty."""
    alices, _ = await seed_alice_and_bob(database_url)
    async with console_on(database_url, tls=TlsFiles.in_dir(certs, "cp-1")) as console:
        answers = [
            await act(console, path, bearer(certs, "viewer"))
            for path in (
                f"/action/jobs/{alices}/cancel",
                "/action/workers/w-1/cordon",
                "/action/workers/w-1/uncordon",
                "/action/workers/w-1/drain",
            )
        ]
    for status, body in answers:
        assert status == 403 and "permission denied" in body and 'data-ok="no"' in body
    (job,) = await fetch(database_url, "SELECT state FROM jobs WHERE id = $1", alices)
    (worker,) = await fetch(database_url, "SELECT cordoned_at, drain_requested_at FROM workers")
    assert (
        job["state"] == "pending" and worker["cordoned_at"] is None and worker["drain_requested_at"] is None
    )
    assert await fetch(database_url, "SELECT * FROM audit_log") == []


async def test_a_user_cancels_its_own_job_only_and_may_not_cordon(database_url: str, certs: Path) -> None:
    """alice (a user) cancels her job; bob's is as no job to her (404) and stays pending; her
    cordon is refused (403)."""
    alices, bobs = await seed_alice_and_bob(database_url)
    async with console_on(database_url, tls=TlsFiles.in_dir(certs, "cp-1")) as console:
        own = await act(console, f"/action/jobs/{alices}/cancel", bearer(certs, "alice"))
        other = await act(console, f"/action/jobs/{bobs}/cancel", bearer(certs, "alice"))
        cordon = await act(console, "/action/workers/w-1/cordon", bearer(certs, "alice"))
    assert own[0] == 200 and other[0] == 404 and cordon[0] == 403
    states = {r["id"]: r["state"] for r in await fetch(database_url, "SELECT id, state FROM jobs")}
    assert states == {alices: "cancelled", bobs: "pending"}
    rows = await fetch(database_url, "SELECT role, actor_id, account, action FROM audit_log")
    assert [tuple(r.values()) for r in rows] == [("user", "alice", "alice", "cancel")]


async def test_cordon_drain_and_uncordon_change_the_worker_and_are_audited(
    database_url: str, certs: Path
) -> None:
    """An operator's cordon, drain (with a deadline) and uncordon each change worker w-1 as the
    gRPC calls do, answer what the worker is now, and leave one audit row each, in order."""
    await seed_alice_and_bob(database_url)
    operator = bearer(certs, "operator")
    async with console_on(database_url, tls=TlsFiles.in_dir(certs, "cp-1")) as console:
        cordon = await act(console, "/action/workers/w-1/cordon", operator)
        (after_cordon,) = await fetch(database_url, "SELECT cordoned_at FROM workers")
        body = {"idempotency_key": "drain-1", "deadline_s": 30}
        drain = await act(console, "/action/workers/w-1/drain", operator, body)
        (after_drain,) = await fetch(
            database_url, "SELECT drain_requested_at, drain_deadline_at FROM workers"
        )
        uncordon = await act(console, "/action/workers/w-1/uncordon", operator)
        bad_deadline = await act(
            console, "/action/workers/w-1/drain", operator, {"idempotency_key": "d2", "deadline_s": "soon"}
        )
    assert cordon[0] == 200 and "worker w-1: cordoned" in cordon[1]
    assert after_cordon["cordoned_at"] is not None
    assert drain[0] == 200 and "deadline" in drain[1]
    assert after_drain["drain_requested_at"] is not None and after_drain["drain_deadline_at"] is not None
    assert uncordon[0] == 200 and "worker w-1: takes placements" in uncordon[1]
    assert bad_deadline[0] == 400 and "deadline_s must be a number" in bad_deadline[1]
    (worker,) = await fetch(database_url, "SELECT cordoned_at, drain_requested_at FROM workers")
    assert worker["cordoned_at"] is None and worker["drain_requested_at"] is None
    rows = await fetch(database_url, "SELECT action, arguments FROM audit_log ORDER BY id")
    assert [r["action"] for r in rows] == ["cordon", "drain", "uncordon"]
    assert json.loads(rows[1]["arguments"]) == {"deadline_s": 30.0}


async def test_the_console_speaks_http_1_1_and_outlives_bodies_it_refused_unread(
    database_url: str, certs: Path
) -> None:
    """A client offering HTTP/2 gets HTTP/1.1 (hypercorn's HTTP/2 crashed the console on body
    data of a stream it had answered), and so does one asking to upgrade to it or opening with
    its preface; requests whose large bodies were refused unread leave the console serving."""
    alices, _ = await seed_alice_and_bob(database_url)
    path = f"/action/jobs/{alices}/cancel"
    async with console_on(database_url, tls=TlsFiles.in_dir(certs, "cp-1")) as console:

        def negotiated() -> str | None:
            context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
            context.check_hostname = False
            context.set_alpn_protocols(["h2", "http/1.1"])
            raw = socket.create_connection(("127.0.0.1", console.http_port), timeout=10)
            with context.wrap_socket(raw) as tls:
                return tls.selected_alpn_protocol()

        assert await trio.to_thread.run_sync(negotiated) == "http/1.1"

        def sent_raw(data: bytes) -> bytes:
            """What the console answers ``data`` sent on a fresh TLS connection, until it closes
            or is quiet for 2 s."""
            context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
            context.check_hostname = False
            raw = socket.create_connection(("127.0.0.1", console.http_port), timeout=10)
            with context.wrap_socket(raw) as tls:
                tls.sendall(data)
                tls.settimeout(2.0)
                answer = b""
                with contextlib.suppress(OSError):
                    while chunk := tls.recv(65536):
                        answer += chunk
                return answer

        # An h2c upgrade with a malformed HTTP2-Settings header, and HTTP/2's preface with a
        # frame: each once crashed the console (hypercorn switched to HTTP/2 regardless of ALPN).
        upgrade = (
            b"GET /part HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: h2c\r\nHTTP2-Settings: A\r\n\r\n"
        )
        answered = await trio.to_thread.run_sync(sent_raw, upgrade)
        assert answered.startswith(b"HTTP/1.1 ") and not answered.startswith(b"HTTP/1.1 101")
        preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")
        assert not (await trio.to_thread.run_sync(sent_raw, preface)).startswith(b"HTTP/1.1 101")
        headers = {**bearer(certs, "viewer"), "Origin": console.url, "X-Stockade-Action": "1"}
        for _ in range(8):
            with contextlib.suppress(OSError, http.client.HTTPException):
                await get(console, path, headers, method="POST", body=b"a" * 1_000_000)
        status, _, body = await get(console, "/part", bearer(certs, "operator"))
    assert status == 200 and 'id="leader"' in body


async def test_cross_site_requests_change_nothing(database_url: str, certs: Path) -> None:
    """A form post of another site (foreign Origin, no action header), a request with no Origin,
    and one without the action header are each refused (403) before any login check or
    change; a preflight from a foreign origin is not allowed."""
    alices, _ = await seed_alice_and_bob(database_url)
    operator = bearer(certs, "operator")
    path = f"/action/jobs/{alices}/cancel"
    async with console_on(database_url, tls=TlsFiles.in_dir(certs, "cp-1")) as console:
        form = await act(
            console,
            path,
            {},
            origin="https://evil.example",
            action_header=False,
            content_type="application/x-www-form-urlencoded",
        )
        foreign = await act(console, path, operator, origin="https://evil.example")
        no_origin = await act(console, path, operator, origin=None)
        no_header = await act(console, path, operator, action_header=False)
        preflight = await get(
            console,
            path,
            {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
            method="OPTIONS",
        )
    for status, body in (form, foreign, no_origin, no_header):
        assert status == 403 and "cross-site request refused" in body
    assert "access-control-allow-origin" not in preflight[1]
    (job,) = await fetch(database_url, "SELECT state FROM jobs WHERE id = $1", alices)
    assert job["state"] == "pending"
    assert await fetch(database_url, "SELECT * FROM audit_log") == []


async def test_a_long_or_malformed_body_is_refused_and_a_refused_role_never_has_it_read(
    database_url: str, certs: Path
) -> None:
    """A body past MAX_ACTION_BODY_BYTES is refused (400, naming the limit) without being read,
    and a viewer's is refused for its role first (403); a body nested past Python's recursion
    limit is no JSON object (400, not a failed page); nothing changes."""
    alices, _ = await seed_alice_and_bob(database_url)
    path = f"/action/jobs/{alices}/cancel"
    long = {"idempotency_key": "k", "pad": "a" * MAX_ACTION_BODY_BYTES}
    async with console_on(database_url, tls=TlsFiles.in_dir(certs, "cp-1")) as console:
        too_long = await act(console, path, bearer(certs, "operator"), long)
        viewer = await act(console, path, bearer(certs, "viewer"), long)
        headers = {**bearer(certs, "operator"), "Origin": console.url, "X-Stockade-Action": "1"}
        nested = await get(console, path, headers, method="POST", body=b"[" * 3000)
    assert too_long[0] == 400 and f"body must be at most {MAX_ACTION_BODY_BYTES} bytes" in too_long[1]
    assert viewer[0] == 403 and "permission denied" in viewer[1]
    assert nested[0] == 400 and "body must be a JSON object" in nested[2]
    (job,) = await fetch(database_url, "SELECT state FROM jobs WHERE id = $1", alices)
    assert job["state"] == "pending" and await fetch(database_url, "SELECT * FROM audit_log") == []


async def test_a_cancel_of_a_job_that_had_ended_is_not_done(database_url: str, certs: Path) -> None:
    """Cancelling a job that had already succeeded is answered as not done (409), as `stockade
    cancel` says it (exit 3); the job keeps its success. A page opened as localhost (the
    certificates name it) may act as one opened as 127.0.0.1."""
    alices, bobs = await seed_alice_and_bob(database_url)
    await fetch(database_url, "UPDATE jobs SET state = 'succeeded', reason = '' WHERE id = $1", alices)
    async with console_on(database_url, tls=TlsFiles.in_dir(certs, "cp-1")) as console:
        ended = await act(console, f"/action/jobs/{alices}/cancel", bearer(certs, "operator"))
        local = console.url.replace("127.0.0.1", "localhost")
        as_localhost = await act(
            console, f"/action/jobs/{bobs}/cancel", bearer(certs, "operator"), origin=local
        )
    assert ended[0] == 409 and f"job {alices} succeeded before the cancel took effect" in ended[1]
    assert 'data-ok="no"' in ended[1]
    assert as_localhost[0] == 200 and f"job {bobs}: cancelled" in as_localhost[1]
    states = await fetch(
        database_url, "SELECT id, state FROM jobs WHERE id = ANY($1) ORDER BY id", [alices, bobs]
    )
    assert {r["id"]: r["state"] for r in states} == {alices: "succeeded", bobs: "cancelled"}


async def test_the_jobs_part_pages_and_searches_by_id_name_and_task(database_url: str) -> None:
    """60 jobs list 50 to a page, newest first, with a link to the 10 older ones; a search by id
    finds one job, by id of an array its tasks, by name the matching jobs, and by
    ``name[index]`` the one task."""
    async with asyncio_bridge():
        db = await PgConnection.connect(database_url)
        try:
            ids = [await insert_job(db, f"job-{n}", 100, 64, 0, "sleep", 1000, None) for n in range(60)]
            await db.execute(
                "UPDATE jobs SET name = 'job-10', array_id = $1, array_index = id - $1 "
                "WHERE id BETWEEN $1 AND $1 + 2",
                ids[10],
            )
        finally:
            await db.close()
    async with console_on(database_url) as console:
        first = await get(console, "/part/jobs")
        older_link = first[2].split('id="jobs-older" ', 1)[0].rsplit('href="', 1)[1].split('"', 1)[0]
        second = await get(console, "/part" + older_link.replace("&amp;", "&"))
        by_id = await get(console, f"/part/jobs?id={ids[42]}")
        by_array = await get(console, f"/part/jobs?id={ids[10]}")
        by_name = await get(console, "/part/jobs?name=job-5")
        by_task = await get(console, "/part/jobs?name=job-10%5B1%5D")
        bad_id = await get(console, "/part/jobs?id=abc")

    def listed(body: str) -> list[int]:
        return [int(part.split('"', 1)[0]) for part in body.split('<tr data-id="')[1:]]

    assert listed(first[2]) == sorted(ids, reverse=True)[:50]
    assert older_link == f"/jobs?before={ids[10]}"
    assert listed(second[2]) == sorted(ids, reverse=True)[50:]
    assert 'id="jobs-older"' not in second[2] and 'id="jobs-newest"' in second[2]
    assert listed(by_id[2]) == [ids[42]]
    assert listed(by_array[2]) == [ids[12], ids[11], ids[10]]
    assert listed(by_name[2]) == sorted([ids[5], *ids[50:60]], reverse=True)
    assert listed(by_task[2]) == [ids[11]] and "job-10[1]" in by_task[2]
    assert "task 1 of an array or gang whose name contains &ldquo;job-10&rdquo;" in by_task[2]
    assert bad_id[0] == 400 and "id must be a job id" in bad_id[2]


async def test_the_job_part_shows_its_history_and_actions(database_url: str, certs: Path) -> None:
    """A pending job's part shows its history (submitted, as `stockade job --events` has it) and
    a cancel button; after an operator's cancel the history ends with the cancel and the button
    is gone. The output page of a job that never ran says why it shows none."""
    alices, _ = await seed_alice_and_bob(database_url)
    async with console_on(database_url, tls=TlsFiles.in_dir(certs, "cp-1")) as console:
        before = await get(console, f"/part/jobs/{alices}", bearer(certs, "viewer"))
        await act(console, f"/action/jobs/{alices}/cancel", bearer(certs, "operator"))
        after = await get(console, f"/part/jobs/{alices}", bearer(certs, "viewer"))
        output = await get(console, f"/part/jobs/{alices}/output?stream=stderr", bearer(certs, "viewer"))
        bad_stream = await get(console, f"/part/jobs/{alices}/output?stream=stdin", bearer(certs, "viewer"))
    assert '<li data-kind="submitted">' in before[2]
    assert 'id="action-cancel"' in before[2] and 'data-action-url="/action/jobs/' in before[2]
    assert '<li data-kind="final">' in after[2] and "cancelled" in after[2]
    assert 'id="action-cancel"' not in after[2]
    assert output[0] == 200 and 'id="output-note"' in output[2]
    assert bad_stream[0] == 400


async def test_an_arrays_task_page_cancels_the_array_or_the_task_alone(
    database_url: str, certs: Path
) -> None:
    """A task's page offers "cancel the array" (posted to the array's id) and "cancel this
    task"; the task alone is cancelled by the second, and every task left by the first."""
    async with asyncio_bridge():
        db = await PgConnection.connect(database_url)
        try:
            ids = [await insert_job(db, "sh", 100, 64, 0, "sleep", 1000, None) for _ in range(3)]
            await db.execute(
                "UPDATE jobs SET array_id = $1, array_index = id - $1 WHERE id = ANY($2::bigint[])",
                ids[0],
                ids,
            )
        finally:
            await db.close()
    operator = bearer(certs, "operator")
    async with console_on(database_url, tls=TlsFiles.in_dir(certs, "cp-1")) as console:
        page = await get(console, f"/part/jobs/{ids[1]}", operator)
        task = await act(console, f"/action/jobs/{ids[1]}/cancel-task", operator)
        states_after_task = [
            r["state"] for r in await fetch(database_url, "SELECT state FROM jobs ORDER BY id")
        ]
        array = await act(console, f"/action/jobs/{ids[0]}/cancel", operator)
    assert f'data-action-url="/action/jobs/{ids[0]}/cancel"' in page[2] and "cancel the array" in page[2]
    assert f'data-action-url="/action/jobs/{ids[1]}/cancel-task"' in page[2]
    assert task[0] == 200 and f"job {ids[1]}: cancelled" in task[1]
    assert states_after_task == ["pending", "cancelled", "pending"]
    assert array[0] == 200 and f"job {ids[0]}: cancelled (2 tasks)" in array[1]
    assert [r["state"] for r in await fetch(database_url, "SELECT state FROM jobs")] == ["cancelled"] * 3


async def test_without_tls_an_action_is_taken_and_audited_as_the_plaintext_caller(database_url: str) -> None:
    """A console of a cluster run with --insecure asks for no login: its cancel is carried out
    as a plaintext gRPC call is, and audited as plaintext/anonymous; the cross-site checks hold."""
    alices, bobs = await seed_alice_and_bob(database_url)
    async with console_on(database_url) as console:
        done = await act(console, f"/action/jobs/{alices}/cancel", {})
        foreign = await act(console, f"/action/jobs/{bobs}/cancel", {}, origin="http://127.0.0.1:1")
    assert done[0] == 200 and foreign[0] == 403
    rows = await fetch(database_url, "SELECT role, actor_id, action FROM audit_log")
    assert [tuple(r.values()) for r in rows] == [("plaintext", "anonymous", "cancel")]
