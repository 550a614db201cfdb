"""Mutual TLS between Stockade's processes: SSL contexts built from the cluster CA's files, and
the identities its certificates carry (``spiffe://stockade/<role>/<id>``, read back by
:func:`identity_of_peercert`; a fleet certificate names many workers, :attr:`Identity.workers`).

Servers require a client certificate of the CA; clients check the server's identity
(:class:`Expected`) instead of its host name. TLS 1.3 only; keys must be private
(:func:`check_key_private`); every refused handshake is logged and counted. Why: docs/design.md,
"Mutual TLS: identities instead of host names".
"""

from __future__ import annotations

import ssl
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from runtime.errors import LocalFileError

CONTROL_PLANE = "control-plane"
WORKER = "worker"
OPERATOR = "operator"
VIEWER = "viewer"
USER = "user"
ROLES = (CONTROL_PLANE, WORKER, OPERATOR, VIEWER, USER)

ACCOUNT_SEGMENT = "account"
"""An account-scoped viewer's URI is ``URI_PREFIX + "viewer/<id>/account/<account>"``: the
account is carried in the path, as the role and the id are (docs/accounts.md)."""

TRUST_DOMAIN = "stockade"
URI_PREFIX = f"spiffe://{TRUST_DOMAIN}/"
"""Every issued certificate's identity is ``URI_PREFIX + role + "/" + id``."""

TLS_HANDSHAKE_TIMEOUT_S = 5.0
"""A server drops a connection whose TLS handshake has not finished after this long, seconds
(asyncio's own default is 60 s)."""


class KeyFileExposed(LocalFileError):
    """A private key file is readable by group or others; the message names the file and how
    to fix it."""


class TlsFilesInvalid(LocalFileError):
    """A CA, certificate or key file is missing or unreadable as PEM; the message names it."""


class PeerIdentityMismatch(ssl.SSLCertVerificationError):
    """The peer's certificate is valid but names another role or id than the one expected."""

    def __str__(self) -> str:
        # ssl.SSLError shows an error made with one argument as a tuple, ``('message',)``.
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


@attrs.frozen
class Identity:
    """Who holds a certificate: ``role`` (one of :data:`ROLES`) and ``id`` (``cp-1``, ``w-7``,
    ``operator``, a user's account name); for a fleet certificate also the ``workers`` it names;
    for an account-scoped viewer the ``account`` it may read."""

    role: str
    id: str
    workers: frozenset[str] = frozenset()
    """A fleet certificate's worker ids (one URI SAN each; its ``id`` is then the subject's
    common name, shown in messages only); empty for every other certificate."""
    account: str | None = None
    """A viewer's scope: the one account whose jobs it may read (None: every account; set only
    for role ``viewer``)."""

    @property
    def uri(self) -> str:
        """``spiffe://stockade/<role>/<id>``, with ``/account/<account>`` for a scoped viewer (a
        fleet certificate's are :attr:`uris`)."""
        scope = f"/{ACCOUNT_SEGMENT}/{self.account}" if self.account is not None else ""
        return f"{URI_PREFIX}{self.role}/{self.id}{scope}"

    @property
    def scope(self) -> str | None:
        """The one account whose jobs and audit rows the holder may see: a user's own (its id),
        a scoped viewer's :attr:`account`; None for every other role (all accounts, or none)."""
        return self.id if self.role == USER else self.account

    @property
    def uris(self) -> tuple[str, ...]:
        """Every URI SAN the certificate carries: :attr:`uri`, or one per fleet worker, by id."""
        if not self.workers:
            return (self.uri,)
        return tuple(f"{URI_PREFIX}{WORKER}/{w}" for w in sorted(self.workers))

    @property
    def is_fleet(self) -> bool:
        """Whether this is a fleet certificate's identity (a client only, never a server)."""
        return bool(self.workers)

    def speaks_for(self, worker_id: str) -> bool:
        """Whether the holder may speak as worker ``worker_id``: a worker certificate of that
        id, or a fleet certificate naming it."""
        if self.role != WORKER:
            return False
        return worker_id in self.workers if self.workers else self.id == worker_id

    def __str__(self) -> str:
        if self.workers:
            return f"{self.role}/{self.id} (a fleet certificate for {len(self.workers)} workers)"
        if self.account is not None:
            return f"{self.role}/{self.id} (account {self.account})"
        return f"{self.role}/{self.id}"


def parse_identity_uri(uri: str) -> Identity | None:
    """The identity a ``spiffe://stockade/<role>/<id>`` URI names (a viewer's may end in
    ``/account/<account>``), or None when it names none (another trust domain, an unknown role,
    an empty id or account, or other path segments)."""
    if not uri.startswith(URI_PREFIX):
        return None
    role, _, rest = uri[len(URI_PREFIX) :].partition("/")
    id, _, scope = rest.partition("/")
    if role not in ROLES or not id:
        return None
    if not scope:
        return None if rest.endswith("/") else Identity(role=role, id=id)
    segment, _, account = scope.partition("/")
    if role != VIEWER or segment != ACCOUNT_SEGMENT or not account or "/" in account:
        return None
    return Identity(role=role, id=id, account=account)


def fleet_identity(uris: Sequence[str], common_name: str) -> Identity | None:
    """The fleet identity that ``uris`` (a certificate's URI SANs, at least two) name, or None
    unless each is a distinct ``spiffe://stockade/worker/<id>``. ``common_name`` (the subject's
    CN) becomes its ``id``, shown in messages only."""
    if len(uris) < 2:
        return None
    workers = set()
    for uri in uris:
        named = parse_identity_uri(uri)
        if named is None or named.role != WORKER or named.id in workers:
            return None
        workers.add(named.id)
    return Identity(role=WORKER, id=common_name or "fleet", workers=frozenset(workers))


def identity_of_peercert(peercert: dict[str, Any] | None) -> Identity | None:
    """The identity in a verified peer certificate as :meth:`ssl.SSLObject.getpeercert` gives
    it; None when there is none, or its URIs are neither exactly one Stockade identity nor a
    fleet's worker URIs (:func:`fleet_identity`)."""
    if not peercert:
        return None
    uris = [value for kind, value in peercert.get("subjectAltName", ()) if kind == "URI"]
    if len(uris) == 1:
        return parse_identity_uri(uris[0])
    common_name = next(
        (value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"), ""
    )
    return fleet_identity(uris, common_name)


def check_key_private(path: Path) -> None:
    """Refuse a private key file that its group or others may read or write.

    Raises:
        KeyFileExposed: the mode has any group or other bit (``mode & 0o077``).
        TlsFilesInvalid: there is no such file, or it cannot be examined.
    """
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise TlsFilesInvalid(f"cannot read key file {path}: {exc.strerror or exc}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileExposed(
            f"private key {path} has mode {mode:04o}: it must not be readable or writable by "
            f"group or others (chmod 600 {path}, and replace the key if others could read it)"
        )


@attrs.frozen
class TlsFiles:
    """The three files one process's mutual TLS needs, as PEM paths: the cluster CA's
    certificate, this process's certificate and its private key."""

    ca_path: Path
    cert_path: Path
    key_path: Path

    @classmethod
    def in_dir(cls, cert_dir: Path, id: str) -> TlsFiles:
        """``ca.crt``, ``<id>.crt`` and ``<id>.key`` in ``cert_dir`` (the layout ``stockade
        certs`` writes)."""
        return cls(
            ca_path=cert_dir / "ca.crt", cert_path=cert_dir / f"{id}.crt", key_path=cert_dir / f"{id}.key"
        )

    def check(self) -> None:
        """Raise unless all three exist and the key is private.

        Raises:
            TlsFilesInvalid: a file is missing (the message says how to issue it).
            KeyFileExposed: the key file is readable by others.
        """
        if not self.ca_path.is_file():
            raise TlsFilesInvalid(
                f"{self.ca_path} does not exist: copy the cluster CA's certificate (ca.crt) there "
                "from the machine that holds the CA (a new CA would not be trusted by the "
                "cluster); a cluster run without TLS needs none (--insecure for a process, "
                "STOCKADE_INSECURE=1 for a client)"
            )
        for path in (self.cert_path, self.key_path):
            if not path.is_file():
                raise TlsFilesInvalid(
                    f"{path} does not exist: issue it with `stockade certs issue` (or `stockade "
                    "certs init` for a new cluster CA) and copy it there; a cluster run without "
                    "TLS needs none (--insecure for a process, STOCKADE_INSECURE=1 for a client)"
                )
        check_key_private(self.key_path)

    def _load_into(self, context: ssl.SSLContext) -> None:
        self.check()
        try:
            context.load_verify_locations(cafile=str(self.ca_path))
        except (ssl.SSLError, OSError) as exc:
            raise TlsFilesInvalid(f"{self.ca_path} is not a PEM CA certificate: {exc}") from exc
        try:
            context.load_cert_chain(str(self.cert_path), str(self.key_path))
        except (ssl.SSLError, OSError) as exc:
            raise TlsFilesInvalid(
                f"{self.cert_path} and {self.key_path} are not a PEM certificate and its key: {exc}"
            ) from exc


def _base_context(purpose: int) -> ssl.SSLContext:
    context = ssl.SSLContext(purpose)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])  # gRPC runs over HTTP/2
    return context


class _ServerSSLObject(ssl.SSLObject):
    """Counts and logs every handshake the server refuses."""

    def do_handshake(self) -> None:
        try:
            super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise
        except ssl.SSLError as exc:
            _count_handshake_refusal(exc)
            raise


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A server context: presents ``files``' certificate and requires a client certificate
    signed by the CA (TLS 1.3, ALPN ``h2``); raises as :meth:`TlsFiles.check`."""
    context = _base_context(ssl.PROTOCOL_TLS_SERVER)
    files._load_into(context)
    context.sslobject_class = _ServerSSLObject
    return context


@attrs.frozen
class Expected:
    """The identity a client requires of the server it reaches: ``role``, and ``id`` unless
    any holder of the role will do (None)."""

    role: str
    id: str | None = None

    def admits(self, identity: Identity | None) -> bool:
        """Whether ``identity`` is one this expectation accepts (never a fleet certificate's:
        it is a client's only, and serves no worker)."""
        return (
            identity is not None
            and not identity.is_fleet
            and identity.role == self.role
            and self.id in (None, identity.id)
        )

    def __str__(self) -> str:
        return self.role if self.id is None else f"{self.role}/{self.id}"


ANY_CONTROL_PLANE = Expected(CONTROL_PLANE)


def expected_server_name(expected: Expected) -> str:
    """The name a client sends (TLS SNI) to say whom it expects: ``<role>.stockade``, or
    ``<role>-<first 32 hex digits of the id's SHA-256>.stockade`` for one id (an id may not be
    a valid DNS label)."""
    if expected.id is None:
        return f"{expected.role}.{TRUST_DOMAIN}"
    import hashlib  # here: a call to any control plane (the CLI's) hashes nothing

    digest = hashlib.sha256(expected.id.encode()).hexdigest()[:32]
    return f"{expected.role}-{digest}.{TRUST_DOMAIN}"


@attrs.frozen
class TlsTarget:
    """How to reach one server over mutual TLS: the client's context (shared by every server
    it calls) and the server name that tells that context's handshake whom to accept."""

    context: ssl.SSLContext
    server_name: str


@attrs.define
class ClientTls:
    """A client's mutual TLS: its files, loaded once into one context, and the identity it
    expects of each server it calls (:meth:`target`). Each connection checks that the server's
    certificate names the identity its ``server_hostname`` stands for
    (:func:`expected_server_name`), so one context serves calls to any number of workers.

    Raises (on :meth:`target`):
        TlsFilesInvalid, KeyFileExposed: see :meth:`TlsFiles.check`.
    """

    files: TlsFiles
    _context: ssl.SSLContext | None = attrs.field(default=None, init=False, repr=False)
    _expected_by_name: dict[str, Expected] = attrs.field(factory=dict, init=False, repr=False)

    @property
    def identity_name(self) -> str:
        """The client certificate's file name without ``.crt`` (its holder's id by the
        layout of ``stockade certs``)."""
        return self.files.cert_path.stem

    def target(self, expected: Expected = ANY_CONTROL_PLANE) -> TlsTarget:
        """This client's context and the server name standing for ``expected``."""
        name = expected_server_name(expected)
        self._expected_by_name[name] = expected
        return TlsTarget(context=self.context(), server_name=name)

    def context(self) -> ssl.SSLContext:
        """The client context (built on first use)."""
        if self._context is None:
            context = _base_context(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False  # the identity is checked instead (module docstring)
            self.files._load_into(context)
            context.sslobject_class = _verifying_object_class(self._expected_by_name)
            self._context = context
        return self._context


def _verifying_object_class(expected_by_name: dict[str, Expected]) -> type[ssl.SSLObject]:
    class VerifyingSSLObject(ssl.SSLObject):
        """Checks, once the chain is verified, that the server is who the client meant."""

        def do_handshake(self) -> None:
            super().do_handshake()
            expected = expected_by_name.get(self.server_hostname or "")
            found = identity_of_peercert(self.getpeercert())
            if expected is None or not expected.admits(found):
                raise PeerIdentityMismatch(
                    f"the server's certificate is for {found or 'no Stockade identity'}, "
                    f"not for {expected or 'an identity this client expects'}"
                )

    return VerifyingSSLObject


def describe_tls_error(exc: BaseException) -> str | None:
    """A one-line reason for a TLS failure somewhere in ``exc``'s causes (None if none is)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, PeerIdentityMismatch):
            return str(seen)
        if isinstance(seen, ssl.SSLCertVerificationError):
            return f"the server's certificate was refused: {seen.verify_message or seen.reason}"
        if isinstance(seen, ssl.SSLError):
            return _ssl_reason(seen)
        seen = seen.__cause__ or seen.__context__
    return None


def _ssl_reason(exc: ssl.SSLError) -> str:
    reason = (exc.reason or exc.strerror or str(exc)).lower().replace("_", " ")
    if "alert" in reason:
        return f"the server refused this client's certificate ({reason})"
    if "wrong version number" in reason or "record layer" in reason or "packet length" in reason:
        return "the server does not speak TLS (is it running with --insecure?)"
    return f"TLS failed: {reason}"


def _count_handshake_refusal(exc: ssl.SSLError) -> None:
    # Imported here: the metrics and log modules are not needed by a client.
    from runtime import log
    from runtime.metrics import AUTH_REFUSALS

    reason = exc.verify_message if isinstance(exc, ssl.SSLCertVerificationError) else None
    reason = reason or (exc.reason or str(exc)).lower().replace("_", " ")
    AUTH_REFUSALS.labels(rpc="-", reason="tls_handshake").inc()
    log.get("tls").warning("refused a TLS handshake", reason=reason)
