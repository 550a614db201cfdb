"""Stockade's exceptions: one base class, subclasses that say what the caller can do.

:class:`TemporaryError` may pass (try again after ``retry_after_s``), :class:`PermanentError`
will not; :class:`StaleEpoch` says stop deciding. Each class says when it is raised and, for
those that cross the gRPC boundary, its status there.
"""

from __future__ import annotations

from collections.abc import Sequence


class StockadeError(Exception):
    """Base class of every error Stockade raises on purpose."""


class TemporaryError(StockadeError):
    """A failure that may pass: retry after ``retry_after_s`` seconds (a suggestion)."""

    def __init__(self, message: str, *, retry_after_s: float = 0.5) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PermanentError(StockadeError):
    """A failure that retrying will not mend (bad configuration, a broken invariant)."""


class DatabaseUnavailable(TemporaryError):
    """The database did not answer or the connection broke."""


class DatabaseRefused(PermanentError):
    """The database server refused this client for good: a wrong password, an unknown role or
    database, or a URL asyncpg cannot use. Retrying cannot help; the message says which."""


class DatabaseBusy(DatabaseUnavailable):
    """The server gave up on one statement (its statement or lock timeout passed, or it was a
    deadlock's victim) and rolled it back; the connection is still good. A smaller statement,
    or the same one later, may pass."""


class Unavailable(TemporaryError):
    """A remote peer (control plane or worker) did not answer in time."""


class PeerUnavailable(Unavailable):
    """A peer answered UNAVAILABLE: it is up and handled the request, but something it needs
    (a worker it relays from, the database) is out of its reach now. Another peer may reach
    it; the message names the peer, and ``detail`` holds the peer's own words.

    """

    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


class ConnectionRefused(Unavailable):
    """A peer refused the connection: nothing listens at its address (its process is not
    running). The request was not sent."""


class NoControlPlaneReachable(Unavailable):
    """Every control-plane address in the list failed; the message lists why for each.

    Args:
        addresses: the addresses asked, in the caller's order (empty when not known).
        failures: how each asked replica failed, in the order they failed (empty when not
            known); every one a :class:`ConnectionRefused` means the cluster is not running.
    """

    def __init__(
        self,
        message: str,
        *,
        addresses: Sequence[str] = (),
        failures: Sequence[Unavailable] = (),
        retry_after_s: float = 0.5,
    ) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.addresses = tuple(addresses)
        self.failures = tuple(failures)


class Busy(Unavailable):
    """A control plane is overloaded and refused the request before doing any of it (gRPC
    RESOURCE_EXHAUSTED on the wire): nothing was stored, so retrying it elsewhere or later
    never duplicates it. ``retry_after_s``: before asking this replica again.
    """

    def __init__(self, message: str, *, retry_after_s: float = 0.1) -> None:
        super().__init__(message, retry_after_s=retry_after_s)


class ClusterBusy(NoControlPlaneReachable):
    """Every control plane that answered was busy, for as long as the caller was willing to
    retry (``busy_retry_s``); the message says how long and how each replica answered last.
    Nothing the busy replicas refused was stored."""


class DeadlineExceeded(TemporaryError):
    """A request's deadline passed before its handler could start its database work: it was
    not started (gRPC DEADLINE_EXCEEDED on the wire)."""


class StaleEpoch(StockadeError):
    """The epoch this replica acts under is no longer the current one.

    Args:
        epoch: the epoch the refused decision carried.
        epoch_seen: the current epoch as read under ``FOR KEY SHARE`` (or reported by a worker).
    """

    def __init__(self, epoch: int, epoch_seen: int) -> None:
        super().__init__(f"deposed: acting under epoch {epoch}, current epoch is {epoch_seen}")
        self.epoch = epoch
        self.epoch_seen = epoch_seen


class InvalidArgument(StockadeError, ValueError):
    """Input that breaks a rule; the message names the field, the value and the limit (gRPC
    INVALID_ARGUMENT on the wire).

    Args:
        field: the offending field's name, e.g. ``"cpu_millis"``.
        value: the value received.
        rule: the limit it broke, e.g. ``"must be between 1 and 1000000"``.
        detail: said after the value, in parentheses, e.g. ``"-1 as a signed 64-bit
            integer"``; empty for nothing.
    """

    def __init__(self, field: str, value: object, rule: str, *, detail: str = "") -> None:
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        text = f"{field} {rule}, got {shown}"
        super().__init__(f"{text} ({detail})" if detail else text)
        self.field = field
        self.value = value
        self.rule = rule
        self.detail = detail


class IdempotencyConflict(StockadeError):
    """The request's idempotency key was first used for a different request; nothing was stored.

    Not retried: every replica would say the same. gRPC ALREADY_EXISTS on the wire (what the
    key names already exists). The message names the key, what it was first used for and
    what to do.
    """


class FailedPrecondition(StockadeError):
    """The request is sound and names something that exists, but that is not in the state the
    request needs: the output of a job that has not started yet, or that its worker no longer
    keeps (gRPC FAILED_PRECONDITION on the wire). Nothing was done; the same request may succeed
    once the state has changed. The message says what state it found and what it needs.
    """


class DuplicateKey(StockadeError):
    """A statement broke a unique index and was rolled back whole: nothing it wrote is stored.

    Args:
        constraint: the index's (constraint's) name, e.g. ``"idempotency_keys_pkey"``.
        message: the database's message.
    """

    def __init__(self, constraint: str, message: str) -> None:
        super().__init__(f"duplicate key in {constraint or 'a unique index'}: {message}")
        self.constraint = constraint


class NotFound(StockadeError, LookupError):
    """The named object (job, worker) does not exist (gRPC NOT_FOUND on the wire)."""


class LocalFileError(PermanentError):
    """A file this process needs (a certificate, a key) is missing, unreadable or readable by
    others; the message names it and what to do."""


class ResourcesUnavailable(PermanentError):
    """This machine cannot enforce command jobs' resources the way asked (a cgroup hierarchy is
    missing, lacks a controller, or cannot be written); the message says which and where. For
    ``job_resources = auto`` the agent takes the next way; for one asked for by name it
    refuses to start (:mod:`agent.cgroups`)."""


class PermissionDenied(PermanentError):
    """The caller's identity may not do this (gRPC PERMISSION_DENIED); nothing was done.

    Not retried: every replica applies the same rule. The message names the caller's identity,
    what it asked for and which role (or worker id) it would need.
    """


class HandshakeRefused(Unavailable):
    """The TLS handshake with a peer failed (a certificate refused by either side, or one side
    not speaking TLS); the message says which. Retried like any unreachable peer, since another
    replica may accept it, and reported as it is when none does."""


class RemoteError(StockadeError):
    """A peer answered with an error status that is not one of ours to retry.

    Args:
        status: the gRPC status name, e.g. ``"INVALID_ARGUMENT"``.
        message: the peer's message.
    """

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.detail = message


class ActorGaveUp(PermanentError):
    """An actor crashed more often than its restart policy allows; the process should exit."""
