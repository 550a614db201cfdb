"""The HA PostgreSQL pair (ops/launcher/hadb.py): Patroni promotes the synchronous standby when the
primary's host dies, the multi-host URL follows it, no acknowledged commit is lost, and the
old primary rejoins as the standby.

Skipped, saying what is missing, where etcd or Patroni is not installed (``.ci/run`` installs
both). One failover takes about 20 s (Patroni's minimum leader-key ttl); the module takes
about a minute.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import psutil
import pytest

from ops.launcher.hadb import HaPostgres
from ops.launcher.hadb_members import INSTALL_HINT, missing_tools

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    bool(missing_tools()), reason=f"needs {', '.join(missing_tools())}: {INSTALL_HINT}"
)

CONNECT_TIMEOUT_S = 10.0
"""Budget of one connection attempt through the multi-host URL."""

WRITE_TIMEOUT_S = 2.0
"""Budget of one insert: a write the dying primary never acknowledges is given up, not retried."""

FAILOVER_TIMEOUT_S = 60.0
"""Patroni's ttl (20 s) plus a loop and a wide margin for a loaded machine."""


@pytest.fixture
def ha_pair(tmp_path: Path) -> Iterator[HaPostgres]:
    """A started pair under ``tmp_path/hadb``, stopped (every process) afterwards."""
    ha = HaPostgres(tmp_path / "hadb")
    try:
        ha.start(timeout_s=120)
        yield ha
    finally:
        ha.stop()


async def _write_until_refused(url: str, *, killed: asyncio.Event, count_before_kill: int) -> list[int]:
    """Insert rows 1, 2, 3... each in its own committed transaction, through ``url``; set
    ``killed``'s waiter going after ``count_before_kill`` rows; stop at the first failure.

    Returns:
        the ids whose COMMIT the server acknowledged.
    """
    acknowledged: list[int] = []
    connection = await asyncpg.connect(url, timeout=CONNECT_TIMEOUT_S)
    try:
        await connection.execute("CREATE TABLE IF NOT EXISTS ha_rows (id bigint PRIMARY KEY)")
        next_id = 1
        while True:
            try:
                await connection.execute(
                    "INSERT INTO ha_rows (id) VALUES ($1)", next_id, timeout=WRITE_TIMEOUT_S
                )
            except (
                OSError,
                asyncpg.PostgresError,
                asyncpg.InterfaceError,
                asyncpg.InternalClientError,
                TimeoutError,
            ):
                return acknowledged
            acknowledged.append(next_id)
            next_id += 1
            if next_id > count_before_kill:
                killed.set()
                await asyncio.sleep(0.01)
    finally:
        connection.terminate()


async def _read(url: str, query: str) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(url, timeout=CONNECT_TIMEOUT_S)
    try:
        return await connection.fetch(query)
    finally:
        await connection.close()


def test_every_acknowledged_commit_survives_the_primary_host_dying(ha_pair: HaPostgres) -> None:
    """Rows are written in committed transactions while the primary's Patroni and PostgreSQL
    are SIGKILLed together; Patroni promotes the sync standby, the same URL reaches it, every
    acknowledged row is there, and the old primary rejoins as the sync standby."""
    url = ha_pair.url()
    old_primary = ha_pair.primary()

    async def scenario() -> tuple[list[int], float]:
        killed = asyncio.Event()
        writer = asyncio.create_task(_write_until_refused(url, killed=killed, count_before_kill=200))
        await killed.wait()
        victim = await asyncio.to_thread(ha_pair.kill_primary)
        acknowledged = await writer
        promoted = await asyncio.to_thread(ha_pair.wait_for_new_primary, victim, timeout_s=FAILOVER_TIMEOUT_S)
        return acknowledged, promoted.after_s

    acknowledged, after_s = asyncio.run(scenario())
    assert len(acknowledged) >= 200

    new_primary = ha_pair.primary()
    assert new_primary.name != old_primary.name
    assert after_s < FAILOVER_TIMEOUT_S
    rows = asyncio.run(_read(url, "SELECT id, inet_server_port() AS port FROM ha_rows"))
    assert {row["port"] for row in rows} == {new_primary.port}
    assert set(acknowledged) <= {row["id"] for row in rows}

    ha_pair.restart_member(old_primary.name, timeout_s=FAILOVER_TIMEOUT_S)
    roles = {m.name: (m.role, m.state) for m in ha_pair.members()}
    assert roles[old_primary.name] == ("sync_standby", "streaming")
    assert roles[new_primary.name] == ("leader", "running")
    asyncio.run(_read(url, "INSERT INTO ha_rows (id) VALUES (-1) RETURNING id"))


def test_another_process_stops_every_process_of_the_pair(ha_pair: HaPostgres) -> None:
    """``HaPostgres.attach(root).stop()`` in another process stops both Patroni members, their
    PostgreSQL servers and the three etcd members."""
    patroni_and_etcd = [
        p for p in psutil.process_iter(["cmdline"]) if str(ha_pair.root) in " ".join(p.info["cmdline"] or [])
    ]
    assert len(patroni_and_etcd) >= 5
    code = f"from ops.launcher.hadb import HaPostgres; print(HaPostgres.attach({str(ha_pair.root)!r}).stop())"
    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert not ha_pair.is_running()
    _, alive = psutil.wait_procs(patroni_and_etcd, timeout=5)
    assert alive == []
