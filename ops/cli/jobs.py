"""Client commands, through the Python client (:mod:`ops.client`): ``jobs``, ``submit``, ``run``,
``job``, ``list``, ``cancel``, ``status``. Input is checked with the control plane's own rules
(:mod:`runtime.validation`) before it is sent.
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from ops.cli.base import app
from ops.cli.common import (
    EXIT_TOO_LATE,
    answer_unknown,
    console,
    control_plane_addresses,
    errors,
    ha_db_line,
    idempotency_key_of,
    local_ha_db_dir,
    local_metrics,
    with_client,
)
from ops.cli.fast import MAX_SLEEP_S, spec_of_submit_options
from ops.cli.job_files import run, submit_specs
from ops.cli.options import ControlPlanesOption, IdempotencyKeyOption, JsonOption, quiet_option
from runtime import validation
from runtime.validation import JOB_STATES, MAX_LIST_LIMIT

if TYPE_CHECKING:
    from ops.cli.logs import OutputTail
    from ops.client import Client, Job, JobHistory

JOB_CPU_MILLIS = (250, 500, 1000, 2000, 4000)
JOB_MEMORY_MB = (128, 256, 512, 1024, 4096)
JOB_SLEEP_S = (2.0, 10.0)
"""The sizes and durations ``stockade jobs`` draws from."""
MAX_JOBS_COUNT = 100_000
"""Most jobs one ``stockade jobs`` submits (in batches of 10,000)."""


@app.command("jobs")
def jobs(
    count: Annotated[
        int, typer.Argument(min=1, max=MAX_JOBS_COUNT, help="How many sleep jobs to submit.")
    ] = 12,
    seed: Annotated[int, typer.Option(help="Seed of the random sizes and durations.")] = 1,
    idempotency_key: IdempotencyKeyOption = None,
    control_planes: ControlPlanesOption = None,
) -> None:
    """Submit COUNT sleep jobs of mixed sizes (250-4000 cpu_millis, 128-4096 MiB) and durations (2-10 s)."""
    from runtime.jobs import JobSpec, SleepRuntime

    with errors():
        addresses = control_plane_addresses(control_planes)
    rng = random.Random(seed)
    specs = []
    for index in range(1, count + 1):
        sleep_s = round(rng.uniform(*JOB_SLEEP_S), 1)
        specs.append(
            JobSpec(
                name=f"sleep-{index}",
                cpu_millis=rng.choice(JOB_CPU_MILLIS),
                memory_mb=rng.choice(JOB_MEMORY_MB),
                runtime=SleepRuntime(duration_ms=int(sleep_s * 1000)),
            )
        )
    with errors():
        ids = submit_specs(addresses, specs, key=idempotency_key_of(idempotency_key))
    from ops.cli.render import print_submitted

    print_submitted(ids, specs)


@app.command("submit", context_settings={"allow_interspersed_args": False})
def submit(
    cpu_millis: Annotated[int, typer.Option(help="CPU the job needs, millicores (1000 = one core).")],
    memory_mb: Annotated[int, typer.Option(help="Memory the job needs, MiB.")],
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The command to run on a worker (after --).", show_default=False),
    ] = None,
    sleep_s: Annotated[
        float | None,
        quiet_option(
            min=0,
            max=MAX_SLEEP_S,
            help="Submit a sleep job holding its resources this long, seconds (at most a week).",
        ),
    ] = None,
    image: Annotated[
        str | None,
        quiet_option(
            help="Run the command in a Docker container of this image (already on the workers: "
            "nothing is pulled); without a command, the image's own. Only workers labelled "
            "container=docker take it."
        ),
    ] = None,
    name: Annotated[
        str | None,
        quiet_option(help="Job name [default: the command's basename, the image's name, or sleep]."),
    ] = None,
    priority: Annotated[int, typer.Option(help="Higher runs first; ties by submission order.")] = 0,
    max_attempts: Annotated[
        str | None,
        quiet_option(
            metavar="N",
            help="Give up after N failed runs (1-100) [default: 1: no retry]: a run that exits "
            "non-zero, is OOM-killed or times out is placed again after its backoff until N have "
            "failed; runs lost with their worker do not count (unless --count-lost).",
        ),
    ] = None,
    retry_backoff_s: Annotated[
        str | None,
        quiet_option(
            metavar="S",
            help="The retry backoff's base, seconds (0-600) [default: 1]: the n-th retry waits a "
            "random time below S * 2^(n-1), capped at 600 s.",
        ),
    ] = None,
    count_lost: Annotated[
        bool,
        typer.Option(
            "--count-lost", help="A run lost with its worker (dead, cut off) spends an attempt too."
        ),
    ] = False,
    timeout_s: Annotated[
        str | None,
        quiet_option(
            metavar="S",
            help="Kill the job (its whole process tree or container) after S seconds of running "
            "and fail it with reason timeout (0.001 s to a week) [default: no limit].",
        ),
    ] = None,
    constraint: Annotated[
        list[str] | None,
        quiet_option(
            "--constraint",
            metavar="EXPR",
            help="Run only on workers whose labels satisfy EXPR: key=value, key!=value, key "
            "(exists) or 'key in (a,b)'; repeatable, all must hold.",
        ),
    ] = None,
    resource: Annotated[
        list[str] | None,
        quiet_option(
            "--resource",
            metavar="NAME=COUNT",
            help="Countable devices each run holds, whole units of one worker, e.g. --resource gpu=2; "
            "repeatable. The job gets their ids as STOCKADE_RESOURCE_<NAME> (and, for gpu, "
            "CUDA_VISIBLE_DEVICES) (docs/devices.md).",
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        quiet_option(
            "--env",
            metavar="NAME=VALUE",
            help="Set NAME in the job's environment (split at the first =); repeatable. Names "
            "must not hold = or NUL nor start with STOCKADE_.",
        ),
    ] = None,
    workdir: Annotated[
        str | None,
        quiet_option(
            metavar="DIR",
            help="The job's working directory, an absolute path that must exist on the worker "
            "[default: the job's own folder on the worker, <agent work dir>/jobs/<job>-<assignment>].",
        ),
    ] = None,
    after: Annotated[
        list[str] | None,
        quiet_option(
            "--after",
            metavar="ID[,ID...]",
            help="Start only once these jobs have all succeeded (cancelled if one fails); an "
            "array's id stands for all its tasks; repeatable.",
        ),
    ] = None,
    array: Annotated[
        str | None,
        quiet_option(
            metavar="FIRST-LAST[%N]",
            help="Submit an array of tasks, one per index (STOCKADE_ARRAY_INDEX in their "
            "environment; at most 10000), at most N running at once (e.g. 1-100%10).",
        ),
    ] = None,
    max_failed_tasks: Annotated[
        str | None,
        quiet_option(
            metavar="N",
            help="With --array: once N tasks have failed for good, cancel the tasks that have not "
            "ended and fail the array (1 to the array's tasks) [default: no limit].",
        ),
    ] = None,
    retry_on_exit: Annotated[
        list[str] | None,
        quiet_option(
            "--retry-on-exit",
            metavar="CODE[,CODE...]",
            help="Retry a failed run only when it exited with one of these codes (1-255); any "
            "other exit fails the job at once. Runs that fail for a reason (timeout, oom_killed) "
            "are judged by --no-retry-on instead. Repeatable [default: any exit code].",
        ),
    ] = None,
    no_retry_on: Annotated[
        list[str] | None,
        quiet_option(
            "--no-retry-on",
            metavar="REASON[,REASON...]",
            help="Fail the job at once when a run fails for one of these reasons: timeout, "
            "oom_killed, workdir_not_found, workdir_denied, command_not_found, image_not_found, "
            "no_container_engine, container_error, resources_error. Repeatable.",
        ),
    ] = None,
    tasks: Annotated[
        str | None,
        quiet_option(
            metavar="N",
            help="Submit a gang of N tasks (1-256) placed all or nothing, each with STOCKADE_GANG_RANK, "
            "STOCKADE_GANG_SIZE, STOCKADE_GANG_PORT and STOCKADE_GANG_PEERS; one failing stops the "
            "others and the gang runs again whole (docs/gangs.md).",
        ),
    ] = None,
    spread: Annotated[
        bool, typer.Option("--spread", help="Put a gang's tasks on distinct workers (with --tasks).")
    ] = False,
    idempotency_key: IdempotencyKeyOption = None,
    control_planes: ControlPlanesOption = None,
) -> None:
    """Submit one job, a command (stockade submit ... -- CMD ARGS...), a container (--image IMAGE
    [-- CMD ARGS...]) or a sleep (--sleep-s); print its id."""
    options = dict(locals())
    with errors():
        spec = spec_of_submit_options(options)
        (job_id,) = submit_specs(
            control_plane_addresses(control_planes), [spec], key=idempotency_key_of(idempotency_key)
        )
    console().print(job_id)


app.command("run")(run)


@app.command("job")
def job(
    job_id: Annotated[int, typer.Argument(help="The job's id.")],
    as_json: JsonOption = False,
    events: Annotated[
        bool,
        typer.Option(
            "--events",
            help="Print the job's history instead, oldest first: submitted, each placement (worker, "
            "incarnation, epoch), confirmation, end (reason, outcome, exit code, fenced epoch), the "
            "worker death that ended a run, requeues (with their backoff), the cancel request, "
            "dependency waits and its final state. With --json: a JSON list of events.",
        ),
    ] = False,
    control_planes: ControlPlanesOption = None,
) -> None:
    """Show one job: state, worker, assignment, times, its attempts and lifecycle settings, and
    the last lines of its stdout and stderr (read from its worker, from any host).

    --json prints the job as a job file (its fields: name, cpu_millis, memory_mb, priority, the
    runtime, max_attempts, retry_backoff_s, count_lost, timeout_s, constraints, env, workdir,
    after, array), plus a status object that `stockade run` ignores: job_id, state, reason,
    worker_id, assignment_id, epoch, attempts, failures, exit_code, the times (Unix s),
    array_id, array_index, array_counts, attempt_history, stdout_path, stderr_path, schedule and
    schedule_slot_unix_s (of a job a schedule fired) (null where there is none; the shape is
    ops.cli.render.job_json's). So `stockade job 7 --json >
    j.json && stockade run j.json` submits it again. It holds no output: read the paths.
    """
    if events:
        _job_events(job_id, as_json=as_json, control_planes=control_planes)
        return

    async def body(client: Client) -> tuple[Job, list[OutputTail]]:
        from ops.cli.logs import output_tails
        from runtime.jobs import SleepRuntime

        info = await client.get(job_id)
        if (
            as_json
            or not info.started_unix_s
            or info.spec is None
            or isinstance(info.spec.runtime, SleepRuntime)
        ):
            return info, []  # a job that never started, or a sleep, has no output
        return info, await output_tails(client, job_id)

    with errors():
        validation.check_job_id(job_id)
        info, tails = with_client(control_plane_addresses(control_planes), body)
    if as_json:
        from ops.cli.render import job_json

        sys.stdout.write(json.dumps(job_json(info), indent=2) + "\n")
        return
    from ops.cli.job_view import print_job

    print_job(info, tails)


def _job_events(job_id: int, *, as_json: bool, control_planes: str | None) -> None:
    """``stockade job ID --events``: the job's history as a table or a JSON list."""
    with errors():
        validation.check_job_id(job_id)
        history: JobHistory = with_client(
            control_plane_addresses(control_planes), lambda client: client.events(job_id)
        )
    if as_json:
        from ops.cli.job_view import events_json

        sys.stdout.write(json.dumps(events_json(history), indent=2) + "\n")
        return
    from ops.cli.job_view import events_table

    console().print(events_table(history))


@app.command("list")
def list_jobs(
    state: Annotated[
        str | None, quiet_option(help=f"Only jobs in this state ({', '.join(JOB_STATES)}).")
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            min=0,
            max=MAX_LIST_LIMIT,
            help="At most this many jobs, newest first (0: 100, as the API counts it).",
        ),
    ] = 50,
    account: Annotated[
        str | None,
        quiet_option(help="Only this account's jobs (operators and viewers; a user sees its own only)."),
    ] = None,
    as_json: JsonOption = False,
    control_planes: ControlPlanesOption = None,
) -> None:
    """List jobs in a table, newest first, with the account that owns each.

    --json prints {"jobs": [...]}, each job the object `stockade job --json` prints.
    """
    with errors():
        validation.check_list(state or "", limit)
        if account is not None:
            from runtime.identifiers import check_id

            check_id(account, field="account")
        jobs = with_client(
            control_plane_addresses(control_planes),
            lambda client: client.list(state=state, limit=limit, account=account),
        )
    if as_json:
        from ops.cli.render import list_json

        sys.stdout.write(json.dumps(list_json(jobs), indent=2) + "\n")
        return
    from ops.cli.render import print_jobs

    print_jobs(jobs)


app.command("jobs-list", hidden=True)(list_jobs)


CANCEL_POLL_S = 0.2
"""How often ``stockade cancel`` asks for the job's state while it waits, in seconds."""


async def _cancel(
    client: Client, job_id: int, *, task_only: bool, wait_s: float, key: str
) -> tuple[Job | None, int, int | None]:
    """``stockade cancel``'s call: cancel the job (or array, or gang), then read it until it has
    ended (every task of an array), at most ``wait_s``: the job as last read (None: ``wait_s``
    passed first), how many tasks of an array or a gang the cancel reached (0: a job), and the
    gang's id when ``job_id`` is a gang's task (None: not one)."""
    import trio

    from ops.client.results import OPEN_STATES
    from runtime.errors import TemporaryError

    outcome = await client.cancel(job_id, only_this_task=task_only, idempotency_key=key)
    first = await client.get(job_id)
    gang_id = None if first.gang is None else first.gang.gang_id

    def ended(job: Job) -> bool:
        if outcome.tasks and gang_id is None:
            return not any(count for state, count in job.array_counts if state in OPEN_STATES)
        return job.ended

    if outcome.state != "cancelling":
        return first, outcome.tasks, gang_id
    with trio.move_on_after(wait_s):
        while True:
            with contextlib.suppress(TemporaryError):  # a replica failing over: ask again
                job = await client.get(job_id)
                if ended(job):
                    return job, outcome.tasks, gang_id
            await trio.sleep(CANCEL_POLL_S)
    return None, outcome.tasks, gang_id


def gang_cancel_verdict(gang_id: int, tasks: int, job: Job | None) -> str:
    """What a cancel of ``tasks`` tasks of a gang came to (``gang 118: 4 tasks cancelled``);
    ``job`` (the task named, or None: the wait ran out) tells whether they ended."""
    if job is not None and job.ended:
        return f"gang {gang_id}: {tasks} tasks cancelled"
    return f"gang {gang_id}: cancelling {tasks} tasks"


@app.command("cancel")
def cancel(
    job_id: Annotated[int, typer.Argument(help="The job's id, or an array's (every task of it).")],
    wait_s: Annotated[
        float,
        typer.Option(
            "--wait-s",
            min=0,
            help="Seconds to wait for a placed job to end, to say whether the cancel stopped it "
            "or it ended on its own first; 0 answers at once (cancelling).",
        ),
    ] = 10.0,
    task_only: Annotated[
        bool,
        typer.Option(
            "--task-only",
            help="ID is the first task of an array (its id is the array's): cancel that task "
            "alone, not the whole array.",
        ),
    ] = False,
    idempotency_key: IdempotencyKeyOption = None,
    control_planes: ControlPlanesOption = None,
) -> None:
    """Cancel a job: at once while pending or waiting, through its worker once placed. The id
    of an array cancels every task of it that has not ended (another task's id: that task); any
    task of a gang cancels the whole gang (``gang 118: 4 tasks cancelled``).

    Says what happened: ``cancelled``; or, when the job ended on its own before its worker
    got the cancel, its real end (``succeeded`` or ``failed``, with the exit code), which
    stands, and exits 3 (too late); or ``cancelling`` when ``--wait-s`` passed first.
    """
    from ops.cli.render import array_cancel_verdict, cancel_verdict

    with errors():
        validation.check_job_id(job_id)
        key = idempotency_key_of(idempotency_key)
        with answer_unknown(key, "recorded the cancel"):
            job, array_tasks, gang_id = with_client(
                control_plane_addresses(control_planes),
                lambda client: _cancel(client, job_id, task_only=task_only, wait_s=wait_s, key=key),
            )
    if array_tasks and gang_id is not None:
        console().print(gang_cancel_verdict(gang_id, array_tasks, job))
        return
    if array_tasks:
        console().print(array_cancel_verdict(job_id, array_tasks, job))
        return
    if job is None:
        console().print(f"job {job_id}: cancelling")
        return
    console().print(cancel_verdict(job_id, job))
    if job.state in ("succeeded", "failed"):
        raise typer.Exit(EXIT_TOO_LATE)


@app.command("status")
def status(as_json: JsonOption = False, control_planes: ControlPlanesOption = None) -> None:
    """Show the leader and its epoch, the control planes, the workers with their load, the jobs.

    --json prints one object: leader, epoch, control_planes, workers, jobs (counts by state),
    unschedulable, metrics (the shape is ops.cli.render.status_json's). For a local cluster
    (one `stockade up` started) it also shows where each process serves Prometheus metrics.
    """
    with errors():
        addresses = control_plane_addresses(control_planes)
        reply = with_client(addresses, lambda client: client.status())
    from ops.cli.render import render_status, status_json

    metrics = local_metrics(addresses)
    if as_json:
        sys.stdout.write(json.dumps(status_json(reply, metrics), indent=2) + "\n")
        return
    console().print(render_status(reply, metrics))
    hadb_dir = local_ha_db_dir(addresses)
    if hadb_dir is not None:
        console().print(ha_db_line(hadb_dir), soft_wrap=True)
