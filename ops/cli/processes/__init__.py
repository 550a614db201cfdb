"""Process commands, run in the foreground until SIGTERM or Ctrl-C: ``cp`` (one control-plane
replica, :mod:`.control_plane`), ``agent`` and ``fleet`` (one worker, many workers in one
process: :mod:`.agents`) and ``database`` (the embedded PostgreSQL server: what a database
container runs, :mod:`.database`). This module holds the options they share and the check of
a process's certificate files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ops.cli.common import errors, fail
from ops.config import default_state_dir

CERTS_DIR = typer.Option(
    "--certs-dir",
    show_default=False,
    help="Folder with the cluster CA's ca.crt and this process's <id>.crt and <id>.key "
    "(stockade certs issue). [default: the state folder's certs/]",
)
INSECURE = typer.Option(
    "--insecure",
    help="Serve and call without TLS or identity checks, for development only (anyone who "
    "reaches the port may call it).",
)
NICE = typer.Option(
    help="CPU priority (nice, -20..19) this process asks for at start, so other work on the "
    "machine cannot starve its heartbeats; without CAP_SYS_NICE it keeps its own and says so."
)
METRICS_PORT = typer.Option(help="Serve Prometheus metrics on the --host address at PORT/metrics (0: off).")
JSON_LOGS = typer.Option(help="Log JSON lines instead of console lines.")

CertsDirOption = Annotated[Path | None, CERTS_DIR]
InsecureOption = Annotated[bool, INSECURE]
NiceOption = Annotated[int, NICE]
MetricsPortOption = Annotated[int, METRICS_PORT]
JsonLogsOption = Annotated[bool, JSON_LOGS]


def cert_folder(certs_dir: Path | None, insecure: bool) -> Path | None:
    """The certificate folder a process uses; None with --insecure."""
    return None if insecure else (certs_dir or default_state_dir() / "certs").absolute()


def check_tls_files(folder: Path | None, role: str, ids: list[str], what: str) -> None:
    """Warn about --insecure (``folder`` None), or check ``folder``'s files for every id in
    ``ids``: present, the key private, and the certificate issued to ``role`` with that id; so
    a wrong one stops the start before anything runs.

    Raises:
        typer.Exit: a file is missing, its key is readable by others, or the certificate names
            someone else (one line, exit 1).
    """
    from ops.certs import NotAStockadeCertificate, describe
    from ops.cli.common import warn_insecure
    from runtime.tls import TlsFiles

    if folder is None:
        warn_insecure(what)
        return
    with errors():
        for id in ids:
            files = TlsFiles.in_dir(folder, id)
            files.check()
            try:
                holder = describe(files.cert_path).identity
            except NotAStockadeCertificate as exc:
                fail(f"{files.cert_path}: {exc}")
            if holder is None or (holder.role, holder.id) != (role, id):
                named = f"{holder.role} {holder.id}" if holder else "no Stockade identity"
                fail(
                    f"{files.cert_path} is the certificate of {named}, not of {role} {id}: a "
                    f"certificate is bound to one id (issue one with `stockade certs issue --role "
                    f"{role} --id {id}`)"
                )
