"""A control-plane process stops on SIGTERM even while it cannot reach its database."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from ops.pg import free_port


def test_sigterm_stops_a_replica_still_waiting_for_its_database() -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"  # nothing listens there
    process = subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "cp", "--id", "cp-x", "--database-url", url, "--insecure"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        seen = ""
        assert process.stderr is not None
        while "database not reachable" not in seen and time.monotonic() < deadline:
            seen += process.stderr.readline()
        assert "database not reachable" in seen
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
