"""``stockade certs``: the cluster CA and its certificates (``init``, ``issue``, ``show``), made by
:mod:`ops.certs`. A refusal is one line and exit 2 with nothing written; a CA key that others can
read, exit 1.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ops.cli.base import command_group
from ops.cli.common import EXIT_INVALID, EXIT_UNAVAILABLE, fail, recorded_local_state, shown_path
from ops.config import cluster_json_cert_dir, default_state_dir
from runtime.errors import InvalidArgument

if TYPE_CHECKING:
    from ops.certs import IssuedCert

certs_app = command_group(
    "certs",
    "The cluster CA and the certificates it issues (mutual TLS between every process).",
)

DirOption = Annotated[
    Path | None,
    typer.Option(
        "--dir",
        help=(
            "Folder of the CA and certificates (default: the state folder's certs/; issue: the "
            "local cluster's, found as client commands find it)."
        ),
    ),
]


def _cert_dir(option: Path | None) -> Path:
    return option if option is not None else default_state_dir() / "certs"


def _issuing_dir(option: Path | None) -> Path:
    """Where ``issue`` finds the CA: ``--dir``, else the certificates of the local cluster
    client commands call (``./.stockade``'s, else the one the user config records, so that
    it works from any folder, as they do), else the state folder's ``certs/``."""
    if option is not None:
        return option
    state = recorded_local_state()
    found, recorded = cluster_json_cert_dir(state.root)
    return recorded if found and recorded is not None else state.root / "certs"


def _issued_line(done: IssuedCert) -> str:
    who = "cluster CA" if done.identity is None else f"{done.identity.role} {done.identity.id}"
    if done.identity is not None and done.identity.account is not None:
        who += f" (account {done.identity.account})"
    if done.identity is not None and done.identity.workers:
        who += f" (fleet certificate for {len(done.identity.workers)} workers)"
    return (
        f"{who}: {shown_path(done.cert_path)}, key {shown_path(done.key_path)} "
        f"(valid until {done.not_valid_after:%Y-%m-%d %H:%M} UTC)"
    )


@certs_app.command("init")
def certs_init(directory: DirOption = None) -> None:
    """Create the cluster CA and certificates for cp-1..cp-3, w-1..w-5, an operator and a
    viewer client, and the embedded database. Refuses when the folder already has a CA."""
    from ops.certs import CertificateExists, init_cluster

    cert_dir = _cert_dir(directory)
    try:
        issued = init_cluster(cert_dir)
    except CertificateExists as exc:
        fail(str(exc), EXIT_INVALID)
    for done in issued:
        sys.stdout.write(_issued_line(done) + "\n")


@certs_app.command("issue")
def certs_issue(
    role: Annotated[str, typer.Option(help="control-plane, worker, database, operator, viewer or user.")],
    id: Annotated[str, typer.Option("--id", help="The holder's id, e.g. w-7; a user's is its account.")],
    host: Annotated[
        list[str] | None,
        typer.Option("--host", help="An IP address or host name it serves on (repeatable; servers only)."),
    ] = None,
    workers: Annotated[
        str,
        typer.Option(
            help="A fleet certificate: the worker ids, w-1,w-2,..., that the fleet process --id "
            "may speak for to the control planes (role worker; a client certificate only)."
        ),
    ] = "",
    account: Annotated[
        str | None,
        typer.Option(help="A viewer that reads only this account's jobs and audit rows (role viewer only)."),
    ] = None,
    directory: DirOption = None,
) -> None:
    """Issue a certificate and key for one control plane, worker or client, signed by the CA.

    With --workers, a fleet's client certificate naming every worker it hosts; --role user
    --id alice, the account alice's; --role viewer --account alice, a viewer of alice's jobs."""
    from ops.certs import CertificateAuthorityMissing, CertificateExists, NotAStockadeCertificate, issue
    from runtime.tls import KeyFileExposed

    try:
        worker_ids = [w.strip() for w in workers.split(",") if w.strip()]
        done = issue(
            _issuing_dir(directory), role=role, id=id, hosts=host or (), workers=worker_ids, account=account
        )
    except (InvalidArgument, CertificateAuthorityMissing, CertificateExists) as exc:
        fail(str(exc), EXIT_INVALID)
    except (KeyFileExposed, NotAStockadeCertificate) as exc:
        fail(str(exc), EXIT_UNAVAILABLE)
    sys.stdout.write(_issued_line(done) + "\n")


@certs_app.command("show")
def certs_show(file: Annotated[Path, typer.Argument(help="A PEM certificate.", show_default=False)]) -> None:
    """Print a certificate's subject, role, id, SANs and validity."""
    from ops.certs import NotAStockadeCertificate, describe

    try:
        info = describe(file)
    except NotAStockadeCertificate as exc:
        fail(str(exc), EXIT_INVALID)
    except OSError as exc:
        fail(f"cannot read {file}: {exc.strerror or exc}", EXIT_INVALID)
    role = info.identity.role if info.identity else ("- (a CA)" if info.is_ca else "- (none)")
    rows = [
        ("subject", info.subject),
        ("issuer", info.issuer),
        ("role", role),
        ("id", info.identity.id if info.identity else "-"),
        ("account", (info.identity.scope if info.identity else None) or "-"),
        ("uris", ", ".join(info.uris) or "-"),
        ("dns names", ", ".join(info.dns_names) or "-"),
        ("ip addresses", ", ".join(info.ip_addresses) or "-"),
        ("valid from", f"{info.not_valid_before:%Y-%m-%d %H:%M:%S} UTC"),
        ("valid until", f"{info.not_valid_after:%Y-%m-%d %H:%M:%S} UTC"),
        ("sha256", info.sha256_fingerprint),
    ]
    for name, value in rows:
        sys.stdout.write(f"{name + ':':<14}{value}\n")
