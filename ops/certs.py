"""The cluster's certificate authority and the certificates it issues for mutual TLS
(:mod:`runtime.tls`), over one folder (:class:`CertDir`). Roles, files and modes:
docs/security.md, "Certificates"; identity and curve: docs/design.md, "Certificates: identity,
files and curve".
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ops.paths import PathBelow
from runtime.errors import InvalidArgument, StockadeError
from runtime.identifiers import check_id, is_host_name
from runtime.tls import (
    ACCOUNT_SEGMENT,
    TRUST_DOMAIN,
    URI_PREFIX,
    Identity,
    check_key_private,
    fleet_identity,
)

SERVER_ROLES = ("control-plane", "worker", "database")
"""Roles whose certificates name hosts and serve TLS (they also call others as clients).
``database`` is the embedded PostgreSQL's (:class:`ops.launcher.pg.PgTls`)."""
CLIENT_ROLES = ("operator", "viewer", "user")
"""Roles of CLI clients: client auth only. A user's id is its account's name; a viewer may be
scoped to one account (docs/accounts.md)."""
ACCOUNT_ROLES = ("viewer",)
"""The roles a certificate may scope to one account (``--account``)."""
ROLES = (*SERVER_ROLES, *CLIENT_ROLES)

DEFAULT_HOSTS = ("localhost", "127.0.0.1")
"""What every server certificate names besides the hosts it is given."""

INIT_IDENTITIES: tuple[tuple[str, str], ...] = (
    *(("control-plane", f"cp-{n}") for n in range(1, 4)),
    *(("worker", f"w-{n}") for n in range(1, 6)),
    ("operator", "operator"),
    ("viewer", "viewer"),
    ("database", "database"),
)
"""What :func:`init_cluster` issues besides the CA: the local cluster's replicas and workers
(``stockade up`` names them so) and one client of each kind."""

CLOCK_SKEW = datetime.timedelta(minutes=5)
"""Certificates are valid from this long before they are made, for peers whose clocks lag."""

KEY_MODE = 0o600
CERT_MODE = 0o644
DIR_MODE = 0o700


class CertificateExists(StockadeError):
    """A file that would be written already exists; nothing was written (remove it first to
    replace it)."""


class CertificateAuthorityMissing(StockadeError):
    """The folder has no CA to sign with; run ``stockade certs init`` first."""


class NotAStockadeCertificate(StockadeError):
    """The file or certificate is not PEM, or carries no Stockade identity URI."""


@attrs.frozen(kw_only=True)
class CertSettings:
    """How long what :func:`init_cluster` and :func:`issue` make stays valid."""

    ca_valid_days: int = attrs.field(default=3650, validator=attrs.validators.gt(0))
    """Validity of the cluster CA, in days (ten years: replacing it means re-issuing all)."""
    cert_valid_days: int = attrs.field(default=365, validator=attrs.validators.gt(0))
    """Validity of an issued certificate, in days."""


@attrs.frozen(kw_only=True)
class IssuedCert:
    """A certificate and key written by :func:`issue` (or the CA by :func:`init_cluster`)."""

    identity: Identity | None
    """Whom it names; None for the CA."""
    cert_path: Path
    key_path: Path
    not_valid_after: datetime.datetime
    """End of validity, UTC."""


@attrs.frozen(kw_only=True)
class CertInfo:
    """What :func:`describe` reads from a certificate."""

    subject: str
    """RFC 4514 form, e.g. ``CN=w-7,OU=worker,O=stockade``."""
    issuer: str
    identity: Identity | None
    """None when it carries no Stockade identity (the CA, a foreign certificate)."""
    is_ca: bool
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    uris: tuple[str, ...]
    not_valid_before: datetime.datetime
    not_valid_after: datetime.datetime
    """Validity bounds, UTC."""
    sha256_fingerprint: str
    """Hex, colon-separated."""


@attrs.frozen
class CertDir:
    """Where a cluster's certificates live; only computes paths."""

    path: Path

    ca_cert = PathBelow("path", "ca.crt")
    ca_key = PathBelow("path", "ca.key")

    def cert(self, id: str) -> Path:
        """``<dir>/<id>.crt``."""
        return self.path / f"{id}.crt"

    def key(self, id: str) -> Path:
        """``<dir>/<id>.key``."""
        return self.path / f"{id}.key"


# ---------------------------------------------------------------------------- input checks


def check_role(role: str) -> str:
    """``role`` if it is one of :data:`ROLES`.

    Raises:
        InvalidArgument: it is not.
    """
    if role not in ROLES:
        raise InvalidArgument("role", role, f"must be one of {', '.join(ROLES)}")
    return role


def check_account(role: str, account: str) -> str:
    """``account`` if a certificate of ``role`` may be scoped to it.

    Raises:
        InvalidArgument: ``role`` is not one of :data:`ACCOUNT_ROLES` (a user's account is its
            id; an operator acts on every account), or ``account`` breaks the id rules.
    """
    if role not in ACCOUNT_ROLES:
        raise InvalidArgument(
            "account",
            account,
            f"is only for {' and '.join(ACCOUNT_ROLES)} certificates, not {role} "
            "(a user's account is its --id; an operator acts on every account)",
        )
    return check_id(account, field="account")


def parse_host(host: str) -> x509.GeneralName:
    """A host as a SAN entry: an IP address (v4 or v6) or an RFC 1123 host name.

    Raises:
        InvalidArgument: ``host`` is neither.
    """
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not is_host_name(host):
        raise InvalidArgument("host", host, "must be an IP address or an RFC 1123 host name")
    return x509.DNSName(host)


# ---------------------------------------------------------------------------- making


def init_cluster(cert_dir: Path, settings: CertSettings | None = None) -> list[IssuedCert]:
    """Create the cluster CA in ``cert_dir`` and issue :data:`INIT_IDENTITIES` with it.

    Args:
        cert_dir: the folder (created with mode 0700 if missing).
        settings: validity periods (defaults: :class:`CertSettings`).

    Returns:
        The CA first, then each issued certificate in :data:`INIT_IDENTITIES` order.

    Raises:
        CertificateExists: the CA or any file to be written already exists; nothing written.
    """
    settings = settings or CertSettings()
    where = CertDir(cert_dir)
    targets = [where.ca_cert, where.ca_key]
    for _, id in INIT_IDENTITIES:
        targets += [where.cert(id), where.key(id)]
    _refuse_existing(targets, "refusing to overwrite; remove the folder's files to start again")
    done = [_create_ca(cert_dir, settings)]
    for role, id in INIT_IDENTITIES:
        done.append(issue(cert_dir, role=role, id=id, settings=settings))
    return done


def ensure_issued(
    cert_dir: Path,
    identities: Sequence[tuple[str, str]],
    settings: CertSettings | None = None,
    *,
    fleets: Mapping[str, Sequence[str]] | None = None,
) -> list[IssuedCert]:
    """Make sure ``cert_dir`` has a CA, a certificate and key for each ``(role, id)`` of
    ``identities``, and a fleet certificate for each fleet id of ``fleets`` naming its worker ids
    (a fleet of one worker gets none: its worker's own serves); issue what is missing, keep what
    is there (``stockade up`` calls this on every start).

    Returns:
        What was created now (the CA first, if it was), in ``identities`` order.

    Raises:
        InvalidArgument: a role or id breaks the rules.
        CertificateExists: only one of an identity's ``.crt`` and ``.key`` exists (remove it
            to re-issue both); nothing more was written.
        KeyFileExposed: the CA key is readable by others.
    """
    settings = settings or CertSettings()
    where = CertDir(cert_dir)
    done = []
    if not (where.ca_cert.exists() or where.ca_key.exists()):
        done.append(_create_ca(cert_dir, settings))
    wanted: list[tuple[str, str, Sequence[str]]] = [(role, id, ()) for role, id in identities]
    wanted += [("worker", id, workers) for id, workers in (fleets or {}).items() if len(workers) > 1]
    for role, id, workers in wanted:
        if where.cert(id).exists() and where.key(id).exists():
            continue
        done.append(issue(cert_dir, role=role, id=id, workers=workers, settings=settings))
    return done


def _create_ca(cert_dir: Path, settings: CertSettings) -> IssuedCert:
    """Write a new CA's ``ca.crt`` and ``ca.key`` (the folder made with mode 0700)."""
    where = CertDir(cert_dir)
    _refuse_existing([where.ca_cert, where.ca_key], "refusing to overwrite the cluster CA")
    cert_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    name = _name(COMMON_NAME="stockade cluster CA")
    ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    builder = _builder(name, name, ca_key, now + datetime.timedelta(days=settings.ca_valid_days), ca=True)
    ca_cert = (
        builder.add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return _write(None, where.ca_cert, ca_cert, where.ca_key, ca_key)


def issue(
    cert_dir: Path,
    *,
    role: str,
    id: str,
    hosts: Sequence[str] = (),
    workers: Sequence[str] = (),
    account: str | None = None,
    settings: CertSettings | None = None,
) -> IssuedCert:
    """Issue a certificate and a new key for ``role``/``id``, signed by the folder's CA.

    Args:
        cert_dir: the folder holding ``ca.crt`` and ``ca.key``; ``<id>.crt`` and ``<id>.key``
            are written there.
        role: one of :data:`ROLES`.
        id: the holder's id (:func:`runtime.identifiers.check_id`).
        hosts: IP addresses or host names the holder serves on, besides :data:`DEFAULT_HOSTS`;
            server roles only.
        workers: the worker ids a fleet certificate may speak for (role ``worker`` only, at
            least two, no repeats): a client certificate with one worker URI SAN per id.
        account: the one account a viewer may read (its URI ends ``/account/<account>``);
            None: every account. Only for :data:`ACCOUNT_ROLES`; a user's account is its id.
        settings: validity periods (defaults: :class:`CertSettings`).

    Raises:
        InvalidArgument: unknown role, bad id, bad host, hosts given to a client role,
            ``workers`` given to another role than ``worker``, with hosts, fewer than two,
            repeated or malformed, or ``account`` given to another role than a viewer or
            breaking the id rules.
        CertificateAuthorityMissing: no CA in ``cert_dir``.
        KeyFileExposed: the CA key is readable by group or others.
        CertificateExists: ``<id>.crt`` or ``<id>.key`` exists. Nothing is written on any error.
    """
    settings = settings or CertSettings()
    check_role(role)
    check_id(id, field="id")
    if account is not None:
        check_account(role, account)
    if hosts and role in CLIENT_ROLES:
        raise InvalidArgument("host", list(hosts), f"is only for {' and '.join(SERVER_ROLES)} certificates")
    fleet = bool(workers)
    if fleet:
        _check_fleet_workers(role, workers, hosts)
    wanted = [*DEFAULT_HOSTS, *hosts] if role in SERVER_ROLES and not fleet else []
    names: list[x509.GeneralName] = []
    for host in wanted:
        entry = parse_host(host)
        if entry not in names:
            names.append(entry)
    where = CertDir(cert_dir)
    if not (where.ca_cert.exists() and where.ca_key.exists()):
        raise CertificateAuthorityMissing(
            f"no cluster CA in {cert_dir} (ca.crt and ca.key); create one with `stockade certs init`"
        )
    _refuse_existing([where.cert(id), where.key(id)], "refusing to overwrite; remove both to re-issue")
    check_key_private(where.ca_key)
    ca_cert = x509.load_pem_x509_certificate(where.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(where.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise NotAStockadeCertificate(f"{where.ca_key} is not an EC private key")
    identity = Identity(role=role, id=id, workers=frozenset(workers), account=account)
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role in SERVER_ROLES and not fleet:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    not_after = min(_now() + datetime.timedelta(days=settings.cert_valid_days), ca_cert.not_valid_after_utc)
    sans = [*map(x509.UniformResourceIdentifier, identity.uris), *names]
    cert = (
        _builder(
            _name(ORGANIZATIONAL_UNIT_NAME=role, COMMON_NAME=id), ca_cert.subject, key, not_after, ca=False
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return _write(identity, where.cert(id), cert, where.key(id), key)


def _check_fleet_workers(role: str, workers: Sequence[str], hosts: Sequence[str]) -> None:
    """Refuse ``workers`` that cannot make a fleet certificate (see :func:`issue`).

    Raises:
        InvalidArgument: naming the field, the value and the rule.
    """
    if role != "worker":
        raise InvalidArgument("workers", list(workers), f"is only for worker certificates, not {role}")
    if hosts:
        raise InvalidArgument("host", list(hosts), "is not for a fleet certificate (a client one)")
    if len(workers) < 2:
        raise InvalidArgument(
            "workers", list(workers), "must name at least two workers (one: issue that worker's own)"
        )
    for worker_id in workers:
        check_id(worker_id, field="workers")
    repeated = sorted({w for w in workers if list(workers).count(w) > 1})
    if repeated:
        raise InvalidArgument("workers", repeated[0], "is named twice")


# ---------------------------------------------------------------------------- reading


def identity_of(cert: x509.Certificate) -> Identity:
    """The role and id a certificate names in its ``spiffe://stockade/<role>/<id>`` URI SAN (the
    rule of :func:`runtime.tls.identity_of_peercert`); a fleet certificate (one
    ``spiffe://stockade/worker/<id>`` per worker) names a fleet identity
    (:func:`runtime.tls.fleet_identity`: the workers, its common name as id).

    Raises:
        NotAStockadeCertificate: not exactly one URI (another trust domain's counts: a server
            would name no identity either) nor a fleet certificate's, or one that is not
            ``spiffe://stockade/...``, or whose role or id breaks the rules.
    """
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = list(san.get_values_for_type(x509.UniformResourceIdentifier))
    except x509.ExtensionNotFound:
        uris = []
    common_names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    fleet = fleet_identity(uris, str(common_names[0].value) if common_names else "")
    if fleet is not None:
        try:
            for worker_id in fleet.workers:
                check_id(worker_id, field="id")
        except InvalidArgument as exc:
            raise NotAStockadeCertificate(f"fleet certificate: {exc}") from exc
        return fleet
    if len(uris) != 1 or not uris[0].startswith(URI_PREFIX):
        raise NotAStockadeCertificate(
            f"a Stockade certificate names exactly one URI, {URI_PREFIX}<role>/<id>; this one has "
            f"{len(uris)}: {', '.join(uris) or 'none'}"
        )
    role, _, rest = uris[0].removeprefix(URI_PREFIX).partition("/")
    id, _, scope = rest.partition("/")
    segment, _, account = scope.partition("/")
    try:
        check_role(role)
        check_id(id, field="id")
        if scope and (segment != ACCOUNT_SEGMENT or "/" in account):
            raise InvalidArgument(
                "uri",
                uris[0],
                f"must be {URI_PREFIX}<role>/<id>, or a viewer's .../{ACCOUNT_SEGMENT}/<account>",
            )
        if scope:
            check_account(role, account)
    except InvalidArgument as exc:
        raise NotAStockadeCertificate(f"{uris[0]}: {exc}") from exc
    return Identity(role=role, id=id, account=account if scope else None)


_SHOWN_TIME = "%Y-%m-%d %H:%M"


def diagnose_client_cert(ca_path: Path, cert_path: Path) -> str | None:
    """Why a server would refuse the client certificate at ``cert_path``, as far as the client
    can tell: it has expired or is not valid yet, or the CA at ``ca_path`` did not sign it.
    None when it looks valid (or cannot be read: the TLS layer reports that itself). A TLS 1.3
    server checks a client's certificate after the client considers the handshake done (RFC 8446
    section 4.4.2.4), so the client sees only a lost connection; this names the likely reason.
    """
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
    except (OSError, ValueError):
        return None
    now = _now()
    starts, ends = cert.not_valid_before_utc, cert.not_valid_after_utc
    if ends < now:
        return f"the client certificate {cert_path} expired on {ends:{_SHOWN_TIME}} UTC"
    if starts > now:
        return f"the client certificate {cert_path} is valid only from {starts:{_SHOWN_TIME}} UTC"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return f"the client certificate {cert_path} was not issued by the CA in {ca_path}"
    return None


def describe(path: Path) -> CertInfo:
    """What the PEM certificate at ``path`` says.

    Raises:
        NotAStockadeCertificate: the file is not a PEM certificate.
        OSError: it cannot be read.
    """
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except ValueError as exc:
        raise NotAStockadeCertificate(f"{path} is not a PEM certificate") from exc
    try:
        identity: Identity | None = identity_of(cert)
    except NotAStockadeCertificate:
        identity = None
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = tuple(san.get_values_for_type(x509.DNSName))
        ips = tuple(str(ip) for ip in san.get_values_for_type(x509.IPAddress))
        uris = tuple(san.get_values_for_type(x509.UniformResourceIdentifier))
    except x509.ExtensionNotFound:
        dns, ips, uris = (), (), ()
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    digest = cert.fingerprint(hashes.SHA256()).hex(":").upper()
    return CertInfo(
        subject=cert.subject.rfc4514_string(),
        issuer=cert.issuer.rfc4514_string(),
        identity=identity,
        is_ca=is_ca,
        dns_names=dns,
        ip_addresses=ips,
        uris=uris,
        not_valid_before=cert.not_valid_before_utc,
        not_valid_after=cert.not_valid_after_utc,
        sha256_fingerprint=digest,
    )


# ---------------------------------------------------------------------------- helpers


def _now() -> datetime.datetime:
    # Wall-clock time is right here: certificates are judged by the peers' wall clocks.
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _refuse_existing(paths: Sequence[Path], what_to_do: str) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        raise CertificateExists(
            f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; {what_to_do}"
        )


def _name(**attributes: str) -> x509.Name:
    """A name in the trust domain's organization, with the ``NameOID`` attributes given."""
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, TRUST_DOMAIN),
            *(x509.NameAttribute(getattr(NameOID, oid), value) for oid, value in attributes.items()),
        ]
    )


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    not_after: datetime.datetime,
    *,
    ca: bool,
) -> x509.CertificateBuilder:
    """A certificate for ``key``, valid from :data:`CLOCK_SKEW` ago, with the extensions all share."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        .add_extension(_key_usage(ca=ca), critical=True)
    )


def _write(
    identity: Identity | None,
    cert_path: Path,
    cert: x509.Certificate,
    key_path: Path,
    key: ec.EllipticCurvePrivateKey,
) -> IssuedCert:
    """Write the key (mode 0600), then the certificate, each to a new file (``O_EXCL``)."""
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write_new(key_path, pem, KEY_MODE)
    _write_new(cert_path, cert.public_bytes(serialization.Encoding.PEM), CERT_MODE)
    return IssuedCert(
        identity=identity, cert_path=cert_path, key_path=key_path, not_valid_after=cert.not_valid_after_utc
    )


def _write_new(path: Path, data: bytes, mode: int) -> None:
    # Exactly ``mode`` whatever the umask: a umask such as 077 would leave a (public) certificate
    # unreadable to the services that need it.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as file:
        os.fchmod(file.fileno(), mode)
        file.write(data)
