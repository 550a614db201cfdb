"""A control-plane process whose database cannot be reached: it waits, says so once (not once
per attempt), and stops on SIGTERM cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ops.launcher.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def run_until_warned(url: str, cp_id: str, log_path: Path, *, quiet_s: float = 3.0) -> str:
    """Run ``stockade cp`` against ``url`` until its stderr says ``database unreachable`` (at
    most 60 s: a loaded machine starts it slowly), ``quiet_s`` more, then SIGTERM it; return its
    stderr. It must still run when signalled and exit 0."""
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "cp", "--id", cp_id, "--database-url", url, "--insecure"],
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            deadline = time.monotonic() + 60.0
            while "database unreachable" not in log_path.read_text() and time.monotonic() < deadline:
                assert process.poll() is None, log_path.read_text()
                time.sleep(0.1)
            time.sleep(quiet_s)
            assert process.poll() is None, "the control plane exited instead of waiting for its database"
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    stderr = log_path.read_text()
    assert process.returncode == 0, stderr
    return stderr


def test_an_unreachable_database_at_start_is_waited_for_with_one_warning(tmp_path: Path) -> None:
    """Against a closed port, ``stockade cp`` retries with backoff, prints ``database
    unreachable`` once in 3 s (no traceback, no line per attempt), and exits 0 on SIGTERM."""
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"  # nothing listens there
    stderr = run_until_warned(url, "cp-x", tmp_path / "cp.stderr")
    lines = stderr.splitlines()
    unreachable = [line for line in lines if "database unreachable" in line]
    assert len(unreachable) == 1, stderr
    assert f"127.0.0.1:{url.split(':')[2].split('/')[0]}" in unreachable[0]
    assert not [line for line in lines if "still unreachable" in line or "database not reachable" in line]
    assert "Traceback" not in stderr
    assert any("stopping" in line and "SIGTERM" in line for line in lines), stderr


def test_a_read_only_database_at_start_is_named_in_the_warning(database_url: str, tmp_path: Path) -> None:
    """Against a server that refuses writes (as a standby does), ``stockade cp`` waits, and its
    one warning says the database is read-only (not a closed connection); SIGTERM stops it."""
    separator = "&" if "?" in database_url else "?"
    url = f"{database_url}{separator}default_transaction_read_only=on"
    stderr = run_until_warned(url, "cp-r", tmp_path / "cp.stderr")
    unreachable = [line for line in stderr.splitlines() if "database unreachable" in line]
    assert len(unreachable) == 1, stderr
    assert "read-only" in unreachable[0], unreachable[0]
    assert "Traceback" not in stderr
