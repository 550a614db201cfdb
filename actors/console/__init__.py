"""The web console every replica serves on its ``http_port``: an actor.

:class:`Console` serves the pages of :mod:`actors.console.app` with Hypercorn's trio worker and
samples the cluster's packing every ``sample_interval_s`` into an in-memory ring, refreshing the
list of the other replicas' consoles at the same time. Its pages read; its actions (cancel,
cordon, uncordon, drain) go through the ingest's handlers (:mod:`actors.console.actions`). With
the cluster's TLS files it serves HTTPS and asks for login tokens (:mod:`runtime.console_token`;
docs/console.md); without them it serves plain HTTP on 127.0.0.1 only, with no login.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import attrs
import trio

from actors.console.actions import ConsoleActions
from actors.console.app import ConsoleApp, TokenCheck, build_app
from actors.console.store import ConsoleStore, DatabaseDown
from actors.console.views import PackingRing, PackingSample
from actors.logs import LogRelay
from actors.queries import console as q
from runtime import identifiers, log
from runtime.settings.control_plane import ConsoleSettings, IngestSettings
from runtime.tls import ClientTls, TlsFiles

__all__ = ["INSECURE_HOST", "Console", "console_url"]

INSECURE_HOST = "127.0.0.1"
"""Where a console without TLS listens, whatever the replica's own listen host."""


def console_url(*, listen_host: str, advertise_address: str, http_port: int, tls: bool) -> str:
    """The origin a replica's console answers at: ``https://<host>:<http_port>`` with TLS (the
    host of ``advertise_address`` when given, else ``listen_host``), ``http://127.0.0.1:<port>``
    without."""
    if not tls:
        return f"http://{INSECURE_HOST}:{http_port}"
    host = identifiers.parse_address(advertise_address).host if advertise_address else listen_host
    return f"https://{identifiers.format_address(host, http_port)}"


@attrs.define
class Console:
    """The actor (module docstring).

    Args:
        listen_host: the replica's listen host (used only with TLS).
        advertise_address: the address the replica's ingest is reached at; its host, when
            given, is the console's with TLS (:func:`console_url`).
        tls: the replica's TLS files; None: no TLS, no login.
        clock: the wall clock in Unix seconds.
    """

    cp_id: str
    database_url: str
    listen_host: str
    http_port: int
    advertise_address: str = ""
    settings: ConsoleSettings = attrs.field(factory=ConsoleSettings)
    tls: TlsFiles | None = None
    clock: Callable[[], float] = time.time
    app: ConsoleApp | None = None
    """The application; set once serving."""
    _log: Any = attrs.field(factory=lambda: log.get("console"))

    @property
    def url(self) -> str:
        """This console's origin (:func:`console_url`)."""
        return console_url(
            listen_host=self.listen_host,
            advertise_address=self.advertise_address,
            http_port=self.http_port,
            tls=self.tls is not None,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled.

        Raises:
            TlsFilesInvalid, KeyFileExposed: the replica's TLS files are missing or its key is
                readable by others.
            OSError: the port cannot be bound.
        """
        from hypercorn.config import Config
        from hypercorn.trio import serve

        store = ConsoleStore(self.cp_id, self.database_url, self.settings, self.clock)
        config = Config()
        config.accesslog = None
        config.loglevel = "WARNING"
        config.errorlog = logging.getLogger("hypercorn.error")
        config.graceful_timeout = 0.5
        # HTTP/1.1 only: hypercorn 0.18's HTTP/2 raises out of serve() (KeyError on body data for
        # a stream it has already answered, an error on a malformed HTTP2-Settings header), which
        # crashed the console. Pages need no HTTP/2: none is offered by ALPN, and no connection
        # is switched to it by an upgrade or its preface (_http_1_1_only).
        config.alpn_protocols = ["http/1.1"]
        _http_1_1_only()
        tokens = None
        if self.tls is not None:
            self.tls.check()
            config.certfile, config.keyfile = str(self.tls.cert_path), str(self.tls.key_path)
            config.bind = [identifiers.format_address(self.listen_host, self.http_port)]
            tokens = TokenCheck(self.tls.ca_path.read_bytes(), self.settings.max_token_lifetime_s, self.clock)
        else:
            config.bind = [f"{INSECURE_HOST}:{self.http_port}"]
        logs = LogRelay(self.cp_id, IngestSettings(), None if self.tls is None else ClientTls(self.tls))
        actions = ConsoleActions(
            self.cp_id, self.database_url, logs, open_timeout_s=self.settings.read_timeout_s
        )
        # Built on a thread: compiling the templates takes a few hundred ms of CPU.
        self.app = await trio.to_thread.run_sync(
            partial(
                ConsoleApp,
                cp_id=self.cp_id,
                own_url=self.url,
                store=store,
                settings=self.settings,
                tokens=tokens,
                logs=logs,
                actions=actions,
                ring=PackingRing(size=self.settings.history_samples),
                clock=self.clock,
                consoles=[(self.cp_id, self.url)],
            )
        )
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._sample, self.app)
                await nursery.start(partial(serve, build_app(self.app), config))  # type: ignore[arg-type]
                if tokens is None:
                    self._log.warning(
                        "console serves plain HTTP on 127.0.0.1 with no login (the cluster runs without TLS)",
                        url=self.url,
                    )
                else:
                    self._log.info("console serving", url=self.url)
                task_status.started()
        finally:
            self.app.logs.close()
            await actions.close()
            await store.close()

    async def _sample(self, app: ConsoleApp, *, task_status: trio.TaskStatus[None]) -> None:
        """Every ``sample_interval_s``: the packing sample into the ring (skipped when the
        database does not give it), and the consoles of the replicas seen lately."""
        task_status.started()
        next_at = trio.current_time()
        while True:
            try:
                row, urls = await app.store.read(_sample_reads)
            except DatabaseDown:
                pass
            else:
                app.ring.add(PackingSample.of_row(self.clock(), row))
                app.consoles = [(r["id"], r["console_url"]) for r in urls] or [(self.cp_id, self.url)]
            next_at = max(next_at + self.settings.sample_interval_s, trio.current_time())
            await trio.sleep_until(next_at)


async def _sample_reads(conn: Any) -> tuple[Any, Any]:
    return await conn.fetchrow(q.CONSOLE_PACKING_SAMPLE), await conn.fetch(q.CONSOLE_URLS)


def _http_1_1_only() -> None:
    """Keep every console connection on HTTP/1.1, whatever the client sends.

    Hypercorn 0.18 switches an HTTP/1.1 connection to HTTP/2 when a request asks to upgrade
    (``Upgrade: h2c``, after answering 101) or when the connection opens with HTTP/2's preface,
    whatever ALPN negotiated (``hypercorn.protocol.h11.H11Protocol._check_protocol``). Its
    HTTP/2 side can raise out of ``serve()``, and one request then crashed the console. This
    makes that check a no-op: the upgrade is ignored and the request answered in HTTP/1.1, as
    a server may (RFC 9110, 7.8), and a preface is read as an HTTP/1.1 request, which is
    refused. Applied once; a hypercorn without the method is left as it is (the console tests
    then fail on the upgrade).
    """
    from hypercorn.protocol.h11 import H11Protocol

    if getattr(H11Protocol, "_stockade_http_1_1_only", False) or not hasattr(H11Protocol, "_check_protocol"):
        return

    async def stay_on_http_1_1(self: Any, event: Any) -> None:
        return None

    H11Protocol._check_protocol = stay_on_http_1_1  # type: ignore[method-assign]
    H11Protocol._stockade_http_1_1_only = True  # type: ignore[attr-defined]
