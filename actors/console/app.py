"""The console's web application: pages, their parts, the login check and CORS (Starlette).

Every page is a shell that holds no data; its script fetches the page's part with the login
token and refreshes it. What a part answers, how a page moves to another replica's console, and
what keeps it safe: docs/design.md, "The console's pages".
"""

from __future__ import annotations

import importlib.resources
import json
import math
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import jinja2
import trio
from cryptography import x509
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from actors.console import views
from actors.console.store import ConsoleStore, DatabaseDown
from actors.console.usage import (
    JOB_NO_USAGE,
    USAGE_SAMPLES_SHOWN,
    USAGE_SPAN_S,
    WORKER_NO_USAGE,
    usage_values,
)
from actors.logs import LogRelay, log_source
from actors.queries import console as q
from actors.queries import job_spec_of
from protocol import pb
from runtime import identifiers, log, validation
from runtime.console_token import TokenRefused, audience_of, verify_token
from runtime.errors import Busy, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from runtime.settings.control_plane import ConsoleSettings
from runtime.tls import Identity

__all__ = ["ConsoleApp", "TokenCheck", "build_app"]

ELECTIONS_SHOWN = 10
"""Elections the cluster page lists."""
WORKER_ASSIGNMENTS_SHOWN = 50
"""Assignments a worker's page lists."""
MAX_FILTER_CHARS = 200
"""Longest ``name`` or ``worker`` filter the jobs page takes."""
REFUSAL_LOG_EVERY_S = 60.0
"""At most one log line per reason of refused logins in this many seconds."""
PAGE_FAILED = "this page failed; the replica's log says why"


@attrs.define
class TokenCheck:
    """Checks the login tokens of requests (:mod:`runtime.console_token`) against the cluster CA.

    Args:
        ca_pem: the cluster CA's certificate, PEM.
        max_lifetime_s: the longest token lifetime accepted, in seconds.
        clock: the wall clock, Unix seconds.
    """

    ca_pem: bytes
    max_lifetime_s: float
    clock: Callable[[], float] = time.time
    _ca: x509.Certificate = attrs.field(init=False)
    _audience: str = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._ca = x509.load_pem_x509_certificate(self.ca_pem)
        self._audience = audience_of(self.ca_pem)

    def identity(self, authorization: str | None) -> Identity:
        """Who an ``Authorization`` header's bearer token names.

        Raises:
            TokenRefused: no bearer token, or one :func:`runtime.console_token.verify_token` refuses.
        """
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise TokenRefused("the request carries no login token")
        claims = verify_token(
            token.strip(),
            ca=self._ca,
            audience=self._audience,
            now_unix_s=self.clock(),
            max_lifetime_s=self.max_lifetime_s,
        )
        return claims.identity


@attrs.frozen(kw_only=True)
class Part:
    """A page part to answer: its HTTP status, template and values."""

    status: int
    template: str
    values: dict[str, Any]


class PageStatus(Exception):
    """A part ends early with an answer of its own (404, 400)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


PageFn = Callable[[Request], Awaitable[Part]]


def _scope(request: Request) -> str | None:
    """The one account whose jobs the page's reader may see (None: all), set by
    :meth:`ConsoleApp._part` from the reader's login token."""
    return getattr(request.state, "scope", None)


def _page_part(template: str, status: int = 200, **values: Any) -> Part:
    return Part(status=status, template=f"parts/{template}.html", values=values)


@attrs.define
class ConsoleApp:
    """The console of one replica: ``own_url`` its origin (``https://127.0.0.1:7301``),
    ``tokens`` None for no login (a cluster run with ``--insecure``), ``clock`` the wall clock."""

    cp_id: str
    own_url: str
    store: ConsoleStore
    settings: ConsoleSettings
    tokens: TokenCheck | None
    logs: LogRelay
    ring: views.PackingRing
    clock: Callable[[], float] = time.time
    consoles: list[tuple[str, str]] = attrs.field(factory=list)
    """(replica id, console origin) of the replicas seen lately, as last read."""
    _env: jinja2.Environment = attrs.field(init=False)
    _static: dict[str, tuple[bytes, str]] = attrs.field(init=False)
    _refusals_logged_at: dict[str, float] = attrs.field(factory=dict)
    _log: Any = attrs.field(factory=lambda: log.get("console"))

    def __attrs_post_init__(self) -> None:
        self._env = jinja2.Environment(
            loader=jinja2.PackageLoader("actors.console", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self._env.filters.update(duration=views.duration, clock=views.clock, job_name=views.job_name)
        for name in self._env.list_templates():
            self._env.get_template(name)  # compiled now, not on a page's first request
        folder = importlib.resources.files("actors.console") / "static"
        self._static = {
            "console.js": ((folder / "console.js").read_bytes(), "text/javascript; charset=utf-8"),
            "console.css": ((folder / "console.css").read_bytes(), "text/css; charset=utf-8"),
        }

    def allowed_origins(self) -> set[str]:
        """The origins whose pages may read this console's parts: every known console's."""
        return {self.own_url, *(url for _, url in self.consoles)}

    def _security_headers(self, *, connect: str = "'self'") -> dict[str, str]:
        return {
            "Content-Security-Policy": (
                f"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                f"connect-src {connect}; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
            ),
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-store",
        }

    def _cors_headers(self, request: Request) -> dict[str, str]:
        origin = request.headers.get("origin")
        if origin is None or origin not in self.allowed_origins():
            return {"Vary": "Origin"}
        return {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Expose-Headers": "X-Stockade-Served-By, X-Stockade-Consoles",
            "Vary": "Origin",
        }

    def render(self, template: str, **values: Any) -> str:
        """``template`` rendered with ``values`` (autoescaped)."""
        return self._env.get_template(template).render(**values)

    def _shell(self, request: Request) -> Response:
        # Any port of the consoles' hosts: a page must reach the consoles of replicas its own
        # learns of after it was served (a console just started knows only itself), or it
        # cannot move when its own console dies.
        connect = " ".join(sorted({_any_port(origin) for origin in self.allowed_origins()}))
        html = self.render(
            "shell.html",
            cp_id=self.cp_id,
            refresh_ms=int(self.settings.refresh_interval_s * 1000),
            login=self.tokens is not None,
            path=request.url.path,
        )
        return HTMLResponse(html, headers=self._security_headers(connect=f"'self' {connect}"))

    def _refused(self, reason: str) -> Part:
        now = trio.current_time()
        if now - self._refusals_logged_at.get(reason, -math.inf) >= REFUSAL_LOG_EVERY_S:
            self._refusals_logged_at[reason] = now
            self._log.warning("console refused a request", reason=reason)
        return _page_part("unauthorized", 401, reason=reason)

    async def _part(self, request: Request, page: PageFn) -> Response:
        cors = self._cors_headers(request)
        if request.method == "OPTIONS":
            return Response(
                status_code=204,
                headers={
                    **cors,
                    "Access-Control-Allow-Methods": "GET",
                    "Access-Control-Allow-Headers": "Authorization",
                    "Access-Control-Max-Age": "600",
                },
            )
        identity: Identity | None = None
        try:
            if self.tokens is not None:
                identity = self.tokens.identity(request.headers.get("authorization"))
            # A user, or a viewer scoped to an account, sees that account's jobs only.
            request.state.scope = identity.scope if identity is not None else None
            part = await page(request)
        except TokenRefused as exc:
            part = self._refused(str(exc))
        except PageStatus as exc:
            part = _page_part("status", exc.status, message=exc.message)
        except DatabaseDown as exc:
            down_for_s = self.clock() - exc.since_unix_s
            part = _page_part(
                "down", 503, error=str(exc), since_unix_s=exc.since_unix_s, down_for_s=down_for_s
            )
        except Exception as exc:  # a bug: one log line, a 500 part, no traceback to the server's log
            self._log.error(
                "console page failed", path=request.url.path, error=f"{type(exc).__name__}: {exc}"
            )
            part = _page_part("status", 500, message=PAGE_FAILED)
        html = self.render(
            part.template,
            **part.values,
            cp_id=self.cp_id,
            identity=identity,
            login=self.tokens is not None,
            status=part.status,
        )
        return HTMLResponse(
            html,
            status_code=part.status,
            headers={
                **self._security_headers(),
                **cors,
                "X-Stockade-Served-By": self.cp_id,
                "X-Stockade-Consoles": json.dumps([{"id": i, "url": u} for i, u in self.consoles]),
            },
        )

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        message = f"no page at {request.url.path}" if status == 404 else str(getattr(exc, "detail", ""))
        html = self.render("error.html", cp_id=self.cp_id, status=status, message=message)
        return HTMLResponse(html, status_code=status, headers=self._security_headers())

    async def _server_error(self, request: Request, exc: Exception) -> Response:
        self._log.error("console page failed", path=request.url.path, error=f"{type(exc).__name__}: {exc}")
        html = self.render("error.html", cp_id=self.cp_id, status=500, message=PAGE_FAILED)
        return HTMLResponse(html, status_code=500, headers=self._security_headers())

    def _static_file(self, name: str) -> Response:
        body, media_type = self._static[name]
        return Response(body, media_type=media_type, headers={"X-Content-Type-Options": "nosniff"})

    async def cluster(self, request: Request) -> Part:
        async def reads(conn: Any) -> tuple[Any, ...]:
            return (
                await conn.fetchrow(q.CONSOLE_LEASE),
                await conn.fetch(q.CONSOLE_CONTROL_PLANES),
                await conn.fetch(q.CONSOLE_ELECTIONS, ELECTIONS_SHOWN),
                await conn.fetch(q.CONSOLE_JOB_COUNTS, _scope(request)),
            )

        lease, cps, elections, counts = await self.store.read(reads)
        leader = lease["holder"] if lease is not None and lease["live"] else None
        replicas = [
            {**dict(row), "role": "leader" if row["id"] == leader else "standby" if row["up"] else "down"}
            for row in cps
        ]
        return _page_part(
            "cluster",
            lease=lease,
            leader=leader,
            replicas=replicas,
            elections=elections,
            job_counts=views.job_counts(counts),
        )

    def _worker_view(self, row: Any) -> dict[str, Any]:
        return {
            **dict(row),
            "shown_state": views.worker_state(row),
            "cpu": views.bar(int(row["cpu_allocated_millis"]), int(row["cpu_millis"]), "m"),
            "memory": views.bar(int(row["memory_allocated_mb"]), int(row["memory_mb"]), "MiB"),
            "label_pairs": views.labels_of(row["labels"]),
            "devices": views.devices_of(row.get("resources"), row.get("units_in_use")),
        }

    async def workers(self, request: Request) -> Part:
        rows = await self.store.read(lambda conn: conn.fetch(q.CONSOLE_WORKERS))
        return _page_part("workers", workers=[self._worker_view(r) for r in rows])

    async def worker(self, request: Request) -> Part:
        worker_id = request.path_params["worker_id"]
        try:
            identifiers.check_id(worker_id, field="worker_id")
        except InvalidArgument:
            raise PageStatus(404, f"no worker {worker_id!r}: not a worker id") from None

        async def reads(conn: Any) -> tuple[Any, Any, Any]:
            row = await conn.fetchrow(q.CONSOLE_WORKER, worker_id)
            if row is None:
                return None, [], None
            return (
                row,
                await conn.fetch(
                    q.CONSOLE_WORKER_ASSIGNMENTS, worker_id, WORKER_ASSIGNMENTS_SHOWN, _scope(request)
                ),
                await conn.fetchrow(q.CONSOLE_WORKER_USAGE, worker_id, USAGE_SPAN_S, USAGE_SAMPLES_SHOWN),
            )

        row, runs, used = await self.store.read(reads)
        if row is None:
            raise PageStatus(404, f"no worker {worker_id!r} has registered with this cluster")
        return _page_part(
            "worker",
            worker=self._worker_view(row),
            runs=runs,
            **usage_values(used, of="all its command jobs together", none=WORKER_NO_USAGE),
        )

    async def jobs(self, request: Request) -> Part:
        state = request.query_params.get("state", "")
        name = request.query_params.get("name", "")[:MAX_FILTER_CHARS]
        worker = request.query_params.get("worker", "")[:MAX_FILTER_CHARS]
        filters = {"state": state, "name": name, "worker": worker}
        for field, value in (("name", name), ("worker", worker)):
            if "\x00" in value:
                raise PageStatus(400, f"the {field} filter may not hold a NUL character, got {value!r}")
        if state and state not in validation.JOB_STATES:
            raise PageStatus(400, f"no job state {state!r}: one of {', '.join(validation.JOB_STATES)}")

        scope = _scope(request)

        async def reads(conn: Any) -> tuple[Any, Any]:
            return (
                await conn.fetch(q.CONSOLE_JOBS, state, name, worker, q.MAX_JOBS_LISTED, scope),
                await conn.fetch(q.CONSOLE_JOB_COUNTS, scope),
            )

        rows, counts = await self.store.read(reads)
        return _page_part(
            "jobs",
            jobs=rows,
            filters=filters,
            states=validation.JOB_STATES,
            job_counts=views.job_counts(counts),
            limit=q.MAX_JOBS_LISTED,
        )

    async def job(self, request: Request) -> Part:
        text = request.path_params["job_id"]
        job_id = int(text) if text.isascii() and text.isdigit() and len(text) <= 19 else 0
        if not 0 < job_id <= validation.MAX_ID:
            raise PageStatus(404, f"no job {text!r}: not a job id")

        scope = _scope(request)

        async def reads(conn: Any) -> tuple[Any, Any, Any, Any]:
            row = await conn.fetchrow(q.CONSOLE_JOB, job_id, scope)
            if row is None:
                return None, [], None, None
            return (
                row,
                await conn.fetch(q.CONSOLE_JOB_ATTEMPTS, job_id),
                await conn.fetchrow(q.CONSOLE_LOG_SOURCE, job_id, 0, scope),  # 0: its newest run that started
                await conn.fetchrow(q.CONSOLE_JOB_USAGE, job_id, USAGE_SPAN_S, USAGE_SAMPLES_SHOWN),
            )

        row, attempts, source_row, used = await self.store.read(reads)
        if row is None:
            raise PageStatus(404, f"no job {job_id} in this cluster")
        # The environment's values never reach a template: a console reader may be a viewer.
        spec = job_spec_of(row).env_values_hidden()
        outputs, output_note = await self._output_tails(job_id, row["runtime"], source_row)
        job = {key: value for key, value in row.items() if key != "env"}
        return _page_part(
            "job",
            job=job,
            spec=spec,
            attempts=attempts,
            outputs=outputs,
            output_note=output_note,
            **usage_values(
                used,
                of="its runs",
                none=JOB_NO_USAGE,
                cpu_asked_millis=spec.cpu_millis,
                memory_asked_mb=spec.memory_mb,
            ),
        )

    async def _output_tails(
        self, job_id: int, runtime: str, source_row: Any
    ) -> tuple[list[tuple[str, str]], str]:
        """(stream, text) of the last lines of the job's stdout and stderr, and a note saying
        why some or all could not be had (empty when both came). Both streams are read at
        once, within ``output_timeout_s``: the page waits for the slower, not for the sum."""
        if runtime == "sleep":
            return [], "a sleep job writes no output"
        try:
            source = log_source(job_id, source_row)
        except (NotFound, InvalidArgument, FailedPrecondition, Unavailable) as exc:
            return [], str(exc)
        streams = ("stdout", "stderr")
        chunks: dict[str, list[bytes]] = {stream: [] for stream in streams}
        failures: dict[str, str] = {}

        async def read(stream: str) -> None:
            async def send(chunk: Any) -> None:
                chunks[stream].append(bytes(chunk.data))

            request = pb.ReadJobLogsRequest(
                job_id=job_id,
                stream=stream,
                has_tail=True,
                tail_lines=self.settings.output_tail_lines,
                tail_max_bytes=self.settings.output_tail_max_bytes,
            )
            try:
                await self.logs.relay(source, request, send)
            except (Unavailable, FailedPrecondition, Busy) as exc:
                failures[stream] = str(exc)
                return
            done.add(stream)

        done: set[str] = set()
        with trio.move_on_after(self.settings.output_timeout_s) as scope:
            async with trio.open_nursery() as nursery:
                for stream in streams:
                    nursery.start_soon(read, stream)
        outputs = [(s, views.printable(b"".join(chunks[s]))) for s in streams if s in done]
        if scope.cancelled_caught:
            return outputs, (
                f"worker {source.worker_id} at {source.address} sent no output within "
                f"{self.settings.output_timeout_s:g} s"
            )
        return outputs, next((failures[s] for s in streams if s in failures), "")

    async def packing(self, request: Request) -> Part:
        samples = self.ring.samples()
        now = self.clock()
        chart = views.packing_chart(samples, now_unix_s=now, span_s=self.settings.history_s)
        latest = samples[-1] if samples else None
        return _page_part(
            "packing",
            chart=chart,
            latest=latest,
            cpu=latest and views.bar(latest.cpu_allocated_millis, latest.cpu_capacity_millis, "m"),
            memory=latest and views.bar(latest.memory_allocated_mb, latest.memory_capacity_mb, "MiB"),
            latest_age_s=None if latest is None else now - latest.unix_s,
            sample_interval_s=self.settings.sample_interval_s,
            db_down_since=self.store.down_since_unix_s,
        )

    def pages(self) -> list[tuple[str, PageFn]]:
        """(path, page) of every page."""
        return [
            ("/", self.cluster),
            ("/workers", self.workers),
            ("/workers/{worker_id}", self.worker),
            ("/jobs", self.jobs),
            ("/jobs/{job_id}", self.job),
            ("/packing", self.packing),
        ]


def build_app(console: ConsoleApp) -> Starlette:
    """The Starlette application serving ``console``'s pages, parts and static files."""

    def part_route(path: str, page: PageFn) -> Route:
        async def part(request: Request) -> Response:
            return await console._part(request, page)

        return Route("/part" + (path if path != "/" else ""), part, methods=["GET", "OPTIONS"])

    def static_route(name: str) -> Route:
        async def static(request: Request) -> Response:
            return console._static_file(name)

        return Route(f"/static/{name}", static, methods=["GET"])

    async def shell(request: Request) -> Response:
        return console._shell(request)

    routes = []
    for path, page in console.pages():
        routes += [Route(path, shell, methods=["GET"]), part_route(path, page)]
    routes.extend(static_route(name) for name in ("console.js", "console.css"))
    return Starlette(
        routes=routes,
        exception_handlers={404: console._not_found, 405: console._not_found, 500: console._server_error},
    )


def _any_port(origin: str) -> str:
    """A CSP source for every port of ``origin``'s scheme and host (``https://127.0.0.1:17122``
    -> ``https://127.0.0.1:*``; an IPv6 host keeps its brackets)."""
    parts = urllib.parse.urlsplit(origin)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}:*"
