"""Who called the RPC being served, and what its certificate's role may do: :class:`Caller`,
:func:`rpc_caller`, :func:`check_access` (an :data:`Access` table per service),
:func:`require_worker`, :func:`visible_account` (the one account a user or scoped viewer sees),
:func:`audit_params` (who, for an audit row) and :func:`refuse` (log, count and build the
refusal). Accounts: docs/accounts.md."""

from __future__ import annotations

import contextvars
import json
from collections.abc import Collection, Mapping
from typing import Any

import attrs
import grpclib.server

from runtime import log
from runtime.errors import PermissionDenied
from runtime.identifiers import check_id
from runtime.metrics import AUTH_REFUSALS
from runtime.tls import OPERATOR, WORKER, Identity, identity_of_peercert

ANONYMOUS = "anonymous"
"""The account of a caller on a plaintext connection (a server run with ``--insecure``): the
owner of the jobs it submits and the actor of its audit rows."""
PLAINTEXT_ROLE = "plaintext"
"""The role an audit row names for a caller on a plaintext connection."""


@attrs.frozen
class Caller:
    """Who called the RPC being served: ``address`` (``host:port`` as seen by the server),
    ``secure`` (the connection is mutual TLS) and the ``identity`` its verified client
    certificate carries (None on a plaintext connection, or a certificate without one)."""

    address: str
    secure: bool = False
    identity: Identity | None = None

    def acts_as(self, roles: Collection[str]) -> bool:
        """Whether the caller holds one of ``roles``: its certificate's role is among them, or
        the connection is plaintext (a server run with ``--insecure`` checks no identity, and
        lets everyone call everything)."""
        if not self.secure:
            return True
        return self.identity is not None and self.identity.role in roles

    @property
    def role(self) -> str:
        """The certificate's role, :data:`PLAINTEXT_ROLE` on a plaintext connection, ``"-"`` for
        a certificate without an identity."""
        if not self.secure:
            return PLAINTEXT_ROLE
        return self.identity.role if self.identity is not None else "-"

    @property
    def id(self) -> str:
        """The certificate's id, :data:`ANONYMOUS` on a plaintext connection."""
        if not self.secure:
            return ANONYMOUS
        return self.identity.id if self.identity is not None else "-"

    @property
    def account(self) -> str:
        """The account the caller acts as, the owner of the jobs it submits: its certificate's
        id (a user's account name, an operator's own id), :data:`ANONYMOUS` on a plaintext
        connection."""
        return self.id

    @property
    def priority_capped(self) -> bool:
        """Whether the jobs it submits are held to its account's ``max_priority``
        (docs/quotas.md, "Priority cap"): a user's are; an operator's are not, nor a plaintext
        caller's (a server run with ``--insecure`` gives it every role)."""
        return not self.acts_as((OPERATOR,))

    @property
    def scope(self) -> str | None:
        """The one account whose jobs and audit rows the caller may see and act on (a user's
        own, a scoped viewer's), None for all (:attr:`runtime.tls.Identity.scope`)."""
        return self.identity.scope if self.secure and self.identity is not None else None

    def __str__(self) -> str:
        who = str(self.identity) if self.identity else ("no identity" if self.secure else "plaintext")
        return f"{who} at {self.address}"


NOBODY = Caller(address="-")
"""The caller outside a served RPC."""

RPC_CALLER = contextvars.ContextVar[Caller]("stockade_rpc_caller", default=NOBODY)  # trio side


def rpc_caller() -> Caller:
    """The caller of the RPC being handled (a placeholder with address ``"-"`` outside a
    handler served by :func:`trio_service`)."""
    return RPC_CALLER.get()


def caller_of(stream: grpclib.server.Stream[Any, Any]) -> Caller:
    peer = stream.peer
    addr = peer.addr()
    address = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr)
    # A TLS server here always requires a verified client certificate, so a connection without
    # one is plaintext.
    cert = peer.cert()
    if cert is None:
        return Caller(address=address)
    return Caller(address=address, secure=True, identity=identity_of_peercert(cert))


def refuse(rpc: str, reason: str, message: str, caller: Caller | None = None) -> PermissionDenied:
    """Log a refused call with its caller (default: the RPC's), count it
    (``stockade_auth_refusals_total`` by ``rpc`` and ``reason``: ``no_identity``, ``role``,
    ``id`` or ``account``) and return the :class:`runtime.errors.PermissionDenied` to raise."""
    caller = caller or rpc_caller()
    AUTH_REFUSALS.labels(rpc=rpc, reason=reason).inc()
    log.get("auth").warning(
        "refused a call", rpc=rpc, reason=reason, peer=str(caller.identity or "-"), address=caller.address
    )
    return PermissionDenied(f"permission denied: {message}")


def require_worker(rpc: str, worker_id: str) -> None:
    """Refuse, on a mutual-TLS connection, a caller that may not speak as the worker
    ``worker_id`` (:meth:`runtime.tls.Identity.speaks_for`); plaintext is not checked.

    Raises:
        PermissionDenied: another worker, a fleet not naming ``worker_id``, or another role
            (logged and counted).
    """
    caller = rpc_caller()
    if not caller.secure:
        return
    identity = caller.identity
    if identity is None or identity.role != WORKER:
        raise refuse(
            rpc, "role", f"{rpc} needs the worker certificate of {worker_id!r}; the caller is {caller}"
        )
    if identity.speaks_for(worker_id):
        return
    allowed = "one of the workers it names" if identity.is_fleet else f"worker_id {identity.id!r}"
    raise refuse(rpc, "id", f"{identity} may {rpc} only as {allowed}, not as {worker_id!r}")


def audit_params(arguments: Mapping[str, Any]) -> tuple[str, str, str, str, str]:
    """The audit parameters of a mutating call's statement (``actors.queries.once``), for the
    caller of the RPC being served: its role, id, account and address, and ``arguments`` (the
    call's key arguments) as JSON text."""
    caller = rpc_caller()
    return (caller.role, caller.id, caller.account, caller.address, json.dumps(dict(arguments)))


def visible_account(rpc: str, requested: str) -> str | None:
    """The one account whose rows a read of ``rpc`` may return (None: every account): the
    caller's scope (a user's own account, a scoped viewer's), else ``requested`` (empty: all).

    Raises:
        InvalidArgument: ``requested`` breaks the id rules.
        PermissionDenied: a scoped caller asked for another account (logged and counted).
    """
    if requested:
        check_id(requested, field="account")
    caller = rpc_caller()
    scope = caller.scope
    if scope is None:
        return requested or None
    if requested and requested != scope:
        raise refuse(
            rpc, "account", f"{rpc}: {caller} may read only account {scope!r}, not {requested!r}", caller
        )
    return scope


Access = Mapping[str, Collection[str]]
"""RPC name (snake case, ``"submit_jobs"``) -> the roles that may call it."""


def check_access(rpc: str, access: Access | None, caller: Caller) -> None:
    """Refuse ``caller`` (PermissionDenied, :func:`refuse`) when ``access`` names no role of its
    for ``rpc`` (a plaintext caller, or ``access`` None, is not checked)."""
    if access is None or not caller.secure:
        return
    if caller.identity is None:
        raise refuse(
            rpc, "no_identity", f"{rpc}: the client certificate carries no Stockade identity", caller
        )
    allowed = access.get(rpc, ())
    if caller.identity.role not in allowed:
        needs = " or ".join(sorted(allowed)) or "a role no certificate has"
        raise refuse(rpc, "role", f"{rpc} needs {needs}; the caller is {caller}", caller)
