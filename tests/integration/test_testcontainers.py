"""The suite's PostgreSQL container (:mod:`pgcontainer`): ``stockade database`` in the project's
image, started with testcontainers; skipped, saying why, where no Docker engine answers or the
image cannot be built."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import docker
import pytest
from pgcontainer import OWNER_LABEL, DatabaseContainer

SCHEMA_PATH = Path(__file__).parents[2] / "schema.sql"


@pytest.fixture(scope="module")
def container(stockade_image: str) -> Iterator[tuple[DatabaseContainer, str]]:
    """A database container of its own (not the session's), removed after the module."""
    with tempfile.TemporaryDirectory(prefix="stockade-test-tc-") as folder:
        database = DatabaseContainer(stockade_image, Path(folder))
        try:
            url = database.start()
            yield database, url
        finally:
            database.stop()


def test_container_takes_the_schema_twice(container: tuple[DatabaseContainer, str]) -> None:
    """The container's server accepts schema.sql twice and then serves the lease row (epoch 0)."""
    _database, url = container

    async def check() -> int:
        connection = await asyncpg.connect(url, timeout=30)
        try:
            schema = SCHEMA_PATH.read_text()
            await connection.execute("CREATE DATABASE schema_twice")
        finally:
            await connection.close()
        connection = await asyncpg.connect(url.replace("/postgres?", "/schema_twice?"), timeout=30)
        try:
            await connection.execute(schema)
            await connection.execute(schema)
            epoch: int = await connection.fetchval("SELECT epoch FROM lease WHERE id = 1")
            return epoch
        finally:
            await connection.close()

    assert asyncio.run(check()) == 0


def test_container_runs_without_fsync_and_asks_for_a_password(
    container: tuple[DatabaseContainer, str],
) -> None:
    """The server runs with fsync off (--fast-unsafe) and refuses a connection without the password."""
    _database, url = container

    async def fsync() -> str:
        connection = await asyncpg.connect(url, timeout=30)
        try:
            setting: str = await connection.fetchval("SHOW fsync")
            return setting
        finally:
            await connection.close()

    assert asyncio.run(fsync()) == "off"
    without_password = url.split("?")[0]
    with pytest.raises((asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)):
        asyncio.run(asyncpg.connect(without_password, password="wrong", timeout=30))


def test_container_is_reachable_only_from_this_machine(container: tuple[DatabaseContainer, str]) -> None:
    """The container publishes no port and sits alone on an internal network labelled with its owner."""
    database, _url = container
    client = docker.from_env()
    try:
        inspected = client.containers.get(database.short_id)
        network = client.networks.get(database.network_name)
        assert inspected.attrs["NetworkSettings"]["Ports"] in ({}, None, {"5432/tcp": None})
        assert not inspected.attrs["HostConfig"]["PortBindings"]
        assert network.attrs["Internal"] is True
        assert OWNER_LABEL in inspected.labels
        assert OWNER_LABEL in network.attrs["Labels"]
        network.reload()
        assert list(network.attrs["Containers"]) == [inspected.id]
    finally:
        client.close()
