"""The pure parts of mutual TLS (runtime.tls): identities read from certificates, what a
client accepts of a server, private key files, and refusals of missing or broken files with a
message naming the file."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

import pytest

from ops.certs import init_cluster
from runtime.tls import (
    ANY_CONTROL_PLANE,
    ClientTls,
    Expected,
    Identity,
    KeyFileExposed,
    PeerIdentityMismatch,
    TlsFiles,
    TlsFilesInvalid,
    check_key_private,
    describe_tls_error,
    identity_of_peercert,
    parse_identity_uri,
    server_context,
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cluster CA and its certificates, shared by this module's tests (none changes them)."""
    folder = tmp_path_factory.mktemp("tls") / "certs"
    init_cluster(folder)
    return folder


# ---------------------------------------------------------------------------- identities


@pytest.mark.parametrize(
    ("uri", "identity"),
    [
        ("spiffe://stockade/worker/w-7", Identity(role="worker", id="w-7")),
        ("spiffe://stockade/control-plane/cp-1", Identity(role="control-plane", id="cp-1")),
        ("spiffe://stockade/operator/operator", Identity(role="operator", id="operator")),
        ("spiffe://stockade/viewer/alice", Identity(role="viewer", id="alice")),
        ("spiffe://stockade/user/alice", Identity(role="user", id="alice")),
        (
            "spiffe://stockade/viewer/v-alice/account/alice",
            Identity(role="viewer", id="v-alice", account="alice"),
        ),
    ],
)
def test_an_identity_uri_names_a_role_and_an_id(uri: str, identity: Identity) -> None:
    """``spiffe://stockade/<role>/<id>`` is read back as that role and id, and written back
    as the same URI."""
    assert parse_identity_uri(uri) == identity
    assert identity.uri == uri


@pytest.mark.parametrize(
    "uri",
    [
        "spiffe://other/worker/w-7",  # another trust domain
        "spiffe://stockade.evil/worker/w-7",  # a domain that merely starts the same
        "https://stockade/worker/w-7",
        "spiffe://stockade/admin/root",  # no such role
        "spiffe://stockade/database/database",  # a certificate role that has no gRPC identity
        "spiffe://stockade/worker/",  # no id
        "spiffe://stockade/worker",
        "spiffe://stockade/worker/w-7/extra",  # more path than role and id
        "spiffe://stockade/user/alice/account/bob",  # only a viewer is scoped to an account
        "spiffe://stockade/viewer/v-1/account/",  # no account
        "spiffe://stockade/viewer/v-1/accounts/alice",  # another segment
        "spiffe://stockade/viewer/v-1/account/alice/x",  # more path than the account
        "",
    ],
)
def test_a_uri_that_is_not_a_stockade_identity_names_nobody(uri: str) -> None:
    """Another trust domain or scheme, an unknown role, a missing id or extra segments: None."""
    assert parse_identity_uri(uri) is None


def test_a_peer_certificate_yields_its_one_stockade_identity() -> None:
    """Of a verified peer certificate's subject alternative names, the one URI is the identity
    (DNS names and IP addresses are ignored); a second URI, even of another trust domain,
    leaves the certificate with none."""
    peercert = {
        "subjectAltName": (
            ("URI", "spiffe://stockade/worker/w-3"),
            ("DNS", "localhost"),
            ("IP Address", "127.0.0.1"),
        )
    }
    assert identity_of_peercert(peercert) == Identity(role="worker", id="w-3")
    also_foreign = {"subjectAltName": (*peercert["subjectAltName"], ("URI", "spiffe://elsewhere/admin/x"))}
    assert identity_of_peercert(also_foreign) is None


@pytest.mark.parametrize(
    "peercert",
    [
        None,  # no certificate (plaintext)
        {},  # not verified: getpeercert() gives an empty dict
        {"subjectAltName": (("DNS", "localhost"),)},
        {"subjectAltName": (("DNS", "spiffe://stockade/worker/w-1"),)},  # a URI only as URI
        {
            "subjectAltName": (
                ("URI", "spiffe://stockade/worker/w-1"),
                ("URI", "spiffe://stockade/control-plane/cp-1"),
            )
        },
    ],
    ids=["none", "unverified", "no-uri", "dns-not-uri", "two-identities"],
)
def test_a_peer_certificate_without_exactly_one_identity_names_nobody(
    peercert: dict[str, object] | None,
) -> None:
    """No certificate, no Stockade URI, or two of them (which one would count?): None."""
    assert identity_of_peercert(peercert) is None


def fleet_peercert(*uris: str, common_name: str = "fleet-1") -> dict[str, object]:
    return {
        "subject": ((("organizationName", "stockade"),), (("commonName", common_name),)),
        "subjectAltName": tuple(("URI", uri) for uri in uris),
    }


def test_a_fleet_certificate_names_the_workers_it_may_speak_for() -> None:
    """A peer certificate whose URIs are all worker identities names a fleet identity: the
    workers, and its common name as id; it speaks for those workers and for no other id, its
    common name included."""
    identity = identity_of_peercert(
        fleet_peercert("spiffe://stockade/worker/w-1", "spiffe://stockade/worker/w-2")
    )
    assert identity == Identity(role="worker", id="fleet-1", workers=frozenset({"w-1", "w-2"}))
    assert identity is not None and identity.is_fleet
    assert [identity.speaks_for(w) for w in ("w-1", "w-2", "w-3", "fleet-1")] == [True, True, False, False]
    assert str(identity) == "worker/fleet-1 (a fleet certificate for 2 workers)"
    assert identity.uris == ("spiffe://stockade/worker/w-1", "spiffe://stockade/worker/w-2")


def test_a_single_worker_certificate_speaks_for_its_own_id_only() -> None:
    """A worker's own certificate speaks for its id; no other role speaks for any worker."""
    assert Identity(role="worker", id="w-1").speaks_for("w-1")
    assert not Identity(role="worker", id="w-1").speaks_for("w-2")
    assert not Identity(role="operator", id="w-1").speaks_for("w-1")


@pytest.mark.parametrize(
    "uris",
    [
        ("spiffe://stockade/worker/w-1", "spiffe://stockade/control-plane/cp-1"),
        ("spiffe://stockade/worker/w-1", "spiffe://stockade/operator/operator"),
        ("spiffe://stockade/worker/w-1", "spiffe://elsewhere/worker/w-2"),
        ("spiffe://stockade/worker/w-1", "spiffe://stockade/worker/w-1"),
    ],
    ids=["with-a-control-plane", "with-an-operator", "foreign", "repeated"],
)
def test_several_uris_that_are_not_distinct_workers_name_nobody(uris: tuple[str, ...]) -> None:
    """Only distinct Stockade worker URIs make a fleet certificate; any other mix names none."""
    assert identity_of_peercert(fleet_peercert(*uris)) is None


def test_no_expectation_admits_a_fleet_certificate_as_a_server() -> None:
    """A fleet certificate is a client's only: not even the worker its common name or first
    URI names accepts it as its server."""
    fleet = Identity(role="worker", id="w-1", workers=frozenset({"w-1", "w-2"}))
    assert not Expected("worker", "w-1").admits(fleet)
    assert not Expected("worker").admits(fleet)


def test_a_role_expectation_admits_every_id_of_that_role_only() -> None:
    """Any control plane will do for a control-plane address; a worker or no identity will
    not."""
    assert ANY_CONTROL_PLANE.admits(Identity(role="control-plane", id="cp-2"))
    assert not ANY_CONTROL_PLANE.admits(Identity(role="worker", id="cp-2"))
    assert not ANY_CONTROL_PLANE.admits(None)
    assert str(ANY_CONTROL_PLANE) == "control-plane"


def test_an_id_expectation_admits_that_holder_only() -> None:
    """The worker an assignment is for, and no other worker or role with the same id."""
    w2 = Expected("worker", "w-2")
    assert w2.admits(Identity(role="worker", id="w-2"))
    assert not w2.admits(Identity(role="worker", id="w-1"))
    assert not w2.admits(Identity(role="control-plane", id="w-2"))
    assert not w2.admits(None)
    assert str(w2) == "worker/w-2"


# ---------------------------------------------------------------------------- key files


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_key_only_its_owner_may_read_is_accepted(tmp_path: Path, mode: int) -> None:
    """Modes 0600 and 0400 pass."""
    key = tmp_path / "k.key"
    key.write_text("key")
    key.chmod(mode)
    check_key_private(key)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o610])
def test_a_key_group_or_others_may_touch_is_refused_naming_file_and_mode(tmp_path: Path, mode: int) -> None:
    """Any group or other bit: KeyFileExposed naming the file, its mode and the fix."""
    key = tmp_path / "k.key"
    key.write_text("key")
    key.chmod(mode)
    with pytest.raises(KeyFileExposed) as raised:
        check_key_private(key)
    assert str(raised.value) == (
        f"private key {key} has mode {mode:04o}: it must not be readable or writable by group or "
        f"others (chmod 600 {key}, and replace the key if others could read it)"
    )


def test_a_missing_key_is_refused_naming_it(tmp_path: Path) -> None:
    """A key file that does not exist: TlsFilesInvalid naming it."""
    with pytest.raises(TlsFilesInvalid, match=r"^cannot read key file .*nope\.key: No such file"):
        check_key_private(tmp_path / "nope.key")


# ---------------------------------------------------------------------------- files and contexts


def test_the_files_of_an_id_follow_the_certs_layout(tmp_path: Path) -> None:
    """``ca.crt``, ``<id>.crt`` and ``<id>.key`` in the folder."""
    assert TlsFiles.in_dir(tmp_path, "w-4") == TlsFiles(
        ca_path=tmp_path / "ca.crt", cert_path=tmp_path / "w-4.crt", key_path=tmp_path / "w-4.key"
    )
    assert ClientTls(TlsFiles.in_dir(tmp_path, "viewer")).identity_name == "viewer"


def test_complete_files_pass_the_check(certs: Path) -> None:
    """What ``stockade certs init`` wrote passes."""
    TlsFiles.in_dir(certs, "cp-1").check()


@pytest.mark.parametrize("missing", ["ca_path", "cert_path", "key_path"])
def test_a_missing_file_is_refused_naming_it_and_how_to_issue_it(certs: Path, missing: str) -> None:
    """The CA, the certificate or the key missing: TlsFilesInvalid naming that file and the
    command that issues it."""
    files = TlsFiles.in_dir(certs, "cp-1")
    gone = certs / "gone.pem"
    with pytest.raises(TlsFilesInvalid) as raised:
        TlsFiles(
            **{**{k: getattr(files, k) for k in ("ca_path", "cert_path", "key_path")}, missing: gone}
        ).check()
    if missing == "ca_path":
        how = (
            "copy the cluster CA's certificate (ca.crt) there from the machine that holds the CA "
            "(a new CA would not be trusted by the cluster)"
        )
    else:
        how = (
            "issue it with `stockade certs issue` (or `stockade certs init` for a new cluster CA) "
            "and copy it there"
        )
    assert str(raised.value) == (
        f"{gone} does not exist: {how}; a cluster run without TLS needs none "
        "(--insecure for a process, STOCKADE_INSECURE=1 for a client)"
    )


def test_an_exposed_key_is_refused_before_any_context_is_built(certs: Path, tmp_path: Path) -> None:
    """A key others may read stops a server and a client context alike."""
    key = tmp_path / "exposed.key"
    key.write_bytes((certs / "cp-1.key").read_bytes())
    key.chmod(0o644)
    files = TlsFiles(ca_path=certs / "ca.crt", cert_path=certs / "cp-1.crt", key_path=key)
    with pytest.raises(KeyFileExposed, match=f"^{re.escape(f'private key {key} has mode 0644')}"):
        server_context(files)
    with pytest.raises(KeyFileExposed, match=f"^{re.escape(f'private key {key} has mode 0644')}"):
        ClientTls(files).context()


def test_a_ca_file_that_is_not_pem_is_refused_naming_it(certs: Path, tmp_path: Path) -> None:
    """A CA file with no certificate in it: TlsFilesInvalid naming it, for servers and clients."""
    ca = tmp_path / "ca.crt"
    ca.write_text("not a certificate\n")
    files = TlsFiles(ca_path=ca, cert_path=certs / "cp-1.crt", key_path=certs / "cp-1.key")
    with pytest.raises(TlsFilesInvalid, match=f"^{re.escape(f'{ca} is not a PEM CA certificate: ')}"):
        server_context(files)
    with pytest.raises(TlsFilesInvalid, match=f"^{re.escape(f'{ca} is not a PEM CA certificate: ')}"):
        ClientTls(files).context()


def test_a_certificate_that_is_not_pem_is_refused_naming_it_and_its_key(certs: Path, tmp_path: Path) -> None:
    """A certificate file that holds no certificate: TlsFilesInvalid naming both files."""
    cert = tmp_path / "cp-1.crt"
    cert.write_text("-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n")
    files = TlsFiles(ca_path=certs / "ca.crt", cert_path=cert, key_path=certs / "cp-1.key")
    with pytest.raises(TlsFilesInvalid) as raised:
        server_context(files)
    assert str(raised.value).startswith(
        f"{cert} and {certs / 'cp-1.key'} are not a PEM certificate and its key: "
    )


def test_a_key_of_another_certificate_is_refused_naming_both(certs: Path) -> None:
    """cp-1's certificate with w-1's key: TlsFilesInvalid naming both files."""
    files = TlsFiles(ca_path=certs / "ca.crt", cert_path=certs / "cp-1.crt", key_path=certs / "w-1.key")
    with pytest.raises(TlsFilesInvalid) as raised:
        ClientTls(files).context()
    assert str(raised.value).startswith(
        f"{files.cert_path} and {files.key_path} are not a PEM certificate and its key: "
    )


def test_contexts_require_tls_1_3_and_a_verified_peer(certs: Path) -> None:
    """Both ends insist on TLS 1.3, ALPN h2 and a certificate from the CA; a client checks the
    identity instead of the host name."""
    server = server_context(TlsFiles.in_dir(certs, "cp-1"))
    client = ClientTls(TlsFiles.in_dir(certs, "operator")).context()
    for context in (server, client):
        assert context.minimum_version == ssl.TLSVersion.TLSv1_3
        assert context.verify_mode == ssl.CERT_REQUIRED
    assert client.check_hostname is False


def test_a_client_loads_one_context_and_names_each_expectation(certs: Path) -> None:
    """Every target shares the client's one context; each expectation has its own server
    name, an id of any length or characters included."""
    tls = ClientTls(TlsFiles.in_dir(certs, "cp-1"))
    w1 = tls.target(Expected("worker", "w-1"))
    w2 = tls.target(Expected("worker", "w-2"))
    long_id = tls.target(Expected("worker", "W_" + "x" * 62))
    assert w1.context is w2.context is long_id.context is tls.context()
    assert len({w1.server_name, w2.server_name, long_id.server_name}) == 3
    assert tls.target().server_name == "control-plane.stockade"
    for target in (w1, long_id):
        assert all(0 < len(label) <= 63 for label in target.server_name.split("."))


# ---------------------------------------------------------------------------- reasons


def test_an_identity_mismatch_reads_as_its_message() -> None:
    """The reason a client gives for a server with another identity is the sentence itself."""
    mismatch = PeerIdentityMismatch("the server's certificate is for worker/w-1, not for worker/w-2")
    assert str(mismatch) == "the server's certificate is for worker/w-1, not for worker/w-2"
    wrapped = OSError("connection failed")
    wrapped.__cause__ = mismatch
    assert describe_tls_error(wrapped) == "the server's certificate is for worker/w-1, not for worker/w-2"


def test_errors_without_tls_in_them_have_no_tls_reason() -> None:
    """A lost connection that no TLS error caused: None."""
    assert describe_tls_error(ConnectionResetError("reset")) is None


def test_a_users_scope_is_its_id_and_a_scoped_viewers_its_account() -> None:
    """The one account a holder may see: a user's own id, a scoped viewer's account, and none
    (every account) for an operator or a viewer issued without one."""
    assert Identity(role="user", id="alice").scope == "alice"
    assert Identity(role="viewer", id="v-1", account="alice").scope == "alice"
    assert Identity(role="viewer", id="v-1").scope is None
    assert Identity(role="operator", id="alice").scope is None
