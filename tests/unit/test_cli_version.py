"""`stockade --version` prints the installed version and runs no command."""

from __future__ import annotations

import importlib.metadata

from typer.testing import CliRunner

from ops.cli import app


def test_version_prints_the_installed_version_and_exits_0() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"stockade {importlib.metadata.version('stockade')}\n"
