"""What a console page's part answers (:class:`Part`, or :class:`PageStatus` to end early), and
the reads of a request its pages share (the reader's account scope, a job id parameter)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from starlette.requests import Request

from actors.console import views
from runtime import validation

__all__ = ["PageFn", "PageStatus", "Part", "job_id_param", "page_part", "scope_of"]


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


def scope_of(request: Request) -> str | None:
    """The one account whose jobs the page's reader may see (None: all), set by
    :meth:`actors.console.app.ConsoleApp._part` from the reader's login token."""
    return getattr(request.state, "scope", None)


def job_id_param(text: str, field: str) -> int | None:
    """A job id from query parameter ``field`` (None when empty); PageStatus 400 otherwise."""
    if not text:
        return None
    job_id = views.whole_number(text) or 0
    if not 0 < job_id <= validation.MAX_ID:
        raise PageStatus(400, f"{field} must be a job id (1 to {validation.MAX_ID}), got {text!r}")
    return job_id


def page_part(template: str, status: int = 200, **values: Any) -> Part:
    return Part(status=status, template=f"parts/{template}.html", values=values)
