"""``stockade database``: the embedded PostgreSQL server in the foreground (what a database
container runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ops.cli.base import app
from ops.cli.common import EXIT_INVALID, fail


@app.command("database")
def database(
    data_dir: Annotated[
        Path, typer.Option(help="Folder of the server's files (PGDATA in data/, its log, pgpass).")
    ],
    port: Annotated[int, typer.Option(help="TCP port, 1..65535.")] = 5432,
    listen_host: Annotated[
        str,
        typer.Option(
            help="Address clients reach the server at besides 127.0.0.1 (a container's on its "
            "private network); password connections from that address's network are accepted."
        ),
    ] = "127.0.0.1",
    fast_unsafe: Annotated[
        bool, typer.Option(help="fsync off: for tests and benchmarks only (a machine crash loses data).")
    ] = False,
) -> None:
    """Run the embedded PostgreSQL server in the foreground until SIGTERM or Ctrl-C (then a
    fast shutdown); exits 1 if the server ends on its own. What a database container runs."""
    import signal
    import time

    from ops.launcher.pg import EmbeddedPostgres, EmbeddedPostgresError

    if not 1 <= port <= 65535:
        fail(f"--port must be in 1..65535, got {port}", EXIT_INVALID)
    server = EmbeddedPostgres(data_dir=data_dir, port=port, listen_host=listen_host, fast_unsafe=fast_unsafe)
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        url = server.start(timeout_s=60.0)
    except EmbeddedPostgresError as exc:
        fail(f"PostgreSQL did not start: {exc}", 1)
    print(f"PostgreSQL serves {url}", flush=True)
    while not stopping:
        if not server.is_running():
            fail(f"PostgreSQL ended on its own; see {server.log_path}", 1)
        time.sleep(0.5)
    try:
        server.stop()
    except EmbeddedPostgresError as exc:
        fail(f"PostgreSQL did not stop: {exc}", 1)
    print("PostgreSQL stopped", flush=True)
