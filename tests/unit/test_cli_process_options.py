"""The options ``stockade cp``, ``agent`` and ``fleet`` declare once reach each command whole."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ops.cli import EXIT_INVALID, app


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["fleet", "--spec", "missing.json", "--heartbeat-interval-s", "0.1", "--insecure"], "missing.json"),
        (
            [
                "agent",
                "--id",
                "w-1",
                "--cpu-millis",
                "1000",
                "--memory-mb",
                "512",
                "--control-planes",
                "",
                "--work-dir",
                "w",
                "--job-nice",
                "5",
                "--insecure",
            ],
            "--control-planes",
        ),
        (["cp", "--id", "cp-1", "--lease-ttl-s", "2", "--insecure"], "--database-url"),
    ],
)
def test_a_shared_option_given_reaches_the_command(args: list[str], said: str, tmp_path: Path) -> None:
    """A command given one of its shared options runs and refuses the bad input it was also
    given, in one line, exit 2 (not a failure to pass the shared options on)."""
    result = CliRunner().invoke(app, args, env={"DATABASE_URL": ""})
    assert result.exit_code == EXIT_INVALID, result.output
    assert said in result.stderr
