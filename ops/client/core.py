"""The client's calls, written once in trio (:class:`Client`; :class:`ops.client.AsyncioClient`
runs them for asyncio). Each goes through :class:`runtime.client.ControlPlaneClient` (failover,
hedged reads, busy backoff), each mutating call carries an idempotency key, and input is checked
with the control plane's own rules before anything is sent (docs/client.md).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from ops.client.admin_results import Account, AuditEntry, account_from_pb, audit_from_pb
from ops.client.checks import check_account, check_job_id, check_key, check_seconds, is_int_in
from ops.client.errors import JobNotFound, WaitTimedOut, raised_as
from ops.client.results import (
    CancelOutcome,
    ClusterStatus,
    Job,
    JobHistory,
    cancel_from_pb,
    history_from_pb,
    job_from_pb,
    status_from_pb,
)
from ops.client.schedule_calls import ScheduleCalls
from ops.client.settings import ClientSettings
from ops.client.streams import WAIT_POLL, LogStream
from ops.client.worker_calls import WorkerCalls
from runtime import validation
from runtime.client import ControlPlaneClient
from runtime.errors import (
    ClusterBusy,
    InvalidArgument,
    NoControlPlaneReachable,
)
from runtime.jobs import JobSpec

if TYPE_CHECKING:
    from protocol import pb


SUBMIT_S_PER_JOB = 0.005
"""Added to a batch submission's deadline per job, in seconds: a control plane checks, digests
and stores a batch at 1 to 3 ms a job on a loaded 2-core machine (a 2,000-job file took 4 to
19 s beside a running cluster), so a fixed deadline, or one of 1 ms a job, would time a full
batch out and the caller's retry would store nothing either."""

WAIT_UNREACHABLE_S = 30.0
"""How long :meth:`Client.wait` goes on reading while no control plane answers, in seconds."""

LOG_STREAMS = ("stdout", "stderr")
"""The outputs of a job :meth:`Client.logs` reads."""
MAX_TAIL_BYTES = 2**64 - 1
"""The most ``tail_max_bytes`` may be (the wire's uint64)."""


class Client(WorkerCalls, ScheduleCalls):
    """A client of one Stockade cluster, for trio programs; open it with :meth:`open` (made
    directly, it needs :func:`runtime.aio.asyncio_bridge` around its calls and :meth:`close`).

    Every method is a coroutine (but :meth:`logs`, an async iterator), safe from several tasks
    at once; results are frozen attrs classes (:mod:`ops.client.results`). The calls on workers
    and on schedules are written in :class:`ops.client.worker_calls.WorkerCalls` and
    :class:`ops.client.schedule_calls.ScheduleCalls`.

    Args:
        settings: where the cluster is and what to present (:meth:`ClientSettings.find`).

    Raises:
        InvalidArgument: no address, or one that is not ``host:port``.
        runtime.tls.TlsFilesInvalid, runtime.tls.KeyFileExposed: a certificate file is
            missing, not PEM, or its key is readable by others.
    """

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self._cp = ControlPlaneClient(
            settings.control_planes,
            timeout_s=settings.timeout_s,
            busy_retry_s=settings.busy_retry_s,
            tls=settings.tls,
        )

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: ClientSettings | None = None) -> AsyncIterator[Client]:
        """``async with Client.open() as client:`` a client, closed at the end of the block.

        Opens the trio-asyncio loop grpclib needs (:func:`runtime.aio.asyncio_bridge`) unless
        the task has one; call the client from this task or tasks started inside the block. An
        error raised in the block comes out as itself, not in an exception group.

        Args:
            settings: where the cluster is and what to present; None:
                :meth:`ClientSettings.find` (as ``stockade``'s commands find them).

        Raises:
            ops.config.ClusterError: ``settings`` is None and no control plane is named
                anywhere (or the config cannot be read).
            InvalidArgument, runtime.tls.TlsFilesInvalid, runtime.tls.KeyFileExposed: as
                :class:`Client`.
        """
        from runtime.aio import asyncio_bridge, asyncio_bridge_open

        client = cls(ClientSettings.find() if settings is None else settings)
        failed: Exception | None = None
        async with contextlib.nullcontext() if asyncio_bridge_open() else asyncio_bridge():
            try:
                yield client
            except Exception as exc:
                # Raised again below, outside the bridge's nursery: as itself, not in a group.
                failed = exc
            finally:
                client.close()  # inside the bridge: closing a connection needs its loop
        if failed is not None:
            raise failed

    def close(self) -> None:
        """Close the connections to the control planes (idempotent)."""
        self._cp.close()

    @property
    def last_answered(self) -> str:
        """The ``host:port`` of the control plane that answered last (asked first next)."""
        return self._cp.last_answered

    # ------------------------------------------------------------------ jobs

    async def submit(self, spec: JobSpec, *, idempotency_key: str | None = None) -> int:
        """Submit one job (or, when ``spec.array`` is set, an array of tasks); return its id.

        Args:
            spec: the job (:func:`ops.client.job_spec` builds one from a job file's fields).
            idempotency_key: this call's key, 1 to 128 bytes (default: a fresh random UUID).
                The same key again within 24 hours returns the first call's id, storing nothing.

        Returns:
            the job's id; of an array, the array's (its first task's).

        Raises:
            InvalidArgument: the spec breaks a rule (:meth:`runtime.jobs.JobSpec.check`, the
                field named as on the wire: ``sleep.duration_ms``) or the key is bad, so nothing
                was sent; or a control plane refused it (``after`` naming no job).
            IdempotencyConflict: the key was first used for another request; nothing stored.
            NoControlPlaneReachable: no control plane answered (one may have stored the job:
                submit again with the same key to learn its id).
            ClusterBusy: every control plane stayed busy for ``busy_retry_s``; nothing stored.
            PermissionDenied: this client's certificate may not submit (a ``viewer``).
        """
        from protocol import pb
        from runtime.wire_jobs import job_spec_to_pb

        checked = spec.check()
        request = pb.SubmitJobRequest(
            spec=job_spec_to_pb(checked), idempotency_key=check_key(idempotency_key)
        )
        reply: pb.SubmitJobReply = await self._cp.call("submit_job", request)
        return int(reply.job_id)

    async def submit_many(
        self, specs: Sequence[JobSpec], *, idempotency_key: str | None = None
    ) -> tuple[int, ...]:
        """Submit up to 10,000 jobs in one call, stored all or none in one transaction; return
        their ids in order. Jobs may name others of the call in ``after_names`` (a pipeline):
        they are stored after those, which the transaction resolves to the ids it assigns.

        Args:
            specs: the jobs, 1 to 10,000, arrays and gangs among them (10,000 rows with each
                array's and gang's tasks counted).
            idempotency_key: this call's key, as in :meth:`submit`.

        Returns:
            one id per spec, in the order of ``specs``.

        Raises:
            InvalidArgument: no spec, more than 10,000 (rows), a spec that breaks a rule (the
                field named with its index: ``specs[3].cpu_millis``), or names that do not
                resolve (``specs[2].after_names`` ... ``after: cycle a -> b -> a``; a name two
                jobs share; a name no job has); nothing was sent.
            IdempotencyConflict, NoControlPlaneReachable, ClusterBusy, PermissionDenied: as
                :meth:`submit` (none of the jobs was stored, or all were).
        """
        from protocol import pb
        from runtime.wire_jobs import job_spec_to_pb

        checked = validation.check_jobs(list(specs))
        request = pb.SubmitJobsRequest(
            specs=[job_spec_to_pb(spec) for spec in checked], idempotency_key=check_key(idempotency_key)
        )
        reply: pb.SubmitJobsReply = await self._cp.call(
            "submit_jobs", request, timeout_s=self.settings.timeout_s + SUBMIT_S_PER_JOB * len(checked)
        )
        return tuple(int(job_id) for job_id in reply.job_ids)

    async def get(self, job_id: int) -> Job:
        """The job ``job_id`` as the cluster reports it now.

        Raises:
            InvalidArgument: ``job_id`` outside 1..2**63-1; nothing was sent.
            JobNotFound: no job has this id.
            NoControlPlaneReachable, ClusterBusy, PermissionDenied: as :meth:`submit`.
        """
        from protocol import pb

        return job_from_pb(await self._job_call("get_job", pb.GetJobRequest, job_id))

    async def events(self, job_id: int) -> JobHistory:
        """The job ``job_id``'s history from the database, oldest first (:class:`JobEvent` lists
        the kinds of event and what each carries).

        Raises:
            InvalidArgument: ``job_id`` outside 1..2**63-1; nothing was sent.
            JobNotFound: no job has this id.
            NoControlPlaneReachable, ClusterBusy, PermissionDenied: as :meth:`submit`.
        """
        from protocol import pb

        return history_from_pb(await self._job_call("get_job_events", pb.GetJobEventsRequest, job_id))

    async def _job_call(self, rpc: str, make_request: Callable[..., Any], job_id: int) -> Any:
        """A read of one job: ``job_id`` checked, sent, NotFound raised as JobNotFound."""
        check_job_id(job_id)
        with raised_as(functools.partial(JobNotFound, job_id)):
            return await self._cp.call(rpc, make_request(job_id=job_id))

    async def wait(self, job_id: int, *, timeout_s: float | None = None) -> Job:
        """Wait until the job ``job_id`` has ended and return it as it ended.

        Reads the job at once, then after 0.1 s, 0.2 s, ... doubling to 2 s (:data:`WAIT_POLL`).
        While no control plane answers it keeps reading for :data:`WAIT_UNREACHABLE_S`. For an
        array's id it waits for that task (``array_counts`` tell how the others stand).

        Args:
            job_id: the job.
            timeout_s: give up after this many seconds; None: wait as long as the job runs.

        Raises:
            InvalidArgument: a bad ``job_id`` or ``timeout_s``; nothing was sent.
            JobNotFound: no job has this id.
            WaitTimedOut: ``timeout_s`` passed first (a :class:`TimeoutError`; ``last`` is the
                job as last read); the job goes on.
            NoControlPlaneReachable: no control plane answered for :data:`WAIT_UNREACHABLE_S`.
            ClusterBusy, PermissionDenied: as :meth:`submit`.
        """
        check_job_id(job_id)
        limit_s = check_seconds("timeout_s", timeout_s)
        last: Job | None = None
        unreachable_since: float | None = None
        reads = 0
        # The deadline holds whatever is in progress when it passes (a slow read included).
        with trio.move_on_after(limit_s):
            while True:
                try:
                    job = await self.get(job_id)
                except NoControlPlaneReachable as exc:
                    # ClusterBusy has had its own backoff already; a cluster that answers no
                    # one (restarting) is read again, for a while.
                    now = trio.current_time()
                    unreachable_since = now if unreachable_since is None else unreachable_since
                    if isinstance(exc, ClusterBusy) or now - unreachable_since >= WAIT_UNREACHABLE_S:
                        raise
                else:
                    if job.ended:
                        return job
                    last, unreachable_since = job, None
                await trio.sleep(WAIT_POLL.ceiling_s(reads))
                reads += 1
        raise WaitTimedOut(job_id, limit_s, last)

    async def cancel(
        self, job_id: int, *, only_this_task: bool = False, idempotency_key: str | None = None
    ) -> CancelOutcome:
        """Cancel a job: at once while waiting or pending, through its worker once placed (the
        outcome says ``cancelling``: :meth:`wait` for its end). An array's id cancels its tasks.

        Args:
            job_id: the job, or an array's id.
            only_this_task: cancel only the job ``job_id`` even when it is an array's first task.
            idempotency_key: this call's key, as in :meth:`submit`.

        Raises:
            InvalidArgument: a bad ``job_id`` or key; nothing was sent.
            JobNotFound: no job has this id.
            IdempotencyConflict, NoControlPlaneReachable, ClusterBusy, PermissionDenied: as
                :meth:`submit`.
        """
        from protocol import pb

        check_job_id(job_id)
        request = pb.CancelJobRequest(
            job_id=job_id, idempotency_key=check_key(idempotency_key), only_this_task=only_this_task
        )
        with raised_as(functools.partial(JobNotFound, job_id)):
            reply: pb.CancelJobReply = await self._cp.call("cancel_job", request)
        return cancel_from_pb(job_id, reply)

    async def list(
        self, *, state: str | None = None, limit: int = 100, account: str | None = None
    ) -> tuple[Job, ...]:
        """The newest jobs, newest first.

        Args:
            state: only jobs in this state (``waiting``, ``pending``, ``assigned``,
                ``running``, ``succeeded``, ``failed``, ``cancelled``); None: every state.
            limit: at most this many jobs, 0 to 10,000 (0: 100).
            account: only this account's jobs; None: every account this client may see (a
                user's certificate sees its own only).

        Raises:
            InvalidArgument: an unknown state, a limit out of range or an account that breaks
                the id rules; nothing was sent.
            PermissionDenied: a user's certificate (or a viewer's scoped to an account) asked
                for another account.
            NoControlPlaneReachable, ClusterBusy: as :meth:`submit`.
        """
        from protocol import pb

        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidArgument(
                "limit", limit, f"must be an integer between 0 and {validation.MAX_LIST_LIMIT}"
            )
        validation.check_list(state or "", limit)
        check_account(account)
        request = pb.ListJobsRequest(state=state or "", limit=limit, account=account or "")
        reply: pb.ListJobsReply = await self._cp.call("list_jobs", request)
        return tuple(job_from_pb(info) for info in reply.jobs)

    async def audit(
        self,
        *,
        account: str | None = None,
        action: str | None = None,
        since_s: float | None = None,
        limit: int = 100,
    ) -> tuple[AuditEntry, ...]:
        """The audit trail, newest first: who changed what, when and from where
        (docs/accounts.md).

        Args:
            account: only this account's rows; None: every account this client may see (a
                user's certificate sees its own rows only).
            action: only this action (``submit``, ``cancel``, ``drain``, ``cordon``,
                ``uncordon``, ``account_set``, ``schedule_add``, ``schedule_pause``,
                ``schedule_resume``, ``schedule_remove``); None: every action.
            since_s: only rows of the last ``since_s`` seconds (database time); None: all.
            limit: at most this many rows, 0 to 10,000 (0: 100).

        Raises:
            InvalidArgument: an unknown action, a negative or infinite ``since_s``, a limit out
                of range or an account that breaks the id rules; nothing was sent.
            PermissionDenied: the certificate may not read the audit trail, or not that account.
            NoControlPlaneReachable, ClusterBusy: as :meth:`submit`.
        """
        from protocol import pb

        if isinstance(limit, bool) or not isinstance(limit, int):
            raise InvalidArgument(
                "limit", limit, f"must be an integer between 0 and {validation.MAX_LIST_LIMIT}"
            )
        validation.check_audit_query(action or "", since_s, limit)
        check_account(account)
        request = pb.ListAuditRequest(
            account=account or "",
            action=action or "",
            has_since_s=since_s is not None,
            since_s=since_s or 0.0,
            limit=limit,
        )
        reply: pb.ListAuditReply = await self._cp.call("list_audit", request)
        return tuple(audit_from_pb(entry) for entry in reply.entries)

    async def set_account(
        self,
        name: str,
        *,
        cpu_millis: int | None = None,
        memory_mb: int | None = None,
        max_pending: int | None = None,
        max_priority: int | None = None,
        weight: float | None = None,
        clear: Sequence[str] = (),
        idempotency_key: str | None = None,
    ) -> Account:
        """Set an account's quotas, priority cap and fair-share weight (operators only;
        docs/quotas.md); what is not given keeps its stored value. Returns the account as stored,
        with its use.

        Args:
            name: the account (the id rules).
            cpu_millis, memory_mb: caps on what its assigned and running jobs hold, 0 to
                ``runtime.accounts.MAX_CAPS``; None: keep.
            max_pending: cap on its pending and waiting jobs; None: keep.
            max_priority: the highest priority its users' jobs may have, -1,000,000 to
                1,000,000 (``runtime.jobs.MAX_PRIORITY``); None: keep (the default, 0, for a new
                account).
            weight: its fair-share weight, finite and > 0; None: keep (1 for a new account).
            clear: settings to remove (``cpu_millis``, ``memory_mb``, ``max_pending``: no cap;
                ``max_priority``: the default), none given.
            idempotency_key: this call's key, as in :meth:`submit`.

        Raises:
            InvalidArgument: a field breaks its rule (naming it, its value and the limit);
                nothing was sent.
            IdempotencyConflict, NoControlPlaneReachable, ClusterBusy, PermissionDenied: as
                :meth:`submit`.
        """
        from runtime.accounts import AccountChange

        caps = {"cpu_millis": cpu_millis, "memory_mb": memory_mb, "max_pending": max_pending}
        change = AccountChange(
            name=name, max_priority=max_priority, weight=weight, clear=tuple(clear), **caps
        ).check()
        request = change.to_pb(check_key(idempotency_key))
        reply: pb.AccountInfo = await self._cp.call("set_account", request)
        return account_from_pb(reply)

    async def account(self, name: str) -> Account:
        """An account's quotas, weight and use (one never set: no caps, weight 1).

        Raises:
            InvalidArgument: ``name`` breaks the id rules; nothing was sent.
            PermissionDenied: a user's certificate (or a scoped viewer's) asked for another account.
            NoControlPlaneReachable, ClusterBusy: as :meth:`submit`.
        """
        from protocol import pb
        from runtime.identifiers import check_id

        check_id(name, field="name")
        reply: pb.AccountInfo = await self._cp.call("get_account", pb.GetAccountRequest(name=name))
        return account_from_pb(reply)

    async def accounts(self) -> tuple[Account, ...]:
        """Every account with quotas set or with jobs queued or in use, by name (a user's
        certificate: its own).

        Raises:
            NoControlPlaneReachable, ClusterBusy, PermissionDenied: as :meth:`submit`.
        """
        from protocol import pb

        reply: pb.ListAccountsReply = await self._cp.call("list_accounts", pb.ListAccountsRequest())
        return tuple(account_from_pb(a) for a in reply.accounts)

    async def status(self) -> ClusterStatus:
        """The leader and its epoch, the control planes, every worker with its load, the job
        counts by state and the jobs no worker can hold.

        Raises:
            NoControlPlaneReachable, ClusterBusy, PermissionDenied: as :meth:`submit`.
        """
        from protocol import pb

        reply: pb.StatusReply = await self._cp.call("status", pb.StatusRequest())
        return status_from_pb(reply)

    def logs(
        self,
        job_id: int,
        *,
        stream: str = "stdout",
        follow: bool = False,
        tail_lines: int | None = None,
        tail_max_bytes: int | None = None,
    ) -> LogStream:
        """A job's output (its newest run that started), as an async iterator of
        :class:`ops.client.results.LogChunk`, read from its worker through any control plane:
        ``async for chunk in client.logs(7):``, or ``async with client.logs(7) as chunks:`` to
        close it when the block is left. Nothing is sent before the first chunk is asked for.

        Args:
            job_id: the job.
            stream: ``stdout`` or ``stderr``.
            follow: keep the stream open and send what the job writes until it ends (the last
                chunk then has ``job_ended``); False: what there is now.
            tail_lines: begin with the last ``tail_lines`` lines, 0 (only what comes next) to
                ``runtime.validation.MAX_TAIL_LINES``; None: all the worker keeps.
            tail_max_bytes: with ``tail_lines``, begin at most this many bytes before the end,
                even mid-line; None: no bound.

        Raises:
            InvalidArgument: a bad ``job_id``, ``stream``, ``tail_lines`` or
                ``tail_max_bytes``, at once; nothing was sent.

        The iterator raises, when it opens the stream: JobNotFound, FailedPrecondition (not
        started yet, or its worker keeps no output of that run), InvalidArgument (a sleep job),
        NoControlPlaneReachable (its ``failures`` are PeerUnavailable where a replica could not
        reach the worker), ClusterBusy, PermissionDenied. A replica that sends no first chunk
        within ``streams.LOG_OPEN_S`` is passed over. A stream that breaks after a chunk (Unavailable,
        or nothing for :data:`LOG_IDLE_S`) is opened again on any replica from the next byte;
        after :data:`LOG_RESUMES` such openings in a row with nothing received, the iteration
        ends with the last error. With ``follow``, a run that ended while the job will run
        again does not end the iteration: it goes on with the next run's output from its start
        (each chunk names its ``assignment_id``), until the job has ended; a run whose worker
        does not answer is waited for while it is active, and once it has ended an empty chunk
        with ``cut_run`` says its output stopped early.
        """
        from protocol import pb

        check_job_id(job_id)
        if stream not in LOG_STREAMS:
            raise InvalidArgument("stream", stream, f"must be one of {', '.join(LOG_STREAMS)}")
        if tail_lines is not None and not is_int_in(tail_lines, 0, validation.MAX_TAIL_LINES):
            raise InvalidArgument(
                "tail_lines", tail_lines, f"must be an integer between 0 and {validation.MAX_TAIL_LINES}"
            )
        if tail_max_bytes is not None and (
            tail_lines is None or not is_int_in(tail_max_bytes, 1, MAX_TAIL_BYTES)
        ):
            raise InvalidArgument(
                "tail_max_bytes",
                tail_max_bytes,
                f"must be an integer between 1 and {MAX_TAIL_BYTES}, with tail_lines (it bounds a tail)",
            )
        request = pb.ReadJobLogsRequest(
            job_id=job_id,
            stream=stream,
            follow=follow,
            has_tail=tail_lines is not None,
            tail_lines=tail_lines or 0,
            tail_max_bytes=tail_max_bytes or 0,
        )
        return LogStream(self._cp, request, job_id=job_id)
