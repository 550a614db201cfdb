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
from collections.abc import Callable
from typing import Any

import attrs
import jinja2
import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from actors.console import output, views
from actors.console.actions import ACTIONS, ConsoleActions, localhost_alias, read_body
from actors.console.login import TokenCheck
from actors.console.parts import PageFn, PageStatus, Part, job_id_param, page_part, scope_of
from actors.console.store import ConsoleStore, DatabaseDown
from actors.console.usage import (
    JOB_NO_USAGE,
    USAGE_SAMPLES_SHOWN,
    USAGE_SPAN_S,
    WORKER_NO_USAGE,
    usage_values,
)
from actors.logs import LogRelay
from actors.queries import console as q
from actors.queries import job_spec_of
from runtime import identifiers, log, validation
from runtime.aio import Caller
from runtime.console_token import TokenRefused
from runtime.errors import (
    InvalidArgument,
)
from runtime.settings.control_plane import ConsoleSettings
from runtime.tls import Identity

__all__ = ["ConsoleApp", "TokenCheck", "build_app"]

ELECTIONS_SHOWN = 10
"""Elections the cluster page lists."""
WORKER_ASSIGNMENTS_SHOWN = 50
"""Assignments a worker's page lists."""
MAX_FILTER_CHARS = 200
"""Longest ``name`` or ``worker`` filter the jobs page takes."""
JOBS_PER_PAGE = 50
"""Jobs one page of the jobs page lists (newest first; older and newer ones a link away)."""
OUTPUT_PAGE_BYTES = 64 * 1024
"""Bytes of one stream an output page shows."""
DOWNLOAD_TIMEOUT_S = 60.0
"""Longest a download of a whole stream waits for its worker, in seconds."""
ACTION_HEADER = "X-Stockade-Action"
"""The header every action request carries (a form of another site cannot set it)."""
REFUSAL_LOG_EVERY_S = 60.0
"""At most one log line per reason of refused logins in this many seconds."""
PAGE_FAILED = "this page failed; the replica's log says why"


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
    actions: ConsoleActions | None = None
    """Carries out the pages' actions; None: the console only reads."""
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
        self._env.filters.update(
            duration=views.duration, clock=views.clock, job_name=views.job_name, size=views.size
        )
        for name in self._env.list_templates():
            self._env.get_template(name)  # compiled now, not on a page's first request
        folder = importlib.resources.files("actors.console") / "static"
        self._static = {
            "console.js": ((folder / "console.js").read_bytes(), "text/javascript; charset=utf-8"),
            "console.css": ((folder / "console.css").read_bytes(), "text/css; charset=utf-8"),
        }

    def allowed_origins(self) -> set[str]:
        """The origins whose pages may read this console's parts: every known console's, and a
        loopback one's also as ``localhost`` (the certificates name it; the same machine)."""
        urls = {self.own_url, *(url for _, url in self.consoles)}
        return urls | {alias for url in urls if (alias := localhost_alias(url)) is not None}

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

    def _preflight(self, request: Request, methods: str, headers: str) -> Response:
        """The answer to a CORS preflight (``OPTIONS``): allowed for the cluster's consoles only."""
        return Response(
            status_code=204,
            headers={
                **self._cors_headers(request),
                "Access-Control-Allow-Methods": methods,
                "Access-Control-Allow-Headers": headers,
                "Access-Control-Max-Age": "600",
            },
        )

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
        return page_part("unauthorized", 401, reason=reason)

    async def _part(self, request: Request, page: PageFn) -> Response:
        cors = self._cors_headers(request)
        if request.method == "OPTIONS":
            return self._preflight(request, "GET", "Authorization")
        identity: Identity | None = None
        try:
            identity = self._identity(request)
            part = await page(request)
        except TokenRefused as exc:
            part = self._refused(str(exc))
        except PageStatus as exc:
            part = page_part("status", exc.status, message=exc.message)
        except DatabaseDown as exc:
            down_for_s = self.clock() - exc.since_unix_s
            part = page_part(
                "down", 503, error=str(exc), since_unix_s=exc.since_unix_s, down_for_s=down_for_s
            )
        except Exception as exc:  # a bug: one log line, a 500 part, no traceback to the server's log
            self._log.error(
                "console page failed", path=request.url.path, error=f"{type(exc).__name__}: {exc}"
            )
            part = page_part("status", 500, message=PAGE_FAILED)
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

    def _identity(self, request: Request) -> Identity | None:
        """Who the request's login token names (None: no login, a cluster run with
        ``--insecure``); sets the request's account scope (a user, or a viewer scoped to an
        account, sees that account's jobs only). Raises TokenRefused."""
        identity = None if self.tokens is None else self.tokens.identity(request.headers.get("authorization"))
        request.state.scope = identity.scope if identity is not None else None
        return identity

    def _cross_site(self, request: Request) -> str | None:
        """Why a request that changes something is refused as cross-site (None: it is not): it
        must come from a page of this cluster's consoles (``Origin``) and carry
        :data:`ACTION_HEADER`, which no form of another site can set."""
        origin = request.headers.get("origin")
        if origin is None or origin not in self.allowed_origins():
            return f"cross-site request refused: origin {origin or '(none)'} is not a console of this cluster"
        if request.headers.get(ACTION_HEADER) != "1":
            return f"cross-site request refused: no {ACTION_HEADER} header"
        return None

    async def action(self, request: Request) -> Response:
        """``POST /action/{kind}/{target}/{action}``: one action of :data:`ACTIONS`, answered
        with a part saying what it did or why it was refused (docs/console.md, "Actions")."""
        cors = self._cors_headers(request)
        if request.method == "OPTIONS":
            return self._preflight(request, "POST", f"Authorization, Content-Type, {ACTION_HEADER}")
        kind, target, name = (request.path_params[k] for k in ("kind", "target", "action"))
        status, ok, message = 200, False, ""
        refusal = self._cross_site(request)
        if refusal is not None:
            self._refused(refusal)
            status, message = 403, refusal
        # An action acts on what its RPC names: cancel_job on /action/jobs/..., *_worker on
        # /action/workers/...; an unknown action matches no kind.
        elif self.actions is None or kind != ACTIONS.get(name, "").partition("_")[2] + "s":
            status, message = 404, f"no action {name!r} on {kind}"
        else:
            status, ok, message = await self._act(request, name, target)
        html = self.render(
            "parts/action_result.html", ok=ok, message=message, action=name, target=target, status=status
        )
        return HTMLResponse(html, status_code=status, headers={**self._security_headers(), **cors})

    async def _act(self, request: Request, name: str, target: str) -> tuple[int, bool, str]:
        """(HTTP status, done, what it did or why not) of action ``name`` on ``target``."""
        assert self.actions is not None
        try:
            identity = self._identity(request)
        except TokenRefused as exc:
            return 401, False, f"not logged in: {exc}"
        client = request.client
        address = f"{client.host}:{client.port}" if client else "-"
        caller = Caller(address=address, secure=self.tokens is not None, identity=identity)
        return await self.actions.answer(caller, name, target, lambda: read_body(request))

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
                await conn.fetch(q.CONSOLE_JOB_COUNTS, scope_of(request)),
            )

        lease, cps, elections, counts = await self.store.read(reads)
        leader = lease["holder"] if lease is not None and lease["live"] else None
        replicas = [
            {**dict(row), "role": "leader" if row["id"] == leader else "standby" if row["up"] else "down"}
            for row in cps
        ]
        return page_part(
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
        return page_part("workers", workers=[self._worker_view(r) for r in rows])

    async def worker(self, request: Request) -> Part:
        worker_id = request.path_params["worker_id"]
        try:
            identifiers.check_id(worker_id, field="worker_id")
        except InvalidArgument:
            raise PageStatus(404, f"no worker {worker_id!r}: not a worker id") from None

        async def reads(conn: Any) -> tuple[Any, Any]:
            row = await conn.fetchrow(q.CONSOLE_WORKER, worker_id)
            runs = (
                []
                if row is None
                else await conn.fetch(
                    q.CONSOLE_WORKER_ASSIGNMENTS, worker_id, WORKER_ASSIGNMENTS_SHOWN, scope_of(request)
                )
            )
            return row, runs

        row, runs = await self.store.read(reads)
        if row is None:
            raise PageStatus(404, f"no worker {worker_id!r} has registered with this cluster")
        used = await self.store.read(
            lambda conn: conn.fetchrow(q.CONSOLE_WORKER_USAGE, worker_id, USAGE_SPAN_S, USAGE_SAMPLES_SHOWN)
        )
        usage = usage_values(used, of="all its command jobs together", none=WORKER_NO_USAGE)
        return page_part("worker", worker=self._worker_view(row), runs=runs, **usage)

    async def jobs(self, request: Request) -> Part:
        params = request.query_params
        state = params.get("state", "")
        name = params.get("name", "")[:MAX_FILTER_CHARS]
        worker = params.get("worker", "")[:MAX_FILTER_CHARS]
        job_id = job_id_param(params.get("id", ""), "id")
        before = job_id_param(params.get("before", ""), "before")
        filters = {"state": state, "name": name, "worker": worker, "id": params.get("id", "")}
        for field, value in (("name", name), ("worker", worker)):
            if "\x00" in value:
                raise PageStatus(400, f"the {field} filter may not hold a NUL character, got {value!r}")
        if state and state not in validation.JOB_STATES:
            raise PageStatus(400, f"no job state {state!r}: one of {', '.join(validation.JOB_STATES)}")
        name_part, index = views.task_filter(name)

        scope = scope_of(request)

        async def reads(conn: Any) -> tuple[Any, Any]:
            args = (state, name_part, worker, JOBS_PER_PAGE + 1, scope, job_id, index, before)
            return await conn.fetch(q.CONSOLE_JOBS, *args), await conn.fetch(q.CONSOLE_JOB_COUNTS, scope)

        rows, counts = await self.store.read(reads)
        shown = rows[:JOBS_PER_PAGE]
        kept = {k: v for k, v in filters.items() if v}
        return page_part(
            "jobs",
            jobs=shown,
            filters=filters,
            states=validation.JOB_STATES,
            job_counts=views.job_counts(counts),
            per_page=JOBS_PER_PAGE,
            newest_query=urllib.parse.urlencode(kept),
            older_query=(
                urllib.parse.urlencode({**kept, "before": shown[-1]["id"]})
                if len(rows) > JOBS_PER_PAGE
                else None
            ),
            paged=before is not None,
            name_part=name_part,
            task_index=index,
        )

    async def _job_reads(self, request: Request, *, events: bool) -> tuple[int, Any, Any, Any, Any]:
        """(job id, job row, its runs, its log source row, its events) of the page's job.

        Raises:
            PageStatus: 404 for no such job (or one another account owns).
        """
        text = request.path_params["job_id"]
        try:
            job_id = job_id_param(text, "job_id") or 0
        except PageStatus:
            raise PageStatus(404, f"no job {text!r}: not a job id") from None

        scope = scope_of(request)

        async def reads(conn: Any) -> tuple[Any, Any, Any, Any]:
            row = await conn.fetchrow(q.CONSOLE_JOB, job_id, scope)
            if row is None:
                return None, [], None, []
            return (
                row,
                await conn.fetch(q.CONSOLE_JOB_ATTEMPTS, job_id),
                await conn.fetchrow(q.CONSOLE_LOG_SOURCE, job_id, 0, scope),  # 0: its newest run that started
                await conn.fetch(q.CONSOLE_JOB_EVENTS, job_id, scope) if events else [],
            )

        row, attempts, source_row, history = await self.store.read(reads)
        if row is None:
            raise PageStatus(404, f"no job {job_id} in this cluster")
        return job_id, row, attempts, source_row, history

    async def job(self, request: Request) -> Part:
        job_id, row, attempts, source_row, history = await self._job_reads(request, events=True)
        # The environment's values never reach a template: a console reader may be a viewer.
        spec = job_spec_of(row).env_values_hidden()
        s = self.settings
        try:
            source = output.source_of(job_id, row["runtime"], source_row)
            outputs, output_note = await output.output_tails(
                self.logs,
                source,
                lines=s.output_tail_lines,
                max_bytes=s.output_tail_max_bytes,
                timeout_s=s.output_timeout_s,
            )
        except output.Unreadable as exc:
            outputs, output_note = [], str(exc)
        job = {key: value for key, value in row.items() if key != "env"}
        used = await self.store.read(
            lambda conn: conn.fetchrow(q.CONSOLE_JOB_USAGE, job_id, USAGE_SPAN_S, USAGE_SAMPLES_SHOWN)
        )
        return page_part(
            "job",
            job=job,
            spec=spec,
            attempts=attempts,
            outputs=outputs,
            output_note=output_note,
            events=[views.event_of(r) for r in history],
            **usage_values(
                used,
                of="its runs",
                none=JOB_NO_USAGE,
                cpu_asked_millis=spec.cpu_millis,
                memory_asked_mb=spec.memory_mb,
            ),
        )

    async def job_output(self, request: Request) -> Part:
        """One page of a job's stdout or stderr: at ``?offset=`` (bytes), else its live tail."""
        job_id, row, _, source_row, _ = await self._job_reads(request, events=False)
        stream = request.query_params.get("stream", "stdout")
        if stream not in output.STREAMS:
            raise PageStatus(400, f"no stream {stream!r}: one of {', '.join(output.STREAMS)}")
        text = request.query_params.get("offset", "")
        offset = views.whole_number(text)
        if text and offset is None:
            raise PageStatus(400, f"offset must be a whole number of bytes, got {text!r}")
        page, note = None, ""
        try:
            source = output.source_of(job_id, row["runtime"], source_row)
            page = await output.output_page(
                self.logs,
                source,
                stream,
                offset=offset,
                page_bytes=OUTPUT_PAGE_BYTES,
                timeout_s=self.settings.output_timeout_s,
            )
        except output.Unreadable as exc:
            note = str(exc)
        return page_part(
            "output",
            job={key: value for key, value in row.items() if key != "env"},
            stream=stream,
            streams=output.STREAMS,
            page=page,
            note=note,
            page_bytes=OUTPUT_PAGE_BYTES,
        )

    async def download(self, request: Request) -> Response:
        """A job's whole stdout or stderr as a text file (``GET /download/jobs/{id}/{stream}``),
        for the page's script, which sends the login token."""
        cors = self._cors_headers(request)
        if request.method == "OPTIONS":
            return self._preflight(request, "GET", "Authorization")
        try:
            self._identity(request)
            job_id, row, _, source_row, _ = await self._job_reads(request, events=False)
            stream = request.path_params["stream"]
            if stream not in output.STREAMS:
                raise PageStatus(404, f"no stream {stream!r}: one of {', '.join(output.STREAMS)}")
            source = output.source_of(job_id, row["runtime"], source_row)
            data = await output.whole_output(self.logs, source, stream, timeout_s=DOWNLOAD_TIMEOUT_S)
        except TokenRefused as exc:
            return Response(f"not logged in: {exc}\n", 401, media_type="text/plain", headers=cors)
        except PageStatus as exc:
            return Response(exc.message + "\n", exc.status, media_type="text/plain", headers=cors)
        except (output.Unreadable, DatabaseDown) as exc:
            return Response(f"{exc}\n", 503, media_type="text/plain", headers=cors)
        return Response(
            data,
            media_type="text/plain; charset=utf-8",
            headers={
                **cors,
                "Content-Disposition": f'attachment; filename="job-{job_id}-{stream}.txt"',
                "X-Content-Type-Options": "nosniff",
                "Cache-Control": "no-store",
            },
        )

    async def packing(self, request: Request) -> Part:
        samples = self.ring.samples()
        now = self.clock()
        chart = views.packing_chart(samples, now_unix_s=now, span_s=self.settings.history_s)
        latest = samples[-1] if samples else None
        return page_part(
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
            ("/jobs/{job_id}/output", self.job_output),
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
    routes += [
        Route("/action/{kind}/{target}/{action}", console.action, methods=["POST", "OPTIONS"]),
        Route("/download/jobs/{job_id}/{stream}", console.download, methods=["GET", "OPTIONS"]),
    ]
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
