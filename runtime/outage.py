"""One log line per change of a database's reachability, not one per attempt.

Every connection owner tells its :class:`OutageLog` how each connect or call went. The log
then says ``database unreachable`` (warning) once, when the first failure follows a success (or
the start), with the error and the target (the URL, its password shown as ``***``); ``database
still unreachable`` (warning) at most every ``remind_every_s`` while failures go on, with the
attempts so far, ``down_for_s`` and the last error; ``database reachable again`` (info) once,
at the first success after failures. Failures in between log nothing. Time is trio's; a caller
may pass ``now`` itself.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from runtime.identifiers import url_without_password
from runtime.settings.fields import positive

DEFAULT_REMIND_EVERY_S = 10.0
"""How often a continuing outage is logged again, in seconds."""


@attrs.define
class OutageLog:
    """Whether one owner's database is reachable, logged on each change (see the module
    docstring) on the owner's ``logger``; InvalidArgument if ``remind_every_s`` is not > 0."""

    logger: Any
    target: str = attrs.field(converter=url_without_password)
    remind_every_s: float = attrs.field(default=DEFAULT_REMIND_EVERY_S, validator=positive)
    down_since: float | None = None
    """Trio time of the first failure of the current outage; None while reachable."""
    attempts: int = 0
    """Failures in the current outage."""
    _reminded_at: float = 0.0

    @property
    def is_down(self) -> bool:
        """Whether the last attempt failed."""
        return self.down_since is not None

    def failed(self, error: BaseException | str, *, now: float | None = None) -> None:
        """Record a failed connect or call at ``now`` (trio seconds; default: the current time)."""
        now = trio.current_time() if now is None else now
        self.attempts += 1
        if self.down_since is None:
            self.down_since = now
            self._reminded_at = now
            self.logger.warning("database unreachable", error=str(error), target=self.target)
        elif now - self._reminded_at >= self.remind_every_s:
            self._reminded_at = now
            self.logger.warning(
                "database still unreachable",
                attempts=self.attempts,
                down_for_s=round(now - self.down_since, 1),
                error=str(error),
                target=self.target,
            )

    def succeeded(self, *, now: float | None = None) -> None:
        """Record a successful connect or call at ``now`` (trio seconds; default: the current time)."""
        if self.down_since is None:
            return
        now = trio.current_time() if now is None else now
        self.logger.info(
            "database reachable again",
            down_for_s=round(now - self.down_since, 3),
            attempts=self.attempts,
            target=self.target,
        )
        self.down_since = None
        self.attempts = 0
