"""A control-plane process whose database cannot be reached: it waits, says so once (not once
per attempt), and stops on SIGTERM cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ops.pg import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_an_unreachable_database_at_start_is_waited_for_with_one_warning() -> None:
    """Against a closed port, ``stockade cp`` retries with backoff, prints ``database
    unreachable`` once in 3 s (no traceback, no line per attempt), and exits 0 on SIGTERM."""
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"  # nothing listens there
    process = subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "cp", "--id", "cp-x", "--database-url", url, "--insecure"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        time.sleep(3.0)
        assert process.poll() is None, "the control plane exited instead of waiting for its database"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
        assert process.returncode == 0, stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = stderr.splitlines()
    unreachable = [line for line in lines if "database unreachable" in line]
    assert len(unreachable) == 1, stderr
    assert f"127.0.0.1:{url.split(':')[2].split('/')[0]}" in unreachable[0]
    assert not [line for line in lines if "still unreachable" in line or "database not reachable" in line]
    assert "Traceback" not in stderr
    assert any("stopping" in line and "SIGTERM" in line for line in lines), stderr
