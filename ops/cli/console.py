"""``stockade console``: the URLs of the cluster's web consoles, each with a login token made
with the client certificate (docs/design.md, "stockade console").
"""

from __future__ import annotations

import time
from typing import Annotated

import typer

from ops.cli.base import app
from ops.cli.common import EXIT_INVALID, client_tls, console, errors, fail, recorded_local_state
from runtime.errors import InvalidArgument

MAX_LIFETIME_H = 12.0
"""The longest a token may live, in hours (``runtime.console_token.MAX_LIFETIME_S``; a unit test
keeps them equal)."""


ORIGIN_RULE = (
    "must be origins, comma-separated: http:// or https://, a host and at most a port, "
    "such as https://cp-a.example:7301"
)


def _check_origin(url: str, *, shown: str) -> None:
    """Refuse ``url`` (``shown`` as given) unless it is an origin: ``http`` or ``https``, a
    host, a valid port at most; no path, query, fragment or credentials."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # a port that is no number or out of range
        port_ok = False
        parts = urlsplit("")
    if not (
        port_ok
        and parts.scheme in ("http", "https")
        and parts.hostname
        and "@" not in parts.netloc
        and not (parts.path or parts.query or parts.fragment)
    ):
        raise InvalidArgument("--url", shown, ORIGIN_RULE)


def console_urls(option: str | None) -> list[str]:
    """The consoles to print: ``option`` (comma-separated origins: else InvalidArgument), else
    those the local cluster's record names (ClusterError where none is known)."""
    from ops.config import ClusterError

    if option is not None:
        given = [u.strip() for u in option.split(",") if u.strip()]
        if not given:
            raise InvalidArgument("--url", option, ORIGIN_RULE)
        for url in given:
            _check_origin(url.removesuffix("/"), shown=url)
        return [url.removesuffix("/") for url in given]
    state = recorded_local_state()
    config = state.load() if state.config_path.exists() else None
    urls = list(config.console_urls().values()) if config is not None else []
    if not urls:
        raise ClusterError(
            "no console is known: `stockade up` records its control planes' consoles; for another "
            "cluster pass --url https://<control plane>:<its --http-port>"
        )
    return urls


@app.command("console")
def console_command(
    url: Annotated[
        str | None,
        typer.Option(help="The consoles' origins, comma-separated (default: the local cluster's)."),
    ] = None,
    lifetime_h: Annotated[
        float,
        typer.Option(min=0.01, max=MAX_LIFETIME_H, help="Hours the login token stays valid (at most 12)."),
    ] = MAX_LIFETIME_H,
) -> None:
    """Print the URL of each control plane's web console with a login token.

    The token is signed with your client certificate's key (an operator, viewer or user
    certificate of the cluster CA, as other client commands present; a user, or a viewer scoped
    to an account, sees that account's jobs only) and lets whoever holds the URL read
    the console until it expires: open it in your browser, do not share it. Without TLS
    (--insecure) the consoles need no login and listen on 127.0.0.1 only."""
    from runtime.console_token import TokenRefused, make_token

    with errors():
        urls = console_urls(url)
        files = client_tls()
        if files is None:
            for each in urls:
                console().print(f"{each}/", markup=False, soft_wrap=True)
            console().print("no login: the cluster runs without TLS (--insecure)", markup=False)
            return
        now_s = time.time()
        try:
            token = make_token(files, now_unix_s=now_s, lifetime_s=lifetime_h * 3600)
        except TokenRefused as exc:
            fail(f"{files.cert_path}: {exc}", EXIT_INVALID)
    expires = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now_s + lifetime_h * 3600))
    for each in urls:
        console().print(f"{each}/#token={token}", markup=False, soft_wrap=True)
    console().print(
        f"login as {files.cert_path.stem} ({files.cert_path}), valid until {expires}; the first URL is "
        "enough: an open page moves to another console when its own stops answering. The browser "
        f"must trust the cluster CA ({files.ca_path}) or be told to accept the consoles' certificates.",
        markup=False,
        soft_wrap=True,
    )
