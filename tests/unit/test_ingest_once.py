"""How the ingest carries out a mutating call once per idempotency key, against a scripted
connection: the race with a copy that stored the key first, a copy still in progress, and a key
reused for another request."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest

from actors import idempotency, queries
from actors.ingest import ControlPlaneService
from runtime.errors import Busy, DatabaseBusy, DuplicateKey, IdempotencyConflict
from runtime.jobs import CommandRuntime, JobSpec, SleepRuntime


@attrs.define
class ScriptedConnection:
    """Answers each statement from ``script`` in turn (an exception is raised)."""

    script: list[Any]
    statements: list[tuple[str, tuple[Any, ...]]] = attrs.field(factory=list)

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        self.statements.append((sql, args))
        answer = self.script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def row(
    *, replayed: bool, answer: list[dict[str, Any]], rpc: str | None = None, digest: bytes | None = None
) -> Any:
    return {"replayed": replayed, "rpc": rpc, "request_sha256": digest, "answer": json.dumps(answer)}


SERVICE = ControlPlaneService(cp_id="cp-1", pool=None)  # type: ignore[arg-type]
DIGEST = idempotency.request_digest("submit_job", ["j"])


async def once(conn: ScriptedConnection, digest: bytes = DIGEST) -> Any:
    return await SERVICE._once(conn, "submit_job", queries.SUBMIT_JOB, "j", key="k-1", digest=digest)  # type: ignore[arg-type]


async def test_a_copy_that_stored_the_key_first_is_answered_from_the_key() -> None:
    """The statement broke the key's index (a copy committed after its snapshot): it rolled
    back whole, so it is run once more, and that run's stored answer is the call's."""
    conn = ScriptedConnection(
        [
            DuplicateKey(queries.IDEMPOTENCY_KEY_CONSTRAINT, "duplicate key value"),
            row(replayed=True, answer=[{"id": 17}], rpc="submit_job", digest=DIGEST),
        ]
    )
    done = await once(conn)
    assert (done.replayed, done.answer) == (True, [{"id": 17}])
    assert [args[-2:] for _, args in conn.statements] == [("k-1", DIGEST)] * 2


async def test_another_unique_index_is_not_taken_for_the_key() -> None:
    """A broken unique index other than the key's is an error of its own, not a copy."""
    conn = ScriptedConnection([DuplicateKey("jobs_pkey", "duplicate key value")])
    with pytest.raises(DuplicateKey, match="jobs_pkey"):
        await once(conn)
    assert len(conn.statements) == 1


async def test_a_statement_the_database_gave_up_on_is_busy_and_stored_nothing() -> None:
    """A lock wait past lock_timeout (a copy still in progress elsewhere holds the key) is
    answered busy, which the client backs off from and retries, saying nothing was stored."""
    conn = ScriptedConnection([DatabaseBusy("database busy: LockNotAvailableError('lock timeout')")])
    with pytest.raises(Busy) as info:
        await once(conn)
    message = str(info.value)
    assert message.startswith("busy: cp-1 could not carry out submit_job now")
    assert "another copy of this call may still be in progress; nothing was stored" in message


async def test_a_key_stored_for_another_request_is_refused_naming_its_job() -> None:
    """A replayed row whose digest or call differs from this request's is a conflict naming
    the job the first request created."""
    other = idempotency.request_digest("submit_job", ["other"])
    for stored in (
        row(replayed=True, answer=[{"id": 17}], rpc="submit_job", digest=other),
        row(replayed=True, answer=[{"id": 17}, {"id": 18}], rpc="submit_jobs", digest=DIGEST),
    ):
        with pytest.raises(IdempotencyConflict) as info:
            await once(ScriptedConnection([stored]))
        assert "idempotency_key 'k-1' was first used for submit_job" in str(info.value)
        assert "(it created job 17" in str(info.value) or "(it created jobs 17, 18)" in str(info.value)


def test_a_request_digest_does_not_depend_on_the_slices_and_covers_every_field() -> None:
    """The digest of a batch is the same however it is sliced, and changes with any field of
    any job (the name, the resources, the priority, the runtime)."""
    base = JobSpec(
        name="j", cpu_millis=500, memory_mb=256, priority=0, runtime=SleepRuntime(duration_ms=1000)
    )
    jobs = [base.check() for _ in range(5)]
    items = [idempotency.job_item(j) for j in jobs]
    whole = idempotency.request_digest("submit_jobs", items)
    for step in (1, 2, 5):
        steps = idempotency.digest_steps("submit_jobs", items, step_items=step)
        yields = 0
        while True:
            try:
                next(steps)
                yields += 1
            except StopIteration as done:
                assert done.value == whole
                break
        assert yields == 5 // step
    changes: list[dict[str, object]] = [
        {"name": "k"},
        {"cpu_millis": 501},
        {"memory_mb": 257},
        {"priority": 1},
        {"runtime": SleepRuntime(duration_ms=1001)},
        {"runtime": CommandRuntime(argv=["true"])},
        {"retry_on_exit": (1,), "max_attempts": 2},
        {"no_retry_on": ("timeout",), "max_attempts": 2},
        {"after_names": ("a",)},
    ]
    for change in changes:
        changed = [*items[:4], idempotency.job_item(attrs.evolve(base, **change).check())]  # type: ignore[arg-type]
        assert idempotency.request_digest("submit_jobs", changed) != whole
    assert idempotency.request_digest("submit_job", items) != whole


def test_a_jobs_digest_without_the_newer_fields_is_the_one_stored_before_them() -> None:
    """A job with no failure policy, max_failed_tasks or after_names enters a digest as its
    columns did before those existed, so a copy of a call sent across an upgrade is a copy."""
    job = JobSpec(name="j", cpu_millis=500, memory_mb=256, runtime=SleepRuntime(duration_ms=1000)).check()
    assert idempotency.job_item(job) == [
        *("j", 500, 256, 0, "sleep", 1000, None, None, 1, 1000, False, None, "[]", "{}", ""),
        *([], None, None, 0),
    ]
