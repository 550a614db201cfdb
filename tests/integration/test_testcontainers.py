"""PostgreSQL in a container via testcontainers, when a Docker engine is reachable."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest

SCHEMA_PATH = Path(__file__).parents[2] / "schema.sql"
POSTGRES_IMAGE = "postgres:18-alpine"


def test_postgres_container_takes_the_schema(docker_unavailable_reason: str | None) -> None:
    """A testcontainers PostgreSQL accepts schema.sql twice and serves the lease row."""
    if docker_unavailable_reason is not None:
        pytest.skip(docker_unavailable_reason)
    from testcontainers.community.postgres import PostgresContainer

    async def check(url: str) -> int:
        connection = await asyncpg.connect(url, timeout=30)
        try:
            schema = SCHEMA_PATH.read_text()
            await connection.execute(schema)
            await connection.execute(schema)
            epoch: int = await connection.fetchval("SELECT epoch FROM lease WHERE id = 1")
            return epoch
        finally:
            await connection.close()

    with PostgresContainer(POSTGRES_IMAGE, driver=None) as container:
        assert asyncio.run(check(container.get_connection_url())) == 0
