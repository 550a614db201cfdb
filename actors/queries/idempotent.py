"""The wrapper that makes a mutating call's statement idempotent and audited (:func:`once`),
used by the ingest's unfenced writes (:mod:`actors.queries.ingest`).
"""

from __future__ import annotations

AUDIT_PARAMS = 5
"""The parameters :func:`once` adds after the effect's for its audit row: the caller's role, id,
account and peer address, and the call's key arguments (JSON text)."""


def once(rpc: str, effect: str, *, params: int, action: str, steps: str = "", changed: str = "true") -> str:
    """A mutating call's statement, carried out at most once per idempotency key
    (:mod:`actors.idempotency`): ``effect`` (a data-modifying statement with ``params``
    parameters that writes only when the CTE ``fresh`` has a row, and returns the rows that
    make up the call's answer) wrapped so that one statement, one transaction:

    - reads the key's row (``prior``, in the statement's snapshot);
    - carries out the effect only when there is none (``fresh``);
    - stores the key, ``rpc``, the request's digest and the effect's rows as JSON (the answer),
      when the effect returned any (a call that changed nothing, such as a cancel of an
      unknown job, stores no key either);
    - writes one row of ``audit_log`` (``action``; the effect's ``id`` column as its target
      ids; who, from where and the key arguments from the audit parameters) in the same case
      when ``changed`` holds too, so a replayed copy or a call that changed nothing writes none;
    - returns one row: ``replayed`` (the key was stored already), ``rpc`` and
      ``request_sha256`` of the stored call (NULL when not replayed), and ``answer``, the
      stored answer or the new one.

    ``steps``: CTEs (``name AS (...),`` each, a trailing comma included) put between ``fresh``
    and ``effect``, for an effect made of several steps (a data-modifying CTE must be at the
    top level); a step that writes must write only when ``fresh`` has a row, as the effect.

    ``changed``: an SQL boolean expression (over ``steps``' CTEs) that holds when the call
    changed something; false for a call that found everything as it asked (a second cancel of
    a job, a cordon of a cordoned worker): it is answered (and its key stored) as any other,
    but writes no audit row. The trail so says what happened (docs/accounts.md). Default: every
    call that returned rows changed something.

    Parameters: the effect's ``$1 .. $params``, then the :data:`AUDIT_PARAMS` audit ones, then
    the key and the request's sha256. A copy that stored the key after this statement's snapshot
    was taken makes the key's INSERT wait for it and then break the primary key
    (``idempotency_keys_pkey``): the statement rolls back whole, effect and audit row included,
    and the caller runs it again to get the stored answer. A copy still in progress makes it
    wait at most the session's ``lock_timeout``.
    """
    if not rpc.isidentifier() or not action.isidentifier():
        raise ValueError(f"rpc and action must be names, got {rpc!r} and {action!r}")
    role, actor_id, account, address, arguments = (f"${params + n}" for n in range(1, AUDIT_PARAMS + 1))
    key, digest = f"${params + AUDIT_PARAMS + 1}", f"${params + AUDIT_PARAMS + 2}"
    return f"""
WITH prior AS (
    SELECT rpc, request_sha256, answer FROM idempotency_keys WHERE key = {key}::text
),
fresh AS (SELECT WHERE NOT EXISTS (SELECT FROM prior)),
{steps}
effect AS ({effect}),
answer AS (SELECT coalesce(jsonb_agg(effect), '[]'::jsonb) AS rows, count(*) AS n FROM effect),
kept AS (
    INSERT INTO idempotency_keys (key, rpc, request_sha256, answer)
    SELECT {key}::text, '{rpc}', {digest}::bytea, answer.rows FROM answer WHERE answer.n > 0
),
audited AS (
    INSERT INTO audit_log (role, actor_id, account, address, action, target_ids, arguments)
    SELECT {role}::text, {actor_id}::text, {account}::text, {address}::text, '{action}',
           (SELECT jsonb_agg(e.id ORDER BY e.id) FROM effect e), {arguments}::jsonb
      FROM answer WHERE answer.n > 0 AND ({changed})
)
SELECT prior.rpc IS NOT NULL AS replayed, prior.rpc, prior.request_sha256,
       coalesce(prior.answer, answer.rows)::text AS answer
  FROM answer LEFT JOIN prior ON true
"""
