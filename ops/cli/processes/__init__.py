"""Process commands, run in the foreground until SIGTERM or Ctrl-C: ``cp``, ``agent``, ``fleet``
and ``database``. What they share: options declared once, in tables of
:class:`ops.cli.options.Option` that :func:`ops.cli.options.with_options` gives a command, and
the check of a process's certificate files."""

from __future__ import annotations

from pathlib import Path

import typer

from ops.cli.common import errors, fail
from ops.cli.options import Option, quiet_option
from ops.config import default_state_dir
from runtime.priority import DEFAULT_NICE

PROCESS_OPTIONS = {
    "metrics_port": Option(
        0, help="Serve Prometheus metrics on the --host address at PORT/metrics (0: off)."
    ),
    "json_logs": Option(False, help="Log JSON lines instead of console lines."),
    "nice": Option(
        DEFAULT_NICE,
        help="CPU priority (nice, -20..19) this process asks for at start, so other work on the "
        "machine cannot starve its heartbeats; without CAP_SYS_NICE it keeps its own and says so.",
    ),
    "certs_dir": Option(
        None,
        quiet_option(
            "--certs-dir",
            help="Folder with the cluster CA's ca.crt and this process's <id>.crt and <id>.key "
            "(stockade certs issue). [default: the state folder's certs/]",
        ),
        kind=Path | None,
    ),
    "insecure": Option(
        False,
        typer.Option(
            "--insecure",
            help="Serve and call without TLS or identity checks, for development only (anyone who "
            "reaches the port may call it).",
        ),
    ),
}
"""The options every long-running process (``cp``, ``agent``, ``fleet``) takes, last in its
``--help``: how it serves its metrics, logs, runs and proves who it is."""


def cert_folder(certs_dir: Path | None, insecure: bool) -> Path | None:
    """The certificate folder a process uses; None with --insecure."""
    return None if insecure else (certs_dir or default_state_dir() / "certs").absolute()


def check_tls_files(folder: Path | None, role: str, ids: list[str], what: str) -> None:
    """Warn about --insecure (``folder`` None), or check ``folder``'s files for every id in
    ``ids``: present, the key private, the certificate issued to ``role`` with that id (else
    one line, exit 1, before anything runs)."""
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
