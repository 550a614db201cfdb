"""Idempotency keys: a retried mutating call is carried out once.

Pure functions the ingest's handlers run: a request's digest (:func:`request_digest`) and the
messages of a conflict (:func:`conflict_message`). docs/design.md, "Idempotency keys".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Generator, Iterable, Mapping, Sequence
from typing import Any

import attrs

from actors import queries
from runtime.jobs import JobSpec
from runtime.loops import finish

_LISTED_JOBS = 5
"""Job ids a conflict message lists before it says only how many and which range."""


def _item(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def digest_steps(rpc: str, items: Iterable[Any], *, step_items: int) -> Generator[None, None, bytes]:
    """The sha256 of ``rpc`` and ``items`` (JSON-encodable values of the checked request, not its
    wire bytes), as a generator that yields after every ``step_items`` items and returns the
    32-byte digest."""
    hasher = hashlib.sha256(_item(rpc))
    for index, item in enumerate(items, 1):
        hasher.update(_item(item))
        if index % step_items == 0:
            yield
    return hasher.digest()


def request_digest(rpc: str, items: Iterable[Any]) -> bytes:
    """:func:`digest_steps` in one piece."""
    return finish(digest_steps(rpc, items, step_items=2**62))


def job_item(job: JobSpec) -> list[Any]:
    """A checked job as it enters a request's digest: the columns it is stored in, in their
    order, then its failure policy, max_failed_tasks and after_names as one more item when any
    is set, then the devices it asks when it asks some, then a gang's size and spread when it is
    one (so the digest of a job without them is the one stored before they existed, and a copy of
    a call sent across an upgrade is still a copy); raises ValueError for a job with no runtime
    (not checked)."""
    columns = queries.job_columns(job)
    policy = [columns.retry_on_exit, columns.no_retry_on, columns.array_max_failed, list(job.after_names)]
    older = list(attrs.astuple(columns))[: -len(_NEWER_COLUMNS)]
    item = older + ([policy] if any(policy) else [])
    if job.resources:
        item = [*item, list(job.resources)]
    return item if job.tasks is None else [*item, job.tasks, job.spread]


_NEWER_COLUMNS = ("retry_on_exit", "no_retry_on", "array_max_failed")
"""The columns of :class:`actors.queries.JobColumns` (its last) that a digest holds apart."""


def registration_digest(
    *,
    address: str,
    cpu_millis: int,
    memory_mb: int,
    labels: Mapping[str, str],
    resources: Mapping[str, Sequence[str]] | None = None,
) -> bytes:
    """The digest of what a registration asks for (not its outcomes: a retry may carry more);
    the devices it offers count only when it offers some."""
    item: list[Any] = [address, cpu_millis, memory_mb, sorted(labels.items())]
    if resources:
        item.append(sorted((name, list(units)) for name, units in resources.items()))
    return request_digest("register_worker", item)


def _job_ids(ids: Sequence[int]) -> str:
    if len(ids) == 1:
        return f"job {ids[0]}"
    if len(ids) <= _LISTED_JOBS:
        return "jobs " + ", ".join(str(i) for i in ids)
    return f"{len(ids)} jobs, {ids[0]} to {ids[-1]}"


def describe(rpc: str, answer: Sequence[Mapping[str, Any]]) -> str:
    """What a stored call did, from its RPC and its stored answer: ``"it created jobs 17, 18,
    19"``, ``"it created array 17 (100 tasks)"``, ``"it cancelled job 17 (cancelled)"``, ..."""
    if rpc == "submit_job" and answer and answer[0].get("gang"):
        return f"it created gang {answer[0]['id']} ({answer[0]['tasks']} tasks)"
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


def conflict_message(
    *, key: str, rpc: str, first_rpc: str, answer: Sequence[Mapping[str, Any]], shown: bool = True
) -> str:
    """The refusal of a ``rpc`` call whose key was first used for another request: names the
    key, the first call and, when ``shown``, what it did (the job it created or cancelled; not
    shown to a caller scoped to one account: the first call may have been another account's)."""
    first = f"{first_rpc} with another request" if first_rpc == rpc else f"{first_rpc}, not {rpc}"
    did = f" ({describe(first_rpc, answer)})" if shown else " (by this account or another)"
    return (
        f"idempotency_key {key!r} was first used for {first}{did}; nothing was stored; send a new "
        "request with a new key"
    )


def scoped_digest(digest: bytes, account: str | None) -> bytes:
    """``digest`` as a caller scoped to ``account`` (a user) stores and compares it: bound to the
    account, so another account's call with the same key and request is a conflict, never a
    replay of its answer (None: ``digest`` itself, as for operators and ``--insecure``)."""
    if account is None:
        return digest
    return hashlib.sha256(digest + b"\x00account\x00" + account.encode()).digest()


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
