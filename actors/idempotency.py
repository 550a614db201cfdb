"""Idempotency keys: a retried mutating call is carried out once.

A client cannot tell a replica that failed before it stored a call from one that stored it and
then failed to answer, so it sends the call again, to the next replica, with the same key
(:mod:`runtime.client`). The rule, for every mutating RPC:

1. The key is stored with the call's answer in the same statement as the call's effect
   (:func:`actors.queries.once`), under a unique index: the key and the effect commit together
   or not at all.
2. A call whose key is stored is not carried out again: it gets the stored answer, if its
   request is the one the key was first used for (same RPC, same :func:`request_digest`).
3. The same key with another request is refused (:class:`runtime.errors.IdempotencyConflict`,
   gRPC ALREADY_EXISTS), naming what the first request did (:func:`conflict_message`), and
   nothing is stored.
4. A key is kept ``idempotency_key_retention_s`` (24 h) after its first use, then deleted; a
   copy arriving after that is a new call. The client retries one call for well under a
   minute, so every retry it makes finds its key.

RegisterWorker follows the same rules with the key it already had: the worker id, the agent's
run id and the registration's number (``agent_run_id``, ``registration_seq``), kept in the
worker's row, whose digest (:func:`registration_digest`) is compared the same way.

A heartbeat needs no key: everything it writes is idempotent by content (liveness is a time,
a running confirmation sets ``confirmed_at`` once, an outcome ends its assignment once and is
recorded once, both by assignment id; ``record_heartbeat`` in schema.sql).

A new mutating RPC gets all of this by two steps: its request carries a ``string
idempotency_key`` (the client then fills it in, :func:`runtime.idempotency_keys.with_idempotency_key`),
and its handler runs its statement, made with :func:`actors.queries.once`, through
``ControlPlaneService._once`` (and adds a line to :func:`describe`, so a conflict names what it
did).

Pure functions: the handlers in :mod:`actors.ingest` run them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Generator, Iterable, Mapping, Sequence
from typing import Any

from actors import queries
from runtime.jobs import JobSpec

_LISTED_JOBS = 5
"""Job ids a conflict message lists before it says only how many and which range."""


def _item(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def digest_steps(rpc: str, items: Iterable[Any], *, step_items: int) -> Generator[None, None, bytes]:
    """The sha256 of ``rpc`` and ``items`` (JSON-encodable values), as a generator that yields
    after every ``step_items`` items (for :func:`actors.ingest_gate.run_in_slices`) and returns the
    32-byte digest.

    Computed from the checked request, not from its wire bytes: two encodings of one request
    (fields in another order, a default value sent or left out) have the same digest.
    """
    hasher = hashlib.sha256(_item(rpc))
    for index, item in enumerate(items, 1):
        hasher.update(_item(item))
        if index % step_items == 0:
            yield
    return hasher.digest()


def request_digest(rpc: str, items: Iterable[Any]) -> bytes:
    """:func:`digest_steps` in one piece."""
    steps = digest_steps(rpc, items, step_items=2**62)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            digest: bytes = done.value
            return digest


def job_item(job: JobSpec) -> list[Any]:
    """A checked job as it enters a request's digest: the columns it is stored in
    (:func:`actors.queries.job_columns`) but the runtime's name, ``[name, cpu_millis,
    memory_mb, priority, sleep_ms, argv]``, as digests were first computed (keys stored then
    must keep matching their retries); a container job adds ``["container", image]``, so it
    never digests as the command job with the same argv; a job with lifecycle fields
    (attempts, timeout, constraints, ...) adds ``["lifecycle", [[field, value], ...]]`` with
    those that differ from their defaults.

    Raises:
        ValueError: ``job`` has no runtime (it was not checked).
    """
    c = queries.job_columns(job)
    item: list[Any] = [c.name, c.cpu_millis, c.memory_mb, c.priority, c.sleep_ms, c.argv]
    if c.image is not None:
        item.append([c.runtime, c.image])
    defaults = queries.JobColumns("", 1, 1, 0, "", None, None)
    lifecycle = [
        [name, getattr(c, name)] for name in _LIFECYCLE_FIELDS if getattr(c, name) != getattr(defaults, name)
    ]
    if job.array is not None:
        lifecycle.append(["array", [job.array.first_index, job.array.last_index, job.array.max_running]])
    if lifecycle:
        item.append(["lifecycle", lifecycle])
    return item


_LIFECYCLE_FIELDS = (
    "max_attempts",
    "retry_backoff_ms",
    "count_lost",
    "timeout_ms",
    "constraints",
    "env",
    "workdir",
    "after_ids",
)
"""The columns after a spec's runtime; each enters a digest only when it is not its default,
so a spec that uses none of them digests as it did before they existed."""


def registration_digest(*, address: str, cpu_millis: int, memory_mb: int, labels: Mapping[str, str]) -> bytes:
    """The digest of what a registration asks for. The outcomes it carries are left out: a
    retried registration may carry more of them, and each is recorded once by its assignment
    id whichever copy brings it."""
    return request_digest("register_worker", [address, cpu_millis, memory_mb, sorted(labels.items())])


def _job_ids(ids: Sequence[int]) -> str:
    if len(ids) == 1:
        return f"job {ids[0]}"
    if len(ids) <= _LISTED_JOBS:
        return "jobs " + ", ".join(str(i) for i in ids)
    return f"{len(ids)} jobs, {ids[0]} to {ids[-1]}"


def describe(rpc: str, answer: Sequence[Mapping[str, Any]]) -> str:
    """What a stored call did, from its RPC and its stored answer (the rows of its effect):
    ``"it created job 17"``, ``"it created jobs 17, 18, 19"``, ``"it created 400 jobs, 17 to
    416"``, ``"it created array 17 (100 tasks)"``, ``"it cancelled job 17 (cancelled)"``,
    ``"it cancelled 40 tasks of array 17 (cancelling)"``, ``"it drained worker w-2"``."""
    if rpc == "submit_job" and answer and int(answer[0].get("tasks", 1)) > 1:
        return f"it created array {answer[0]['id']} ({answer[0]['tasks']} tasks)"
    if rpc in ("submit_job", "submit_jobs"):
        return "it created " + _job_ids(sorted(int(row["id"]) for row in answer))
    if rpc == "cancel_job" and answer:
        row = answer[0]
        state = "cancelling" if row["cancel_requested"] else row["state"]
        if row.get("tasks"):
            return f"it cancelled {row['tasks']} tasks of array {row['id']} ({state})"
        return f"it cancelled job {row['id']} ({state})"
    if rpc in ("cordon_worker", "uncordon_worker", "drain_worker") and answer:
        return f"it {rpc.removesuffix('_worker')}ed worker {answer[0]['id']}"
    return f"its answer was {json.dumps(list(answer))[:200]}"


def conflict_message(*, key: str, rpc: str, first_rpc: str, answer: Sequence[Mapping[str, Any]]) -> str:
    """The refusal of a ``rpc`` call whose key was first used for another request: names the
    key, the first call and what it did (the job it created or cancelled)."""
    first = f"{first_rpc} with another request" if first_rpc == rpc else f"{first_rpc}, not {rpc}"
    return (
        f"idempotency_key {key!r} was first used for {first} ({describe(first_rpc, answer)}); "
        "nothing was stored; send a new request with a new key"
    )


def registration_conflict_message(
    *, worker_id: str, agent_run_id: str, registration_seq: int, incarnation: int
) -> str:
    """The refusal of a registration whose key (worker, run, number) was first used with another
    address, capacity or labels; names the incarnation the first created."""
    return (
        f"registration_seq {registration_seq} of agent run {agent_run_id!r} of worker {worker_id} was "
        f"first applied with another address, capacity or labels (it created incarnation "
        f"{incarnation}); nothing was changed; register with a new registration_seq"
    )
