"""Ingest's account handlers: an operator's SetAccount (audited as ``account_set``), and
GetAccount and ListAccounts, each account's quotas, priority cap, weight and what it uses now
(docs/quotas.md).
"""

from __future__ import annotations

from typing import Any

import attrs

from actors import idempotency, queries
from actors.ingest_workers import WorkerHandlers
from actors.rows import ints
from protocol import pb
from runtime import log
from runtime.accounts import CLEARABLE, AccountChange
from runtime.aio import rpc_caller, visible_account
from runtime.errors import NotFound
from runtime.identifiers import check_id
from runtime.validation import check_idempotency_key


def _unknown(name: str) -> str:
    return f"account {name!r} is unknown: it has no settings and no jobs"


def account_info(row: Any) -> pb.AccountInfo:
    """A row of ``queries.ACCOUNTS`` as an ``AccountInfo`` message."""
    caps: dict[str, Any] = {}
    for cap in CLEARABLE:
        caps[f"has_{cap}"] = row[cap] is not None
        caps[cap] = int(row[cap] or 0)
    return pb.AccountInfo(
        name=row["name"],
        weight=float(row["weight"]),
        **ints(row, "used_cpu_millis", "used_memory_mb", "queued_jobs"),
        **caps,
    )


@attrs.define
class AccountHandlers(WorkerHandlers):
    """The account RPCs of :class:`actors.ingest.ControlPlaneService`."""

    async def set_account(self, request: pb.SetAccountRequest) -> pb.AccountInfo:
        """Store an account's caps, priority cap and weight (a field not given keeps its stored value) once
        per idempotency key, with its audit row; answers the account as :meth:`get_account`.

        Raises:
            InvalidArgument: a field breaks its rule (:meth:`AccountChange.check`); nothing stored.
            IdempotencyConflict, Busy, DatabaseUnavailable: as :meth:`_once`.
        """
        change = AccountChange.from_pb(request).check()
        key = check_idempotency_key(request.idempotency_key)
        args = (
            change.name,
            change.cpu_millis,
            change.memory_mb,
            change.max_pending,
            change.max_priority,
            change.weight,
        )
        digest = idempotency.request_digest("set_account", [*args, list(change.clear)])
        async with self.database("set_account") as conn:
            done = await self._once(
                conn,
                "set_account",
                queries.SET_ACCOUNT,
                *args,
                list(change.clear),
                key=key,
                digest=digest,
                arguments=change.arguments(),
            )
            row = await conn.fetchrow(queries.ACCOUNTS, change.name)
        if not done.replayed:
            log.get("ingest").info("account set", account=change.name, **change.arguments())
        return account_info(row)

    async def get_account(self, request: pb.GetAccountRequest) -> pb.AccountInfo:
        """An account's caps, priority cap, weight and use (an account with no row: no caps, the
        default priority cap, weight 1); raises InvalidArgument for a name breaking the id rules,
        NotFound for an operator's or unscoped viewer's read of a name with no settings and no
        jobs (a user's own account always reads),
        PermissionDenied for a user's or scoped viewer's read of another account."""
        name = check_id(request.name, field="name")
        visible_account("get_account", name)
        async with self.database("get_account") as conn:
            # A user's (or scoped viewer's) own account always reads: its certificate names it.
            if rpc_caller().scope is None and not await conn.fetchval(queries.ACCOUNT_KNOWN, name):
                raise NotFound(_unknown(name))
            row = await conn.fetchrow(queries.ACCOUNTS, name)
        return account_info(row)

    async def list_accounts(self, request: pb.ListAccountsRequest) -> pb.ListAccountsReply:
        """Every account with a row or with jobs queued or in use, by name (a user's or a
        scoped viewer's own only)."""
        scope = visible_account("list_accounts", "")
        async with self.database("list_accounts") as conn:
            rows = await conn.fetch(queries.ACCOUNTS, scope)
        return pb.ListAccountsReply(accounts=[account_info(r) for r in rows])
