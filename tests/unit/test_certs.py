"""The cluster CA and its certificates: they verify, name their holder, and keep keys private."""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509 import DNSName, IPAddress
from cryptography.x509.verification import PolicyBuilder, Store
from typer.testing import CliRunner

from ops import certs as certs_module
from ops.certs import (
    CertDir,
    CertificateAuthorityMissing,
    CertificateExists,
    CertSettings,
    NotAStockadeCertificate,
    describe,
    diagnose_client_cert,
    identity_of,
    init_cluster,
    issue,
)
from ops.cli import EXIT_INVALID, EXIT_UNAVAILABLE, app
from ops.cli.common import unreachable_message
from runtime.errors import InvalidArgument, NoControlPlaneReachable, Unavailable
from runtime.tls import Identity, KeyFileExposed, check_key_private


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> CertDir:
    """One initialised folder shared by the read-only tests (key generation is the slow part)."""
    path = tmp_path_factory.mktemp("certs") / "certs"
    init_cluster(path)
    return CertDir(path)


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def test_init_issues_the_local_clusters_identities(cluster: CertDir) -> None:
    """init writes the CA and a pair for cp-1..cp-3, w-1..w-5, operator, viewer and database."""
    names = sorted(p.name for p in cluster.path.iterdir())
    ids = ["cp-1", "cp-2", "cp-3", "w-1", "w-2", "w-3", "w-4", "w-5", "operator", "viewer", "database", "ca"]
    assert names == sorted([f"{i}.crt" for i in ids] + [f"{i}.key" for i in ids])


def test_a_server_certificate_verifies_against_the_ca_for_localhost(cluster: CertDir) -> None:
    """A control plane's certificate chains to the CA as a server for localhost."""
    store = Store([load(cluster.ca_cert)])
    verifier = PolicyBuilder().store(store).build_server_verifier(DNSName("localhost"))
    chain = verifier.verify(load(cluster.cert("cp-1")), [])
    assert chain[-1] == load(cluster.ca_cert)


def test_the_database_certificate_verifies_as_a_server_for_127_0_0_1(cluster: CertDir) -> None:
    """The embedded PostgreSQL's certificate chains to the CA as a server for the IP 127.0.0.1."""
    store = Store([load(cluster.ca_cert)])
    verifier = (
        PolicyBuilder().store(store).build_server_verifier(IPAddress(ipaddress.ip_address("127.0.0.1")))
    )
    chain = verifier.verify(load(cluster.cert("database")), [])
    assert chain[-1] == load(cluster.ca_cert)
    assert identity_of(load(cluster.cert("database"))) == Identity(role="database", id="database")


def test_a_client_certificate_verifies_against_the_ca_as_a_client(cluster: CertDir) -> None:
    """The operator's certificate chains to the CA as a TLS client and carries its SPIFFE URI."""
    verifier = PolicyBuilder().store(Store([load(cluster.ca_cert)])).build_client_verifier()
    verified = verifier.verify(load(cluster.cert("operator")), [])
    assert [str(u.value) for u in verified.subjects or []] == ["spiffe://stockade/operator/operator"]


def test_mutual_tls_handshake_with_the_issued_pairs(cluster: CertDir) -> None:
    """Python's ssl loads the pairs and completes a TLS 1.3 handshake with both sides verified."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.minimum_version = ssl.TLSVersion.TLSv1_3
    server.load_cert_chain(cluster.cert("cp-1"), cluster.key("cp-1"))
    server.load_verify_locations(cluster.ca_cert)
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(cafile=str(cluster.ca_cert))
    client.load_cert_chain(cluster.cert("operator"), cluster.key("operator"))
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_hostname="localhost")
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(10):
        for name, side in (("c", c), ("s", s)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            break
    assert all(done.values())
    assert c.version() == "TLSv1.3"
    peer = x509.load_der_x509_certificate(s.getpeercert(binary_form=True) or b"")
    assert identity_of(peer) == Identity(role="operator", id="operator")


@pytest.mark.parametrize(
    ("id", "role"),
    [("cp-2", "control-plane"), ("w-5", "worker"), ("operator", "operator"), ("viewer", "viewer")],
)
def test_role_and_id_are_read_back(cluster: CertDir, id: str, role: str) -> None:
    """identity_of reads the role and id from the spiffe://stockade/<role>/<id> URI."""
    assert identity_of(load(cluster.cert(id))) == Identity(role=role, id=id)


def test_the_ca_has_no_identity(cluster: CertDir) -> None:
    """The CA names no holder: identity_of refuses it."""
    with pytest.raises(NotAStockadeCertificate):
        identity_of(load(cluster.ca_cert))


def test_keys_are_0600_and_certificates_0644(cluster: CertDir) -> None:
    """Every key file has mode 0600 and every certificate 0644."""
    for path in cluster.path.iterdir():
        assert mode(path) == (0o600 if path.suffix == ".key" else 0o644), path


def test_keys_are_0600_even_under_a_permissive_umask(tmp_path: Path) -> None:
    """Keys are created 0600 (not widened by umask 000); certificates still 0644."""
    old = os.umask(0)
    try:
        init_cluster(tmp_path / "c")
    finally:
        os.umask(old)
    assert mode(tmp_path / "c" / "ca.key") == 0o600
    assert mode(tmp_path / "c" / "w-1.key") == 0o600
    assert mode(tmp_path / "c" / "w-1.crt") == 0o644


def test_a_group_readable_key_is_refused_naming_the_file(tmp_path: Path) -> None:
    """check_key_private raises KeyFileExposed naming the file and its mode."""
    key = tmp_path / "x.key"
    key.write_bytes(b"")
    key.chmod(0o640)
    with pytest.raises(KeyFileExposed, match=re.escape(f"{key} has mode 0640")):
        check_key_private(key)
    key.chmod(0o600)
    check_key_private(key)


def test_init_refuses_an_existing_ca_and_writes_nothing(cluster: CertDir) -> None:
    """A second init in the same folder is refused and leaves every file as it was."""
    before = {p: p.read_bytes() for p in cluster.path.iterdir()}
    with pytest.raises(CertificateExists, match=r"ca\.crt"):
        init_cluster(cluster.path)
    assert {p: p.read_bytes() for p in cluster.path.iterdir()} == before


def test_issue_a_worker_with_hosts(cluster: CertDir) -> None:
    """A worker issued with hosts names them besides localhost and 127.0.0.1, for cert_valid_days."""
    done = issue(
        cluster.path,
        role="worker",
        id="w-7",
        hosts=["node7.example", "10.0.0.7", "::1"],
        settings=CertSettings(cert_valid_days=30),
    )
    info = describe(done.cert_path)
    assert info.identity == Identity(role="worker", id="w-7")
    assert info.uris == ("spiffe://stockade/worker/w-7",)
    assert info.dns_names == ("localhost", "node7.example")
    assert info.ip_addresses == ("127.0.0.1", "10.0.0.7", "::1")
    assert (info.not_valid_after - info.not_valid_before).days == 30
    assert info.subject == "CN=w-7,OU=worker,O=stockade"


def test_issue_a_fleet_certificate(cluster: CertDir) -> None:
    """A fleet certificate names each of its workers in a URI SAN of its own and nothing else
    (no host, no other URI), is for client auth only, and reads back as the fleet identity."""
    done = issue(cluster.path, role="worker", id="fleet-9", workers=["w-91", "w-92", "w-93"])
    info = describe(done.cert_path)
    assert info.identity == Identity(role="worker", id="fleet-9", workers=frozenset({"w-91", "w-92", "w-93"}))
    assert info.uris == tuple(f"spiffe://stockade/worker/w-9{n}" for n in (1, 2, 3))
    assert (info.dns_names, info.ip_addresses) == ((), ())
    assert info.subject == "CN=fleet-9,OU=worker,O=stockade"
    usages = load(done.cert_path).extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"role": "operator", "id": "f-1", "workers": ["w-1", "w-2"]}, "workers"),
        ({"role": "worker", "id": "f-2", "workers": ["w-1"]}, "workers"),
        ({"role": "worker", "id": "f-3", "workers": ["w-1", "w-1"]}, "workers"),
        ({"role": "worker", "id": "f-4", "workers": ["w-1", "w/2"]}, "workers"),
        ({"role": "worker", "id": "f-5", "workers": ["w-1", "w-2"], "hosts": ["a.example"]}, "host"),
    ],
    ids=["not-a-worker", "one-worker", "repeated", "bad-id", "hosts"],
)
def test_issue_refuses_a_bad_fleet_certificate_and_writes_nothing(
    cluster: CertDir, kwargs: dict, field: str
) -> None:
    """Workers for another role, fewer than two, repeated or malformed, or hosts beside them:
    InvalidArgument naming the field, and no file."""
    before = sorted(cluster.path.iterdir())
    with pytest.raises(InvalidArgument) as caught:
        issue(cluster.path, **kwargs)
    assert caught.value.field == field
    assert sorted(cluster.path.iterdir()) == before


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"role": "admin", "id": "x"}, "role"),
        ({"role": "worker", "id": "w/7"}, "id"),
        ({"role": "worker", "id": "w-8", "hosts": ["bad host"]}, "host"),
        ({"role": "viewer", "id": "v-2", "hosts": ["a.example"]}, "host"),
        ({"role": "user", "id": "-alice"}, "id"),
        ({"role": "viewer", "id": "v-3", "account": "al/ice"}, "account"),
        ({"role": "user", "id": "bob", "account": "alice"}, "account"),
        ({"role": "operator", "id": "op-2", "account": "alice"}, "account"),
    ],
)
def test_issue_refuses_bad_input_and_writes_nothing(cluster: CertDir, kwargs: dict, field: str) -> None:
    """An unknown role, a bad id, a bad host, hosts for a client, an account that breaks the id
    rules or one given to a role that cannot be scoped: InvalidArgument, no file."""
    before = sorted(cluster.path.iterdir())
    with pytest.raises(InvalidArgument) as caught:
        issue(cluster.path, **kwargs)
    assert caught.value.field == field
    assert sorted(cluster.path.iterdir()) == before


def test_issue_without_a_ca_is_refused(tmp_path: Path) -> None:
    """No CA in the folder: CertificateAuthorityMissing, nothing written."""
    with pytest.raises(CertificateAuthorityMissing, match="stockade certs init"):
        issue(tmp_path, role="worker", id="w-1")
    assert list(tmp_path.iterdir()) == []


def test_issue_refuses_to_overwrite_an_identity(cluster: CertDir) -> None:
    """Issuing an id that already has files is refused."""
    with pytest.raises(CertificateExists, match=r"cp-1\.crt"):
        issue(cluster.path, role="control-plane", id="cp-1")


def test_issue_refuses_an_exposed_ca_key(tmp_path: Path) -> None:
    """A CA key readable by others is refused before it is used."""
    init_cluster(tmp_path)
    (tmp_path / "ca.key").chmod(0o644)
    with pytest.raises(KeyFileExposed, match=r"ca\.key"):
        issue(tmp_path, role="worker", id="w-9")
    assert not (tmp_path / "w-9.crt").exists()


# ---------------------------------------------------------------------------- the CLI


def test_cli_init_defaults_to_the_state_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`stockade certs init` writes into $STOCKADE_STATE_DIR/certs, one line per identity."""
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(tmp_path / "state"))
    result = CliRunner().invoke(app, ["certs", "init"])
    assert result.exit_code == 0, result.output
    assert len(lines(result.output)) == 12
    assert lines(result.output)[0].startswith("cluster CA: ")
    assert (tmp_path / "state" / "certs" / "cp-3.key").exists()


def test_cli_init_twice_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """A second init names the existing CA on one line and exits 2."""
    CliRunner().invoke(app, ["certs", "init", "--dir", str(tmp_path)])
    result = CliRunner().invoke(app, ["certs", "init", "--dir", str(tmp_path)])
    assert result.exit_code == EXIT_INVALID
    assert len(lines(result.output)) == 1
    assert "ca.crt" in result.output and "refusing to overwrite" in result.output


def test_cli_issues_a_fleet_certificate_and_shows_its_workers(cluster: CertDir) -> None:
    """issue --workers writes a fleet's client pair, saying so; show lists one URI per worker
    and no host."""
    runner = CliRunner()
    args = ["certs", "issue", "--role", "worker", "--id", "fleet-7", "--workers", "w-71,w-72"]
    result = runner.invoke(app, [*args, "--dir", str(cluster.path)])
    assert result.exit_code == 0, result.output
    assert lines(result.output)[0].startswith("worker fleet-7 (fleet certificate for 2 workers): ")
    shown = runner.invoke(app, ["certs", "show", str(cluster.cert("fleet-7"))])
    assert shown.exit_code == 0, shown.output
    fields = dict(line.split(":", 1) for line in lines(shown.output))
    assert fields["uris"].strip() == "spiffe://stockade/worker/w-71, spiffe://stockade/worker/w-72"
    assert fields["dns names"].strip() == "-"


def test_cli_issue_and_show(cluster: CertDir) -> None:
    """issue writes a worker's pair; show prints its role, id, SANs and validity."""
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "certs",
            "issue",
            "--role",
            "worker",
            "--id",
            "w-70",
            "--host",
            "n70.example",
            "--dir",
            str(cluster.path),
        ],
    )
    assert result.exit_code == 0, result.output
    assert lines(result.output)[0].startswith("worker w-70: ")
    shown = runner.invoke(app, ["certs", "show", str(cluster.cert("w-70"))])
    assert shown.exit_code == 0, shown.output
    fields = dict(line.split(":", 1) for line in lines(shown.output))
    assert fields["role"].strip() == "worker"
    assert fields["id"].strip() == "w-70"
    assert fields["dns names"].strip() == "localhost, n70.example"
    assert fields["uris"].strip() == "spiffe://stockade/worker/w-70"
    assert "valid until" in fields


@pytest.mark.parametrize(
    "args",
    [
        ["--role", "admin", "--id", "x"],
        ["--role", "worker", "--id", "-bad"],
        ["--role", "worker", "--id", "w-71", "--host", "not a host"],
    ],
)
def test_cli_issue_bad_input_is_one_line_and_exit_2(cluster: CertDir, args: list[str]) -> None:
    """An unknown role, a bad id or a bad host: one line, exit 2, nothing written."""
    before = sorted(cluster.path.iterdir())
    result = CliRunner().invoke(app, ["certs", "issue", *args, "--dir", str(cluster.path)])
    assert result.exit_code == EXIT_INVALID
    assert len(lines(result.output)) == 1 and lines(result.output)[0].startswith("error: ")
    assert sorted(cluster.path.iterdir()) == before


def test_cli_issues_a_user_certificate_whose_id_is_its_account(cluster: CertDir) -> None:
    """``--role user --id alice``: a client certificate naming user/alice, whose account is alice."""
    runner = CliRunner()
    args = ["certs", "issue", "--role", "user", "--id", "alice", "--dir", str(cluster.path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert lines(result.output)[0].startswith("user alice: ")
    assert identity_of(load(cluster.cert("alice"))) == Identity(role="user", id="alice")
    shown = runner.invoke(app, ["certs", "show", str(cluster.cert("alice"))])
    fields = dict(line.split(":", 1) for line in lines(shown.output))
    assert (fields["role"].strip(), fields["id"].strip(), fields["account"].strip()) == (
        "user",
        "alice",
        "alice",
    )
    assert fields["uris"].strip() == "spiffe://stockade/user/alice"
    assert fields["dns names"].strip() == "-"


def test_cli_issues_a_viewer_scoped_to_an_account(cluster: CertDir) -> None:
    """``--role viewer --account alice``: the account rides in the identity URI's path."""
    args = ["certs", "issue", "--role", "viewer", "--id", "v-alice", "--account", "alice"]
    result = CliRunner().invoke(app, [*args, "--dir", str(cluster.path)])
    assert result.exit_code == 0, result.output
    assert lines(result.output)[0].startswith("viewer v-alice (account alice): ")
    identity = identity_of(load(cluster.cert("v-alice")))
    assert identity == Identity(role="viewer", id="v-alice", account="alice")
    assert identity.uri == "spiffe://stockade/viewer/v-alice/account/alice"
    assert identity.scope == "alice"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--role", "admin", "--id", "x"],
            "error: role must be one of control-plane, worker, database, operator, viewer, user, got 'admin'",
        ),
        (
            ["--role", "user", "--id", "al ice"],
            "error: id must be 1-64 characters of A-Z a-z 0-9 . _ - starting with a letter or digit, "
            "got 'al ice'",
        ),
        (
            ["--role", "viewer", "--id", "v-9", "--account", "-alice"],
            "error: account must be 1-64 characters of A-Z a-z 0-9 . _ - starting with a letter or digit, "
            "got '-alice'",
        ),
        (
            ["--role", "user", "--id", "bob", "--account", "alice"],
            "error: account is only for viewer certificates, not user (a user's account is its --id; an "
            "operator acts on every account), got 'alice'",
        ),
    ],
)
def test_cli_issue_names_the_field_the_value_and_the_rule(
    cluster: CertDir, args: list[str], message: str
) -> None:
    """A bad role, a user id or account that breaks the id rules, or --account for a role that
    cannot take it: one line naming the field, the value and the rule; exit 2, nothing written."""
    before = sorted(cluster.path.iterdir())
    result = CliRunner().invoke(app, ["certs", "issue", *args, "--dir", str(cluster.path)])
    assert result.exit_code == EXIT_INVALID
    assert lines(result.output) == [message]
    assert sorted(cluster.path.iterdir()) == before


def test_cli_issue_without_a_ca_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """issue into a folder with no CA says to run init; exit 2; nothing written."""
    result = CliRunner().invoke(
        app, ["certs", "issue", "--role", "worker", "--id", "w-1", "--dir", str(tmp_path)]
    )
    assert result.exit_code == EXIT_INVALID
    assert lines(result.output) == [
        f"error: no cluster CA in {tmp_path} (ca.crt and ca.key); create one with `stockade certs init`"
    ]
    assert list(tmp_path.iterdir()) == []


def test_cli_issue_with_an_exposed_ca_key_exits_1(tmp_path: Path) -> None:
    """A CA key others can read: one line naming it, exit 1."""
    init_cluster(tmp_path)
    (tmp_path / "ca.key").chmod(0o604)
    result = CliRunner().invoke(
        app, ["certs", "issue", "--role", "worker", "--id", "w-9", "--dir", str(tmp_path)]
    )
    assert result.exit_code == EXIT_UNAVAILABLE
    assert len(lines(result.output)) == 1 and "ca.key" in result.output


def test_cli_show_a_file_that_is_not_a_certificate(tmp_path: Path) -> None:
    """show on a non-certificate or a missing file: one line, exit 2."""
    junk = tmp_path / "junk.crt"
    junk.write_text("hello\n")
    for path in (junk, tmp_path / "missing.crt"):
        result = CliRunner().invoke(app, ["certs", "show", str(path)])
        assert result.exit_code == EXIT_INVALID
        assert len(lines(result.output)) == 1 and str(path) in result.output


def test_a_client_certificate_that_looks_valid_has_no_diagnosis(cluster: CertDir) -> None:
    """The operator's certificate, issued by the folder's CA and current, is not blamed."""
    assert diagnose_client_cert(cluster.ca_cert, cluster.cert("operator")) is None


def test_an_expired_or_foreign_client_certificate_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A certificate past its end, one not valid yet, and one another CA issued are each named
    with the reason a server refuses it."""
    folder, other = tmp_path / "c", tmp_path / "other"
    init_cluster(folder)
    init_cluster(other)
    real_now = certs_module._now()
    monkeypatch.setattr(certs_module, "_now", lambda: real_now - datetime.timedelta(days=400))
    issue(folder, role="operator", id="old")
    monkeypatch.setattr(certs_module, "_now", lambda: real_now + datetime.timedelta(days=2))
    issue(folder, role="operator", id="future")
    monkeypatch.setattr(certs_module, "_now", lambda: real_now)
    expired = diagnose_client_cert(folder / "ca.crt", folder / "old.crt")
    assert expired is not None and re.search(r"old\.crt expired on \d{4}-\d\d-\d\d", expired)
    future = diagnose_client_cert(folder / "ca.crt", folder / "future.crt")
    assert future is not None and "future.crt is valid only from" in future
    foreign = diagnose_client_cert(folder / "ca.crt", other / "operator.crt")
    assert (
        foreign
        == f"the client certificate {other / 'operator.crt'} was not issued by the CA in {folder / 'ca.crt'}"
    )


def test_an_unreachable_cluster_names_an_expired_client_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When no control plane answers and the client's certificate has expired (a TLS 1.3 server
    refuses it after the client's side of the handshake, so the client sees only lost
    connections), the one line says so."""
    folder = tmp_path / "c"
    init_cluster(folder)
    (folder / "operator.crt").unlink()
    (folder / "operator.key").unlink()
    real_now = certs_module._now()
    monkeypatch.setattr(certs_module, "_now", lambda: real_now - datetime.timedelta(days=400))
    issue(folder, role="operator", id="operator")
    monkeypatch.setattr(certs_module, "_now", lambda: real_now)
    monkeypatch.setenv("STOCKADE_CERTS_DIR", str(folder))
    message = unreachable_message(
        NoControlPlaneReachable(
            "no control plane answered",
            addresses=["127.0.0.1:9"],
            failures=[Unavailable("127.0.0.1:9 unreachable: connection lost")],
        )
    )
    assert "Likely why: the client certificate" in message and "operator.crt expired on" in message


def test_cli_issue_finds_the_recorded_clusters_ca_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run from a folder that holds no cluster, ``certs issue`` writes into the CA folder of
    the cluster the user config records (where client commands go), not ``./.stockade``."""
    from ops.config import record_local_cluster

    cluster = tmp_path / "cluster"
    CliRunner().invoke(app, ["certs", "init", "--dir", str(cluster / "certs")])
    (cluster / "cluster.json").write_text(f'{{"cert_dir": "{cluster / "certs"}", "processes": []}}')
    record_local_cluster(cluster)
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(tmp_path / "elsewhere"))
    result = CliRunner().invoke(app, ["certs", "issue", "--role", "user", "--id", "alice"])
    assert result.exit_code == 0, result.output
    assert (cluster / "certs" / "alice.crt").exists()
    assert not (tmp_path / "elsewhere").exists()
