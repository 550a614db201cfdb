"""``stockade console``: each recorded console's URL with a login token in its fragment."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import attrs
import pytest
from cryptography import x509
from typer.testing import CliRunner

from ops.certs import init_cluster
from ops.cli import EXIT_INVALID, app
from ops.cluster import StateDir
from ops.launcher.plan import LaunchOptions, plan
from runtime.console_token import audience_of, verify_token


def record_cluster(root: Path, *, tls: bool) -> StateDir:
    """A cluster.json of three control planes (with consoles) and one worker, under ``root``."""
    state = StateDir(root)
    ports = itertools.count(7000)
    result = plan(
        None,
        state=state,
        database_url="postgresql://db/x",
        pg_port=None,
        control_planes=3,
        workers=1,
        running=(),
        options=LaunchOptions(),
        free_port=ports.__next__,
    )
    state.create()
    cert_dir = root / "certs"
    if tls:
        init_cluster(cert_dir)
    state.save(attrs.evolve(result.config, cert_dir=str(cert_dir) if tls else None))
    return state


def test_it_prints_every_console_with_a_viewers_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With STOCKADE_IDENTITY=viewer each console's URL carries a token the console accepts as
    viewer/viewer, valid for the hours asked."""
    state = record_cluster(tmp_path / "s", tls=True)
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(state.root))
    monkeypatch.setenv("STOCKADE_IDENTITY", "viewer")
    result = CliRunner().invoke(app, ["console", "--lifetime-h", "2"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "#token=" in line]
    consoles = state.load().console_urls()  # type: ignore[union-attr]
    assert [line.partition("/#token=")[0] for line in lines] == list(consoles.values())
    token = lines[0].partition("#token=")[2]
    ca_pem = (state.root / "certs" / "ca.crt").read_bytes()
    claims = verify_token(
        token, ca=x509.load_pem_x509_certificate(ca_pem), audience=audience_of(ca_pem), now_unix_s=time.time()
    )
    assert str(claims.identity) == "viewer/viewer"
    assert 2 * 3600 - 60 < claims.expires_unix_s - time.time() <= 2 * 3600
    assert "login as viewer" in result.output


def test_an_insecure_cluster_gets_plain_urls_and_no_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster run with --insecure has consoles on http://127.0.0.1 and needs no login."""
    state = record_cluster(tmp_path / "s", tls=False)
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(state.root))
    result = CliRunner().invoke(app, ["console"])
    assert result.exit_code == 0, result.output
    assert "#token=" not in result.output
    assert result.output.count("http://127.0.0.1:") == 3 and "no login" in result.output


def test_without_a_known_console_it_says_how_to_name_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No cluster.json and no --url: one line naming --url, exit 1."""
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(tmp_path / "empty"))
    result = CliRunner().invoke(app, ["console"])
    assert result.exit_code == 1
    assert "--url" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("option", "shown"),
    [
        ("notaurl", "notaurl"),
        ("https://", "https://"),
        ("https://cp-b:7301,ftp://cp-a:7301", "ftp://cp-a:7301"),
        ("https://cp-a:99999", "https://cp-a:99999"),
        ("https://cp-a:port", "https://cp-a:port"),
        ("https://cp-a:7301/x", "https://cp-a:7301/x"),
        ("https://cp-a:7301?q=1", "https://cp-a:7301?q=1"),
        ("https://user@cp-a:7301", "https://user@cp-a:7301"),
        (" , ", " , "),
    ],
)
def test_a_url_that_is_not_an_origin_is_refused_naming_it(option: str, shown: str) -> None:
    """``--url`` takes origins only: anything else is one line naming --url, the rule and the
    entry as given, exit 2, before any certificate is read."""
    result = CliRunner().invoke(app, ["console", "--url", option])
    assert result.exit_code == EXIT_INVALID
    assert result.stderr.startswith("error: --url must be origins, comma-separated: ")
    assert result.stderr.endswith(f", got {shown!r}\n")
