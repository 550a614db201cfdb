"""The pending queue of ``stockade bench pack``'s scale curve (:func:`seed_queue`): single jobs,
some asking gpu, with gangs among them, submitted the way SubmitJob stores one.
"""

from __future__ import annotations

import itertools
import json
import random
import uuid

import attrs

from actors import idempotency, queries
from runtime.aio import PgConnection
from runtime.aio.grpc_access import audit_params
from runtime.errors import InvalidArgument
from runtime.jobs import JobSpec, SleepRuntime

CPU_MILLIS = (250, 500, 1000, 2000, 4000)
"""The sizes the queue's jobs cycle through (the i-th single job: ``CPU_MILLIS[i % 5]``)."""
MEMORY_MB = (256, 512, 1024, 2048)
GANG_TASKS = (2, 8)
"""The fewest and most tasks of one of the queue's gangs."""
SPREAD_EVERY = 3
"""Every third gang (the first included) spreads its tasks over distinct workers."""

# $1 the first single job's index, $2 the last, $3 accounts, $4 how many of each hundred
# indexes ask gpu (i % 100 below it: 1 to 4 gpu). Sizes, owner and devices follow the index, so
# a queue without gangs is the same whatever the chunks it is stored in.
INSERT_SINGLE_JOBS = """
INSERT INTO jobs (name, cpu_millis, memory_mb, runtime, sleep_ms, pending_seq, owner, resources)
SELECT 'scale', (ARRAY[250,500,1000,2000,4000])[1 + i % 5], (ARRAY[256,512,1024,2048])[1 + i % 4],
       'sleep', 1000, nextval('pending_seq'), 'account-' || (i % $3),
       CASE WHEN i % 100 < $4 THEN jsonb_build_object('gpu', 1 + i % 4) ELSE '{}'::jsonb END
  FROM generate_series($1::int, $2::int) i
"""


def check_shares(device_share: float, gang_share: float) -> None:
    """Refuse a device share and a gang share that do not fit one queue: each 0 to 1, and at
    most 1 together (the jobs asking gpu are single jobs; the gangs ask none).

    Raises:
        InvalidArgument: naming ``--device-share`` or ``--gang-share``, the value and the limit.
    """
    for field, share in (("--device-share", device_share), ("--gang-share", gang_share)):
        if not 0.0 <= share <= 1.0:
            raise InvalidArgument(field, share, "must be between 0 and 1")
    if device_share + gang_share > 1.0:
        raise InvalidArgument(
            "--gang-share",
            gang_share,
            f"must be at most 1 - --device-share {device_share:g} = {1 - device_share:g} "
            "(the jobs asking gpu are single jobs)",
        )


def gang_sizes(tasks: int, rng: random.Random) -> list[int]:
    """Gang sizes, each drawn from :data:`GANG_TASKS`'s range, that add up to ``tasks`` (one
    task short when ``tasks`` is 1: no gang of one)."""
    low, high = GANG_TASKS
    sizes: list[int] = []
    left = tasks
    while left >= low:
        size = min(rng.randint(low, high), left)
        if left - size == 1:  # never leave one task alone
            size = size - 1 if size > low else size + 1
        sizes.append(size)
        left -= size
    return sizes


def gang_spec(k: int, size: int) -> JobSpec:
    """The ``k``-th gang of the queue (from 0): ``size`` sleep tasks of 1 s, sized as the single
    jobs (by ``k``), spread when ``k`` is a multiple of :data:`SPREAD_EVERY`; checked."""
    return JobSpec(
        name="scale-gang",
        cpu_millis=CPU_MILLIS[k % len(CPU_MILLIS)],
        memory_mb=MEMORY_MB[k % len(MEMORY_MB)],
        runtime=SleepRuntime(duration_ms=1000),
        tasks=size,
        spread=k % SPREAD_EVERY == 0,
    ).check()


async def submit_gang(db: PgConnection, spec: JobSpec, owner: str) -> int:
    """Store the gang ``spec`` for ``owner`` by SubmitJob's statement (queries.SUBMIT_JOB, with
    the arguments an operator's SubmitJob gives it, a fresh idempotency key); returns its id.

    Raises:
        RuntimeError: the statement stored nothing.
    """
    args = (
        *attrs.astuple(queries.job_columns(spec)),
        owner,
        None,  # scope: an operator may name any job
        None,  # not held to a max_priority
        queries.resources_json(spec),
        spec.tasks,
        spec.spread,
        *audit_params({"name": spec.name}),
    )
    digest = idempotency.request_digest("submit_job", [idempotency.job_item(spec)])
    row = await db.fetchrow(queries.SUBMIT_JOB, *args, str(uuid.uuid4()), digest)
    answer = json.loads(row["answer"]) if row is not None else []
    if not answer or int(answer[0]["tasks"]) != spec.tasks:
        raise RuntimeError(f"SubmitJob's statement stored no gang of {spec.tasks} tasks: {answer}")
    return int(answer[0]["id"])


async def seed_queue(
    db: PgConnection,
    *,
    pending: int,
    accounts: int,
    device_share: float,
    gang_share: float,
    rng: random.Random,
) -> int:
    """Store ``pending`` pending jobs (``accounts`` owners, round-robin; at least 1): about
    ``gang_share`` of them tasks of gangs (:func:`gang_sizes`, :func:`gang_spec`; gang ``k``
    owned by account ``k % accounts``) spaced evenly through the queue's order, the rest single
    jobs of which about ``device_share`` of ``pending`` ask 1 to 4 gpu (the first indexes of
    each hundred, as many as that takes). Without gangs the i-th job (from 1) is
    ``CPU_MILLIS[i % 5]`` cpu_millis and ``MEMORY_MB[i % 4]`` MiB.

    Returns:
        How many of the jobs are gang tasks.

    Raises:
        InvalidArgument: the shares do not fit (:func:`check_shares`).
    """
    check_shares(device_share, gang_share)
    sizes = gang_sizes(round(gang_share * pending), rng)
    singles = pending - sum(sizes)
    per_hundred = min(100, round(100 * device_share * pending / singles)) if singles else 0
    # Single jobs 1..singles in len(sizes) + 1 chunks, a gang after each chunk but the last.
    bounds = [round(k * singles / (len(sizes) + 1)) for k in range(len(sizes) + 2)]
    for k, (first, last) in enumerate(itertools.pairwise(bounds)):
        if last > first:
            await db.execute(INSERT_SINGLE_JOBS, first + 1, last, accounts, per_hundred)
        if k < len(sizes):
            await submit_gang(db, gang_spec(k, sizes[k]), f"account-{k % accounts}")
    return sum(sizes)
