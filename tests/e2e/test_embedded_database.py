"""`stockade up` on its own embedded PostgreSQL: the control planes get a URL that names the
password file and holds no password, and `down` stops the server."""

from __future__ import annotations

import asyncio
import stat
import urllib.parse
from pathlib import Path

import asyncpg
import pytest

from ops.cluster import LocalCluster

pytestmark = pytest.mark.e2e


def test_up_uses_the_generated_password_and_down_stops_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no DATABASE_URL, the replicas elect a leader through a passfile URL; down stops the server."""
    monkeypatch.delenv("DATABASE_URL", raising=False)
    cluster = LocalCluster(tmp_path / "stockade")
    try:
        ready = cluster.up(control_planes=1, workers=1)
        assert ready.status.leader == "cp-1"
        config = ready.config
        assert config.embedded_pg_port is not None
        password_file = cluster.state.pg_dir / "pgpass"
        assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
        password = password_file.read_text().strip().rpartition(":")[2]
        assert password not in config.database_url
        assert password not in cluster.state.config_path.read_text()
        parts = urllib.parse.urlsplit(config.database_url)
        assert dict(urllib.parse.parse_qsl(parts.query)) == {"passfile": str(password_file.absolute())}

        async def try_without_the_password() -> None:
            await asyncpg.connect(parts._replace(query="").geturl(), timeout=10)

        with pytest.raises(asyncpg.InvalidPasswordError):
            asyncio.run(try_without_the_password())
    finally:
        report = cluster.down()
    assert report.database_stopped
