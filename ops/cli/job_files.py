"""``stockade run``: a job file's jobs, arrays and schedules submitted all or none
(:mod:`ops.jobfile`), registered on the app by :mod:`ops.cli.jobs` in its place among the job
commands.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ops.cli.common import (
    EXIT_INVALID,
    answer_unknown,
    batch_keys,
    console,
    control_plane_addresses,
    errors,
    fail,
    idempotency_key_of,
    sole_error,
    with_client,
)
from ops.cli.options import ControlPlanesOption, IdempotencyKeyOption, quiet_option
from runtime import validation
from runtime.errors import InvalidArgument

if TYPE_CHECKING:
    from ops.client import Client
    from ops.jobfile import FileSchedule
    from runtime.jobs import JobSpec


def submit_specs(addresses: list[str], specs: list[JobSpec], *, key: str) -> list[int]:
    """Submit ``specs``: one job with SubmitJob, more in batches of 10,000 with SubmitJobs, each
    batch all or none, under ``key`` (:func:`batch_keys` for more than one batch)."""

    async def body(client: Client) -> list[int]:
        if len(specs) == 1:
            return [await client.submit(specs[0], idempotency_key=key)]
        ids: list[int] = []
        starts = range(0, len(specs), validation.MAX_BATCH_JOBS)
        for start, batch_key in zip(starts, batch_keys(key, len(starts)), strict=True):
            batch = specs[start : start + validation.MAX_BATCH_JOBS]
            ids.extend(await client.submit_many(batch, idempotency_key=batch_key))
        return ids

    with answer_unknown(key, "stored the jobs" if len(specs) > 1 else "stored the job"):
        return with_client(addresses, body)


def run(
    path: Annotated[
        str,
        typer.Argument(
            metavar="FILE",
            help="A job file: .toml, .yaml, .yml or .json (- reads standard input as YAML or JSON).",
            show_default=False,
        ),
    ],
    text_format: Annotated[
        str | None,
        quiet_option(
            "--format",
            metavar="toml|yaml",
            help="Read FILE as TOML or YAML (JSON is YAML) whatever its name.",
        ),
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Check the file and print its jobs; submit nothing.")
    ] = False,
    idempotency_key: IdempotencyKeyOption = None,
    control_planes: ControlPlanesOption = None,
) -> None:
    """Submit the jobs of a job file, all or none; print their ids, one a line (--check: the
    jobs as JSON, nothing submitted).

    A job is a table of fields named as submit's options (max_attempts for --max-attempts;
    constraints and env are lists and tables): name, cpu_millis and memory_mb (required),
    priority, one runtime (sleep_s, command as a list, or image with an optional command),
    max_attempts, retry_backoff_s, count_lost, timeout_s, constraints, env, workdir, after,
    array, max_failed_tasks, retry_on_exit, no_retry_on. A file holds one job (its fields at the
    top level) or several ([[job]] tables in TOML, a list under job: or at the top level in
    YAML), at most 10000 and 1 MiB; a status table (what `stockade job ID --json` reports) is
    ignored, so that output can be run again. A file may hold a pipeline: arrays beside other
    jobs, and after naming jobs of the file by name (after = ["prepare", 12]), stored in one
    transaction, each after those it names; a cycle is refused (after: cycle a -> b -> a).
    A top-level schedules list adds periodic jobs (name, cron, tz, concurrency_policy,
    starting_deadline_s, and job: a job's table; docs/schedules.md), each once, after the
    jobs; the file is refused whole when a schedule of one of its names exists (without
    --idempotency-key), and a schedule refused later is reported with what was stored.
    Errors name the file and line: jobs.toml:7: max_attempts must be between 1 and 100, got 0.
    """
    from ops import jobfile
    from ops.jobfields import fields_of

    if text_format is not None and text_format not in ("toml", "yaml"):
        fail(f"--format must be toml or yaml, got {text_format!r}", EXIT_INVALID)
    with errors():
        specs, where, schedules = jobfile.read_job_file_and_schedules(path, text_format=text_format)
    if check:
        shown: list[dict[str, Any]] = [fields_of(spec) for spec in specs]
        shown += [
            {**{f: getattr(s, f) for f in jobfile.SCHEDULE_FIELDS if f != "job"}, "job": fields_of(s.job)}
            for s in schedules
        ]
        sys.stdout.write(json.dumps(shown, indent=2) + "\n")
        return
    key = idempotency_key_of(idempotency_key)
    with errors():
        addresses = control_plane_addresses(control_planes)
        if schedules and idempotency_key is None:
            # A fresh key: nothing of this run can exist yet, so a schedule of its name is
            # another's and the whole file is refused before anything is stored. (Run again
            # under its key, a file finds its own schedules: the cluster answers each once.)
            _refuse_existing_schedules(addresses, schedules)
        try:
            ids = submit_specs(addresses, specs, key=key) if specs else []
        except InvalidArgument as exc:
            raise _placed_in_file(exc, specs, where) from None
        added: list[str] = []
        for schedule, schedule_key in zip(
            schedules, batch_keys(f"{key}/schedules", len(schedules)) if schedules else [], strict=True
        ):
            try:
                # the command's own key: run again under it, the file's jobs and schedules
                # are answered again (each schedule's key is derived from it), not stored twice
                with answer_unknown(key, f"stored schedule {schedule.name!r}"):
                    _add_file_schedule(addresses, schedule, schedule_key)
            except Exception as raised:
                if ids or added:
                    for job_id in ids:  # stored: print them, as a run that ends well does
                        console().print(job_id)
                    for name in added:
                        console().print(f"schedule {name}")
                    sole_error(raised).add_note(
                        _partly_stored(key, ids, added, schedules[len(added) :], raised)
                    )
                raise
            added.append(schedule.name)
    for job_id in ids:
        console().print(job_id)
    for schedule in schedules:
        console().print(f"schedule {schedule.name}")


def _refuse_existing_schedules(addresses: list[str], schedules: list[FileSchedule]) -> None:
    """Refuse a job file, before anything of it is stored, when a schedule of one of its names
    exists (of those the caller may see: another account's is found when it is added).

    Raises:
        FailedPrecondition: ``schedule 'tick2' exists: nothing was stored; ...``.
    """
    from runtime.errors import FailedPrecondition

    async def body(client: Client) -> set[str]:
        return {s.name for s in await client.schedules()}

    existing = with_client(addresses, body)
    taken = [s.name for s in schedules if s.name in existing]
    if taken:
        names = ", ".join(repr(n) for n in taken)
        raise FailedPrecondition(
            f"schedule {names} exists: nothing was stored (neither the file's jobs nor its "
            f"schedules); remove it first (stockade schedule remove {taken[0]}) or choose another name"
            if len(taken) == 1
            else f"schedules {names} exist: nothing was stored (neither the file's jobs nor its "
            "schedules); remove them first (stockade schedule remove NAME) or choose other names"
        )


def _partly_stored(
    key: str, ids: list[int], added: list[str], rest: list[FileSchedule], raised: BaseException
) -> str:
    """What a job file's run stored before one of its schedules failed, and what it did not:
    ``This file is partly stored: before schedule 'tick2' failed, jobs 12, 13 and schedule
    'tick1' were stored (printed on stdout); not stored: 'tick2', 'tick3'; ...`` (a schedule
    whose call got no answer ``may or may not be stored``)."""
    from runtime.errors import Unavailable

    stored = []
    if ids:
        stored.append(("job " if len(ids) == 1 else "jobs ") + ", ".join(str(i) for i in ids))
    if added:
        stored.append(("schedule " if len(added) == 1 else "schedules ") + ", ".join(repr(n) for n in added))
    failed, later = rest[0], rest[1:]
    unknown = isinstance(sole_error(raised), Unavailable)
    words = (
        f"This file is partly stored: before schedule {failed.name!r} failed, {' and '.join(stored)}"
        f" {'was' if len(ids) + len(added) == 1 else 'were'} stored (printed on stdout); "
    )
    words += (
        f"schedule {failed.name!r} may or may not be stored" if unknown else f"not stored: {failed.name!r}"
    )
    if later:
        words += (", " if not unknown else "; not stored: ") + ", ".join(repr(s.name) for s in later)
    return words + (
        "; add those not stored with `stockade schedule add` or a file of only them (running this"
        f" file again stores its jobs again, unless under --idempotency-key {key})"
    )


def _add_file_schedule(addresses: list[str], schedule: FileSchedule, key: str) -> None:
    """Add one schedule of a job file under ``key``."""

    async def body(client: Client) -> None:
        await client.add_schedule(
            schedule.name,
            cron=schedule.cron,
            tz=schedule.tz,
            job=schedule.job,
            concurrency_policy=schedule.concurrency_policy,
            starting_deadline_s=schedule.starting_deadline_s,
            idempotency_key=key,
        )

    with_client(addresses, body)


def _placed_in_file(
    exc: InvalidArgument, specs: list[JobSpec], where: Callable[[int, str], str]
) -> InvalidArgument:
    """A cluster's refusal of a job file's ``after`` (a job that does not exist), placed at the
    file and line of the first job naming it (``jobs.toml:4: after must name jobs that
    exist...``); any other refusal as it came."""
    from ops.jobfile import JobFileError

    text = str(exc)
    missing = re.search(r"\bno job (\d+)", text)
    if not text.startswith("after ") or missing is None:
        return exc
    index = next((i for i, spec in enumerate(specs) if int(missing[1]) in spec.after), None)
    if index is None:
        return exc
    return JobFileError(where(index, "after"), text, field="after", value=specs[index].after)
