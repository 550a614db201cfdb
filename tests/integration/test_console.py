"""The web console served for real (Hypercorn, Starlette, a real PostgreSQL), asked over HTTP.

Each test starts one :class:`actors.console.Console` on a free 127.0.0.1 port, seeds the rows
it needs straight into the test's database, and reads the pages' parts as a page's script
would: 404 for what does not exist, markup in a query shown as text, the database's outage
shown with its time, and, over HTTPS, no part without a valid login token.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from seeding import insert_job

from actors.console import Console
from ops.certs import init_cluster, issue
from runtime.aio import PgConnection, asyncio_bridge
from runtime.console_token import make_token
from runtime.settings.control_plane import ConsoleSettings
from runtime.tls import TlsFiles

DEAD_DATABASE_URL = "postgresql://postgres@127.0.0.1:9/stockade"
"""Nothing listens on port 9 (discard) here: every connect is refused at once."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def console_on(
    database_url: str, *, tls: TlsFiles | None = None, settings: ConsoleSettings | None = None
) -> AsyncIterator[Console]:
    port = free_port()
    console = Console(
        cp_id="cp-1",
        database_url=database_url,
        listen_host="127.0.0.1",
        http_port=port,
        settings=settings or ConsoleSettings(),
        tls=tls,
    )
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        await nursery.start(console.run)
        yield console
        nursery.cancel_scope.cancel()


async def get(
    console: Console,
    path: str,
    headers: dict[str, str] | None = None,
    *,
    method: str = "GET",
    body: bytes | None = None,
) -> tuple[int, dict[str, str], str]:
    """(status, headers, body) of one request to ``console`` (with ``body``, if given), sent
    from a thread."""
    host, port = "127.0.0.1", console.http_port

    def request() -> tuple[int, dict[str, str], str]:
        if console.url.startswith("https"):
            context = ssl.create_default_context(cafile=str(console.tls.ca_path) if console.tls else None)
            context.check_hostname = False
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, context=context, timeout=10
            )
        else:
            conn = http.client.HTTPConnection(host, port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read().decode()
        finally:
            conn.close()

    return await trio.to_thread.run_sync(request)


async def seed_cluster(database_url: str) -> int:
    """cp-1 leads at epoch 4 (taken over as the lease's first holder), one worker w-1, one
    command job on it; returns the job's id."""
    async with asyncio_bridge():
        db = await PgConnection.connect(database_url)
        try:
            return await _seed(db)
        finally:
            await db.close()


async def seed_alice_and_bob(database_url: str) -> tuple[int, int]:
    """The cluster of :func:`seed_cluster`, its job alice's, and a pending job of bob's;
    returns (alice's job id, bob's)."""
    async with asyncio_bridge():
        db = await PgConnection.connect(database_url)
        try:
            alices = await _seed(db)
            bobs = await insert_job(db, "bobs-job", 500, 256, 0, "command", None, ["echo", "bob"])
            await db.execute("UPDATE jobs SET owner = CASE WHEN id = $1 THEN 'alice' ELSE 'bob' END", alices)
        finally:
            await db.close()
    return alices, bobs


async def _seed(db: PgConnection) -> int:
    await db.execute("UPDATE lease SET holder = 'cp-1', epoch = 4, expires_at = now() + interval '1 hour'")
    await db.execute(
        "INSERT INTO lease_history (epoch, holder, acquired_at, previous, cause) "
        "VALUES (4, 'cp-1', now() - interval '90 seconds', NULL, 'first')"
    )
    await db.execute(
        "INSERT INTO control_planes (id, address, pid, console_url) VALUES ('cp-1', '127.0.0.1:1', 1, NULL)"
    )
    await db.execute(
        "INSERT INTO workers (id, address, cpu_millis, memory_mb, incarnation, labels) "
        "VALUES ('w-1', '127.0.0.1:2', 4000, 8192, 1, '{\"zone\": \"a\"}')"
    )
    return await insert_job(db, "hello <b>world</b>", 500, 256, 0, "command", None, ["echo", "hi"])


async def test_the_cluster_part_shows_the_leader_its_epoch_and_the_election_cause(database_url: str) -> None:
    """The cluster part names the lease's holder, its epoch and the election's cause."""
    await seed_cluster(database_url)
    async with console_on(database_url) as console:
        status, headers, body = await get(console, "/part")
    assert status == 200
    assert '<dd id="leader">cp-1</dd>' in body
    assert '<dd id="epoch">4</dd>' in body
    assert ">first<" in body
    assert headers["x-stockade-served-by"] == "cp-1"
    assert "no-store" in headers["cache-control"]


async def test_pages_of_unknown_jobs_and_workers_are_404_pages(database_url: str) -> None:
    """An unknown job id, a job id that is no number, an unknown worker and an unknown path
    each get a 404 page naming what was asked for, not a traceback."""
    await seed_cluster(database_url)
    async with console_on(database_url) as console:
        unknown_job = await get(console, "/part/jobs/999999")
        not_a_number = await get(console, "/part/jobs/12abc")
        unknown_worker = await get(console, "/part/workers/w-nobody")
        unknown_path = await get(console, "/no/such/page")
    assert unknown_job[0] == 404 and "no job 999999" in unknown_job[2]
    assert not_a_number[0] == 404 and "no job &#39;12abc&#39;" in not_a_number[2]
    assert unknown_worker[0] == 404 and "w-nobody" in unknown_worker[2]
    assert unknown_path[0] == 404 and "no page at /no/such/page" in unknown_path[2]
    for _, _, body in (unknown_job, not_a_number, unknown_worker, unknown_path):
        assert "Traceback" not in body


async def test_markup_in_query_parameters_and_job_names_is_shown_as_text(database_url: str) -> None:
    """A name filter holding a script tag, and a job name holding markup, come back escaped."""
    await seed_cluster(database_url)
    async with console_on(database_url) as console:
        status, _, body = await get(console, "/part/jobs?name=%3Cscript%3Ealert(1)%3C%2Fscript%3E")
        listed = await get(console, "/part/jobs")
        bad_state = await get(console, "/part/jobs?state=%3Cimg%20src%3Dx%3E")
    assert status == 200
    assert "<script>alert(1)</script>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "hello &lt;b&gt;world&lt;/b&gt;" in listed[2] and "<b>world</b>" not in listed[2]
    assert bad_state[0] == 400
    assert "<img src=x>" not in bad_state[2] and "&lt;img src=x&gt;" in bad_state[2]


async def test_a_nul_in_a_filter_is_a_400_page_not_a_failed_query(database_url: str) -> None:
    """PostgreSQL text holds no NUL: such a filter is refused before any query, saying why."""
    await seed_cluster(database_url)
    async with console_on(database_url) as console:
        by_name = await get(console, "/part/jobs?name=%00")
        by_worker = await get(console, "/part/jobs?worker=w%00")
    for status, _, body in (by_name, by_worker):
        assert status == 400 and "may not hold a NUL character" in body


async def test_the_job_part_shows_its_spec_and_runs(database_url: str) -> None:
    """A job's part shows what it runs, its requests and its runs (none yet: never placed)."""
    job_id = await seed_cluster(database_url)
    async with console_on(database_url) as console:
        status, _, body = await get(console, f"/part/jobs/{job_id}")
        workers = await get(console, "/part/workers")
    assert status == 200
    assert "echo hi" in body and "500 cpu_millis, 256 MiB" in body
    assert "never placed yet" in body
    assert workers[0] == 200 and 'data-id="w-1" data-state="alive"' in workers[2] and "zone=a" in workers[2]


async def test_the_job_part_names_its_environment_but_shows_no_value(database_url: str) -> None:
    """A job with environment variables: its part lists their names and none of their values."""
    job_id = await seed_cluster(database_url)
    async with asyncio_bridge():
        db = await PgConnection.connect(database_url)
        try:
            await db.execute(
                """UPDATE jobs SET env = '{"API_TOKEN": "s3cret-t0ken", "MODE": "fast"}' WHERE id = $1""",
                job_id,
            )
        finally:
            await db.close()
    async with console_on(database_url) as console:
        status, _, body = await get(console, f"/part/jobs/{job_id}")
    assert status == 200
    assert "<code>API_TOKEN</code> <code>MODE</code>" in body
    assert "s3cret-t0ken" not in body and "fast" not in body


async def test_an_unhealthy_worker_shows_its_state_reason_and_probe(database_url: str) -> None:
    """A worker the leader marked unhealthy shows as such in the workers part (its reason on
    hover, escaped) and, on its own part, why, since when and when a probe may be placed."""
    await seed_cluster(database_url)
    async with asyncio_bridge():
        db = await PgConnection.connect(database_url)
        try:
            await db.execute(
                "UPDATE workers SET unhealthy_at = now(), unhealthy_marked_at = now(), "
                "unhealthy_probe_at = now() + interval '2 minutes', "
                "unhealthy_reason = 'unhealthy: 3 of the last 3 runs failed (other workers: 0 of 4), "
                "last: <x>'"
            )
        finally:
            await db.close()
    async with console_on(database_url) as console:
        workers = await get(console, "/part/workers")
        worker = await get(console, "/part/workers/w-1")
    assert 'data-id="w-1" data-state="unhealthy"' in workers[2]
    assert (
        'title="unhealthy: 3 of the last 3 runs failed (other workers: 0 of 4), last: &lt;x&gt;"'
        in workers[2]
    )
    assert '<span class="state state-unhealthy">unhealthy</span>' in worker[2]
    assert "unhealthy: 3 of the last 3 runs failed (other workers: 0 of 4), last: &lt;x&gt;" in worker[2]
    assert "a probe job may be placed in 1 min" in worker[2]


@pytest.mark.parametrize("columns", ["array_id = $1, array_index = 3", "gang_id = $1, gang_rank = 3"])
async def test_an_arrays_or_a_gangs_task_is_named_with_its_index_on_every_page(
    database_url: str, columns: str
) -> None:
    """A task of an array (index 3 of job sh's array), or of a gang (rank 3), reads sh[3] in the
    jobs list, on its own page and among its worker's assignments, and a search by ``sh[3]``
    finds it; a job of neither keeps its plain name."""
    await seed_cluster(database_url)
    async with asyncio_bridge():
        db = await PgConnection.connect(database_url)
        try:
            task = await insert_job(db, "sh", 100, 64, 0, "command", None, ["sh", "-c", "true"])
            await db.execute(f"UPDATE jobs SET {columns} WHERE id = $1", task)
            await db.execute(
                "INSERT INTO assignments (job_id, worker_id, worker_incarnation, cpu_millis, memory_mb,"
                " epoch) VALUES ($1, 'w-1', 1, 100, 64, 4)",
                task,
            )
        finally:
            await db.close()
    async with console_on(database_url) as console:
        jobs = await get(console, "/part/jobs")
        job = await get(console, f"/part/jobs/{task}")
        worker = await get(console, "/part/workers/w-1")
        found = await get(console, "/part/jobs?name=sh%5B3%5D")
    assert f'<a href="/jobs/{task}">{task}</a></td><td>sh[3]</td>' in jobs[2]
    assert f'<tr data-id="{task}"' in found[2]
    assert "<td>hello &lt;b&gt;world&lt;/b&gt;</td>" in jobs[2]
    assert '<span class="job-name" id="job-name">sh[3]</span>' in job[2]
    assert f'<a href="/jobs/{task}">{task}</a> sh[3]</td>' in worker[2]


async def test_the_page_shell_has_no_placeholder_and_fills_in_its_part_at_once(
    database_url: str,
) -> None:
    """A page's shell holds no "Loading" placeholder, and its script comes after the content's
    place, not deferred: it puts the part there before the first paint."""
    async with console_on(database_url) as console:
        status, _, body = await get(console, "/jobs/1")
    assert status == 200 and "Loading" not in body
    assert "defer" not in body
    assert body.index('<main id="content">') < body.index('<script src="/static/console.js"></script>')


async def test_an_unreachable_database_is_shown_with_the_time_it_was_first_missed() -> None:
    """With the database unreachable, a part answers 503 within the read bound, saying since
    when the database has not answered, and the packing page still answers."""
    async with console_on(DEAD_DATABASE_URL) as console:
        started = time.monotonic()
        status, _, body = await get(console, "/part")
        took_s = time.monotonic() - started
        packing = await get(console, "/part/packing")
    assert status == 503
    assert "The database does not answer" in body and "since" in body
    assert took_s < ConsoleSettings().read_timeout_s + 1.0
    assert packing[0] == 200


async def test_a_database_that_never_answers_is_bounded_by_the_read_timeout() -> None:
    """A database that accepts connections and never answers holds a part no longer than the
    read bound: it answers 503."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"postgresql://postgres@127.0.0.1:{silent.getsockname()[1]}/stockade"
        settings = ConsoleSettings(read_timeout_s=1.0)
        async with console_on(url, settings=settings) as console:
            started = time.monotonic()
            status, _, body = await get(console, "/part/workers")
            took_s = time.monotonic() - started
    assert status == 503 and "did not answer within 1 s" in body
    assert took_s >= 1.0  # the bound named is the one set (the default is 2 s); it ended the wait


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    folder = tmp_path / "certs"
    init_cluster(folder)
    return folder


async def test_over_https_a_part_needs_a_valid_login_token(database_url: str, certs: Path) -> None:
    """Over HTTPS a part answers 401 (saying to run stockade console) without a token or with a
    tampered one, and 200 with a viewer's token."""
    await seed_cluster(database_url)
    token = make_token(TlsFiles.in_dir(certs, "viewer"), now_unix_s=time.time(), lifetime_s=600)
    head, claims, signature = token.split(".")
    tampered = f"{head}.{claims}.{signature[:-4]}AAAA"
    async with console_on(database_url, tls=TlsFiles.in_dir(certs, "cp-1")) as console:
        assert console.url.startswith("https://")
        none = await get(console, "/part")
        bad = await get(console, "/part", {"Authorization": f"Bearer {tampered}"})
        good = await get(console, "/part", {"Authorization": f"Bearer {token}"})
        shell = await get(console, "/jobs/1")
    assert none[0] == 401 and "stockade console" in none[2]
    assert "no login token" in none[2]
    assert bad[0] == 401 and "signature" in bad[2]
    assert good[0] == 200 and '<dd id="leader">cp-1</dd>' in good[2]
    # The page itself carries no data and needs no token: its script asks for the part.
    assert shell[0] == 200 and "cp-1" in shell[2] and "echo" not in shell[2]
    assert "script-src 'self'" in shell[1]["content-security-policy"]
    # Any port of the consoles' hosts: the page may move to a replica's console its own learns of
    # only after serving it (a console just started knows only itself); a loopback host also as
    # localhost, which the certificates name.
    host = console.url.split("://", 1)[1].rsplit(":", 1)[0]
    connect = f"connect-src 'self' https://{host}:*"
    assert f"{connect};" in shell[1]["content-security-policy"] or (
        f"{connect} https://localhost:*;" in shell[1]["content-security-policy"] and host == "127.0.0.1"
    )


async def test_a_user_and_a_scoped_viewer_see_only_their_accounts_jobs(
    database_url: str, certs: Path
) -> None:
    """alice's token (a user's) and v-alice's (a viewer of alice's account) list alice's job only
    and find bob's job a 404 page; the viewer of every account lists both, with their owners."""
    issue(certs, role="user", id="alice")
    issue(certs, role="viewer", id="v-alice", account="alice")
    alices, bobs = await seed_alice_and_bob(database_url)

    def bearer(id: str) -> dict[str, str]:
        token = make_token(TlsFiles.in_dir(certs, id), now_unix_s=time.time(), lifetime_s=600)
        return {"Authorization": f"Bearer {token}"}

    async with console_on(database_url, tls=TlsFiles.in_dir(certs, "cp-1")) as console:
        seen = {id: await get(console, "/part/jobs", bearer(id)) for id in ("alice", "v-alice", "viewer")}
        bobs_page = {id: await get(console, f"/part/jobs/{bobs}", bearer(id)) for id in ("alice", "v-alice")}
        own_page = await get(console, f"/part/jobs/{alices}", bearer("alice"))
    for id in ("alice", "v-alice"):
        assert seen[id][0] == 200
        assert f'data-id="{alices}"' in seen[id][2] and f'data-id="{bobs}"' not in seen[id][2]
        assert bobs_page[id][0] == 404
    assert f'data-id="{bobs}"' in seen["viewer"][2] and '<td class="owner">bob</td>' in seen["viewer"][2]
    assert own_page[0] == 200 and '<dd id="job-owner">alice</dd>' in own_page[2]


async def test_parts_answer_cross_origin_requests_only_from_the_clusters_consoles(
    database_url: str, certs: Path
) -> None:
    """A preflight or a part from another replica's console origin is allowed (CORS), with the
    Authorization header; one from any other origin is not."""
    await seed_cluster(database_url)
    async with asyncio_bridge():
        db = await PgConnection.connect(database_url)
        try:
            await db.execute(
                "INSERT INTO control_planes (id, address, pid, console_url) "
                "VALUES ('cp-2', '127.0.0.1:3', 2, 'https://127.0.0.1:7302')"
            )
        finally:
            await db.close()
    token = make_token(TlsFiles.in_dir(certs, "operator"), now_unix_s=time.time(), lifetime_s=600)
    async with console_on(database_url, tls=TlsFiles.in_dir(certs, "cp-1")) as console:
        # The sampler reads the consoles' list at start; wait for it to have run.
        assert console.app is not None
        for _ in range(600):
            if any(cp_id == "cp-2" for cp_id, _ in console.app.consoles):
                break
            await trio.sleep(0.05)
        preflight = await get(
            console,
            "/part/jobs",
            {"Origin": "https://127.0.0.1:7302", "Access-Control-Request-Headers": "authorization"},
            method="OPTIONS",
        )
        allowed = await get(
            console, "/part", {"Origin": "https://127.0.0.1:7302", "Authorization": f"Bearer {token}"}
        )
        foreign = await get(
            console, "/part", {"Origin": "https://evil.example", "Authorization": f"Bearer {token}"}
        )
    assert preflight[0] == 204
    assert preflight[1]["access-control-allow-origin"] == "https://127.0.0.1:7302"
    assert "Authorization" in preflight[1]["access-control-allow-headers"]
    assert allowed[1]["access-control-allow-origin"] == "https://127.0.0.1:7302"
    listed = json.loads(allowed[1]["x-stockade-consoles"])
    assert {"id": "cp-2", "url": "https://127.0.0.1:7302"} in listed
    assert "access-control-allow-origin" not in foreign[1]
