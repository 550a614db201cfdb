"""The web console's login token: a JWT signed with a user's client key, carrying its certificate.

``stockade console`` signs one (:func:`make_token`), the console checks it
(:func:`verify_token`: the cluster CA, a role of :data:`CONSOLE_ROLES`, the signature, the
claims and :func:`audience_of`). Times are wall-clock Unix seconds passed in by the caller. The
rules and why: docs/design.md, "The web console's login token".
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hashlib
import json
import math
from typing import Any

import attrs
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature
from cryptography.x509.oid import ExtendedKeyUsageOID

from runtime.errors import PermanentError
from runtime.tls import OPERATOR, USER, VIEWER, Identity, TlsFiles, parse_identity_uri

CONSOLE_ROLES = (OPERATOR, VIEWER, USER)
"""The roles whose certificates may sign a console token: the console only reads (a user, or a
viewer scoped to an account, sees that account's jobs only: docs/accounts.md)."""
MAX_LIFETIME_S = 12 * 3600.0
"""The longest lifetime a token may have (``exp - iat``), in seconds: 12 h."""
CLOCK_SKEW_S = 60.0
"""How far the signer's clock may run ahead of the console's, in seconds (``iat`` in the future
by up to this much is accepted)."""
MAX_TOKEN_BYTES = 8192
"""Longest token accepted, in bytes (a P-256 certificate and the claims take about 1.2 KiB)."""

_ES256_COORDINATE_BYTES = 32


class TokenRefused(PermanentError):
    """A console token was refused; the message says why (expired, another cluster's, a
    certificate the CA did not issue, a role that may not read the console...). The caller
    needs a new token: ``stockade console``."""


@attrs.frozen(kw_only=True)
class TokenClaims:
    """What a verified token says: who signed it and until when (Unix seconds)."""

    identity: Identity
    expires_unix_s: float


def audience_of(ca_pem: bytes) -> str:
    """The ``aud`` of the consoles of the cluster whose CA certificate is ``ca_pem``:
    ``stockade-console:`` and the first 16 hex digits of the SHA-256 of its DER form.

    Raises:
        ValueError: ``ca_pem`` is no PEM certificate.
    """
    der = x509.load_pem_x509_certificate(ca_pem).public_bytes(serialization.Encoding.DER)
    return f"stockade-console:{hashlib.sha256(der).hexdigest()[:16]}"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def make_token(files: TlsFiles, *, now_unix_s: float, lifetime_s: float) -> str:
    """A token signed with ``files``' key, carrying its certificate, for the consoles of the
    cluster whose CA is ``files.ca_path``.

    Args:
        now_unix_s: the time the token is issued at (``iat``).
        lifetime_s: seconds until it expires; at most :data:`MAX_LIFETIME_S`.

    Raises:
        TokenRefused: the lifetime is out of range, the key is no P-256 key, or the certificate
            names no identity of :data:`CONSOLE_ROLES`.
        TlsFilesInvalid, KeyFileExposed: a file is missing, or the key is readable by others.
    """
    if not 0 < lifetime_s <= MAX_LIFETIME_S:
        raise TokenRefused(f"lifetime_s must be > 0 and <= {MAX_LIFETIME_S:g} (12 h), got {lifetime_s:g}")
    files.check()
    cert = x509.load_pem_x509_certificate(files.cert_path.read_bytes())
    identity = _identity_of(cert)
    key = serialization.load_pem_private_key(files.key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise TokenRefused(f"{files.key_path} is not an EC P-256 key: console tokens are signed ES256")
    header = {
        "alg": "ES256",
        "typ": "JWT",
        "x5c": [base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode("ascii")],
    }
    claims = {
        "sub": identity.id,
        "role": identity.role,
        "aud": audience_of(files.ca_path.read_bytes()),
        "iat": int(now_unix_s),
        "exp": int(now_unix_s + lifetime_s),
    }
    signing_input = ".".join(
        _b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
    )
    r, s = decode_dss_signature(key.sign(signing_input.encode("ascii"), ec.ECDSA(hashes.SHA256())))
    signature = r.to_bytes(_ES256_COORDINATE_BYTES, "big") + s.to_bytes(_ES256_COORDINATE_BYTES, "big")
    return f"{signing_input}.{_b64url(signature)}"


def _identity_of(cert: x509.Certificate) -> Identity:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise TokenRefused("the token's certificate names no Stockade identity") from None
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    identity = parse_identity_uri(uris[0]) if len(uris) == 1 else None
    if identity is None:
        raise TokenRefused("the token's certificate names no Stockade identity")
    if identity.role not in CONSOLE_ROLES:
        raise TokenRefused(
            f"the token's certificate is {identity}: the console admits operators, viewers and users"
        )
    return identity


def _json_part(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(_unb64url(text))
    except (ValueError, binascii.Error):
        raise TokenRefused(f"the token's {what} is not base64url JSON") from None
    if not isinstance(value, dict):
        raise TokenRefused(f"the token's {what} is not a JSON object")
    return value


def _number(claims: dict[str, Any], name: str) -> float:
    value = claims.get(name)
    # NaN and the infinities pass no comparison: a token dated so would never expire.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TokenRefused(f"the token's {name} claim must be a finite number of Unix seconds")
    return float(value)


def verify_token(
    token: str,
    *,
    ca: x509.Certificate,
    audience: str,
    now_unix_s: float,
    max_lifetime_s: float = MAX_LIFETIME_S,
) -> TokenClaims:
    """The claims of ``token`` (JWS compact form) once every check of the module docstring has
    passed, with ``audience`` :func:`audience_of` ``ca``; TokenRefused naming the check that
    failed. ``max_lifetime_s``: the longest ``exp - iat`` accepted."""
    if len(token) > MAX_TOKEN_BYTES:
        raise TokenRefused(f"the token is {len(token)} bytes long: at most {MAX_TOKEN_BYTES} are accepted")
    parts = token.split(".")
    if len(parts) != 3:
        raise TokenRefused("the token is not a signed JWT (header.claims.signature)")
    header, claims = _json_part(parts[0], "header"), _json_part(parts[1], "claims")
    if header.get("alg") != "ES256":
        raise TokenRefused(f"the token's alg must be ES256, got {header.get('alg')!r}")
    chain = header.get("x5c")
    if not isinstance(chain, list) or len(chain) != 1 or not isinstance(chain[0], str):
        raise TokenRefused("the token's x5c header must hold exactly one certificate")
    try:
        cert = x509.load_der_x509_certificate(base64.b64decode(chain[0], validate=True))
    except (ValueError, binascii.Error):
        raise TokenRefused("the token's certificate is not a DER certificate") from None
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise TokenRefused("the token's certificate was not issued by this cluster's CA") from None
    now = datetime.datetime.fromtimestamp(now_unix_s, tz=datetime.UTC)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise TokenRefused(
            f"the token's certificate is valid from {cert.not_valid_before_utc:%Y-%m-%d %H:%M} to "
            f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, not now"
        )
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        usages = None
    if usages is None or ExtendedKeyUsageOID.CLIENT_AUTH not in usages:
        raise TokenRefused("the token's certificate may not authenticate a client (no clientAuth usage)")
    identity = _identity_of(cert)
    public_key = cert.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or public_key.curve.name != "secp256r1":
        raise TokenRefused("the token's certificate holds no EC P-256 key")
    try:
        raw = _unb64url(parts[2])
    except (ValueError, binascii.Error):
        raise TokenRefused("the token's signature is not base64url") from None
    if len(raw) != 2 * _ES256_COORDINATE_BYTES:
        raise TokenRefused("the token's signature is not an ES256 signature (64 bytes)")
    signature = encode_dss_signature(
        int.from_bytes(raw[:_ES256_COORDINATE_BYTES], "big"),
        int.from_bytes(raw[_ES256_COORDINATE_BYTES:], "big"),
    )
    try:
        public_key.verify(signature, f"{parts[0]}.{parts[1]}".encode("ascii"), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise TokenRefused("the token's signature does not match its certificate's key") from None
    if claims.get("aud") != audience:
        raise TokenRefused("the token was made for another cluster's consoles (aud)")
    if claims.get("sub") != identity.id or claims.get("role") != identity.role:
        raise TokenRefused(f"the token's sub and role do not name its certificate's identity, {identity}")
    issued_s, expires_s = _number(claims, "iat"), _number(claims, "exp")
    if issued_s > now_unix_s + CLOCK_SKEW_S:
        raise TokenRefused("the token was issued in the future (iat): is the signer's clock right?")
    if expires_s - issued_s > max_lifetime_s:
        raise TokenRefused(
            f"the token lives {expires_s - issued_s:g} s: at most {max_lifetime_s:g} s are accepted"
        )
    if now_unix_s >= expires_s:
        raise TokenRefused("the token has expired")
    return TokenClaims(identity=identity, expires_unix_s=expires_s)
