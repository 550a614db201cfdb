"""The CLI under overload: a busy cluster gets a clear message, and ``stockade cp`` refuses an
ingest reserve that leaves other work no connection."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ops.cli import EXIT_INVALID, EXIT_UNAVAILABLE, app
from ops.cli import jobs as cli_jobs
from runtime.errors import ClusterBusy


def test_a_busy_cluster_is_reported_as_busy_not_as_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """When every replica stayed busy, the command says so, says nothing was stored, and exits 1."""

    def busy(addresses: list[str], specs: object, **_: object) -> list[int]:
        raise ClusterBusy("every control plane is busy: asked 9 times over 30.0 s (busy_retry_s 30); ...")

    monkeypatch.setattr(cli_jobs, "submit_specs", busy)
    result = CliRunner().invoke(
        app,
        [
            "submit",
            "--cpu-millis",
            "100",
            "--memory-mb",
            "10",
            "--sleep-s",
            "1",
            "--control-planes",
            "127.0.0.1:1",
        ],
    )
    assert result.exit_code == EXIT_UNAVAILABLE
    assert "error: the cluster is too busy to take this now" in result.output
    assert "(what they refused was not stored); try again later" in result.output


def test_cp_refuses_a_reserve_as_large_as_the_pool() -> None:
    """--liveness-reserved-connections must stay below --ingest-pool-size; nothing starts."""
    result = CliRunner().invoke(
        app,
        [
            "cp",
            "--id",
            "cp-1",
            "--database-url",
            "postgresql://nowhere/none",
            "--ingest-pool-size",
            "4",
            "--liveness-reserved-connections",
            "4",
        ],
    )
    assert result.exit_code == EXIT_INVALID
    assert "liveness_reserved_connections must be < pool_size = 4" in result.output
