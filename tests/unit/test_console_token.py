"""Console login tokens (runtime.console_token): made with a user's key, checked against the CA."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography import x509

from ops.certs import init_cluster, issue
from ops.cli.console import MAX_LIFETIME_H
from runtime.console_token import MAX_LIFETIME_S, TokenRefused, audience_of, make_token, verify_token
from runtime.tls import TlsFiles

NOW_S = 1_800_000_000.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("certs")
    init_cluster(folder)
    return folder


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("other-certs")
    init_cluster(folder)
    return folder


def check(token: str, certs: Path, *, now_s: float = NOW_S) -> str:
    ca_pem = (certs / "ca.crt").read_bytes()
    claims = verify_token(
        token, ca=x509.load_pem_x509_certificate(ca_pem), audience=audience_of(ca_pem), now_unix_s=now_s
    )
    return str(claims.identity)


def forged(token: str, **changes: object) -> str:
    head, claims, signature = token.split(".")
    payload = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    payload.update(changes)
    body = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    return f"{head}.{body}.{signature}"


def test_a_viewers_token_names_the_viewer(certs: Path) -> None:
    """A token made with the viewer's files verifies as viewer/viewer."""
    token = make_token(TlsFiles.in_dir(certs, "viewer"), now_unix_s=NOW_S - 10, lifetime_s=3600)
    assert check(token, certs) == "viewer/viewer"


def test_an_expired_token_is_refused(certs: Path) -> None:
    """A token is refused from its expiry on."""
    token = make_token(TlsFiles.in_dir(certs, "operator"), now_unix_s=NOW_S, lifetime_s=60)
    assert check(token, certs, now_s=NOW_S + 59) == "operator/operator"
    with pytest.raises(TokenRefused, match="expired"):
        check(token, certs, now_s=NOW_S + 60)


def test_a_lifetime_beyond_twelve_hours_is_neither_made_nor_accepted(certs: Path) -> None:
    """make_token refuses more than 12 h, and a token whose claims were stretched is refused."""
    assert MAX_LIFETIME_H * 3600 == MAX_LIFETIME_S
    with pytest.raises(TokenRefused, match="lifetime_s"):
        make_token(TlsFiles.in_dir(certs, "viewer"), now_unix_s=NOW_S, lifetime_s=MAX_LIFETIME_S + 1)
    token = make_token(TlsFiles.in_dir(certs, "viewer"), now_unix_s=NOW_S, lifetime_s=60)
    with pytest.raises(TokenRefused, match="signature"):
        check(forged(token, exp=NOW_S + 3600), certs)


def resigned(token: str, key_path: Path, **changes: object) -> str:
    """``token`` with its claims changed and signed again with the key at ``key_path`` (its
    holder's own forgery: the signature verifies)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    head, claims, _ = token.split(".")
    payload = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    payload.update(changes)
    body = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    r, s = decode_dss_signature(key.sign(f"{head}.{body}".encode(), ec.ECDSA(hashes.SHA256())))
    signature = base64.urlsafe_b64encode(r.to_bytes(32, "big") + s.to_bytes(32, "big")).rstrip(b"=").decode()
    return f"{head}.{body}.{signature}"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_token_dated_by_no_finite_number_is_refused(certs: Path, value: float) -> None:
    """A holder's own token whose iat and exp are NaN (which no comparison catches) or infinite
    is refused, not taken as never expiring."""
    files = TlsFiles.in_dir(certs, "operator")
    token = make_token(files, now_unix_s=NOW_S, lifetime_s=60)
    assert check(resigned(token, files.key_path), certs) == "operator/operator"
    with pytest.raises(TokenRefused, match="must be a finite number of Unix seconds"):
        check(resigned(token, files.key_path, iat=value, exp=value), certs)


def test_claims_changed_after_signing_are_refused(certs: Path) -> None:
    """A viewer's token rewritten to say operator fails its signature check."""
    token = make_token(TlsFiles.in_dir(certs, "viewer"), now_unix_s=NOW_S, lifetime_s=60)
    with pytest.raises(TokenRefused, match="signature"):
        check(forged(token, role="operator", sub="operator"), certs)


def test_a_token_of_another_clusters_ca_is_refused(certs: Path, other_certs: Path) -> None:
    """A certificate the cluster CA did not issue is refused, whatever it names."""
    token = make_token(TlsFiles.in_dir(other_certs, "operator"), now_unix_s=NOW_S, lifetime_s=60)
    with pytest.raises(TokenRefused, match="not issued by this cluster's CA"):
        check(token, certs)


def test_only_operators_viewers_and_users_may_sign(certs: Path) -> None:
    """A worker's or a control plane's certificate makes no console token."""
    for id in ("w-1", "cp-1"):
        with pytest.raises(TokenRefused, match="admits operators, viewers and users"):
            make_token(TlsFiles.in_dir(certs, id), now_unix_s=NOW_S, lifetime_s=60)


def test_a_new_viewer_issued_by_the_ca_is_admitted(certs: Path) -> None:
    """A viewer issued later (stockade certs issue) logs in under its own id."""
    issue(certs, role="viewer", id="alice")
    token = make_token(TlsFiles.in_dir(certs, "alice"), now_unix_s=NOW_S, lifetime_s=60)
    assert check(token, certs) == "viewer/alice"


@pytest.mark.parametrize(
    "token",
    ["", "abc", "a.b.c", "e30.e30.", "x" * 9000, "eyJhbGciOiJub25lIn0.e30."],
)
def test_malformed_tokens_are_refused_with_a_reason(certs: Path, token: str) -> None:
    """Garbage, an unsigned JWT (alg none) and an oversized token are each refused, not crashed on."""
    with pytest.raises(TokenRefused):
        check(token, certs)
