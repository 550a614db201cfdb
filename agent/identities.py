"""Each job in an identity of its own: a root agent's pool of uids (:class:`UidPool`), one per
running command or container job, from a block of uids no other agent on the machine uses
(:func:`claim_block`), given out again only once nothing of its last job is left
(:class:`JobIdentities`, over :mod:`agent.uid_cleanup`). docs/tenancy.md, "Identities".
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
from collections.abc import Awaitable, Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

import attrs
import trio
from trio.lowlevel import RunVar

from agent import uid_cleanup
from agent.work_folder import write_private
from runtime.errors import PermanentError
from runtime.os_users import RunAs
from runtime.settings.agent import AGENT_BLOCKS_FIRST_UID, MAX_JOB_UID, AgentSettings

UID_BLOCK_DIR = Path("/run/stockade/uid-blocks")
"""The machine-wide folder of the blocks' lock files: an agent holds an exclusive ``flock`` on
each of its block's files for its life, so no two agents (or fleets' workers) share a uid."""
BLOCK_BASE_UID = AGENT_BLOCKS_FIRST_UID
"""The first uid of the first block an agent claims itself (far above any uid a system or a
directory service hands out; an operator's ``job_uids`` range ends below it)."""
BLOCK_UIDS = 65_536
"""The uids of one lock file's block; an agent that needs more claims consecutive blocks."""
BLOCK_COUNT = (MAX_JOB_UID + 1 - BLOCK_BASE_UID) // BLOCK_UIDS
"""How many blocks there are from :data:`BLOCK_BASE_UID` up to ``MAX_JOB_UID``."""
CLEANUP_THREADS = 2
"""Most clean-ups of one worker's uids at once, each in a thread of its own (a ``/proc`` scan
and a walk of the temp folders): many jobs ending together wait their turn rather than take
every thread trio lends, and the uids that wait for a thread are cleaned up together, in one
batch (:class:`_Batch`)."""
BLOCK_RECORD = "uid-block"
"""In the worker's work folder: the block its agent claimed, ``FIRST-LAST``, claimed again
first by the next agent process there (so that jobs it takes over keep their uids)."""
START_SWEEP_QUIET_S = 1.0
"""A start sweep waits until no other worker of the process has asked to join it for this long
(seconds), or :data:`START_SWEEP_GATHER_MAX_S` at most."""
START_SWEEP_GATHER_MAX_S = 5.0
"""The longest a start sweep gathers (seconds): a job assigned to a worker whose pool has not
been swept waits for it."""
_START_SWEEPS: RunVar[_Batching[tuple[JobIdentities, Path], list[list[int]]]] = RunVar(
    "stockade_start_sweeps"
)
"""The start sweeps of this process's workers (:meth:`JobIdentities.sweep_at_start`), one thread
at a time (each walks the temp folders; side by side they would only slow each other and the
fleet's registrations), those asking while one gathers or runs swept together."""


_M = TypeVar("_M")
_R = TypeVar("_R")


class NoUidBlock(PermanentError):
    """No block of uids could be claimed: every block is held by another agent, or the range
    the operator set (``job_uids``) is another agent's on this machine."""


@attrs.define(eq=False)
class UidBlock:
    """The uids ``first_uid``..``last_uid`` (both included), held through the lock files'
    descriptors ``fds`` until :meth:`close`."""

    first_uid: int
    last_uid: int
    fds: list[int] = attrs.field(factory=list)

    def close(self) -> None:
        """Give the block up (closing its lock files drops their locks)."""
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()


def _lock(path: Path) -> int | None:
    """An open descriptor of ``path`` (created 0600) holding an exclusive flock; None when
    another open file holds it. Close-on-exec: a job's reaper never keeps a block locked."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_all(paths: list[Path]) -> list[int] | None:
    """Lock every one of ``paths`` (:func:`_lock`), or none of them (None)."""
    fds: list[int] = []
    for path in paths:
        fd = _lock(path)
        if fd is None:
            for held in fds:
                os.close(held)
            return None
        fds.append(fd)
    return fds


def _recorded(work_dir: Path) -> tuple[int, int] | None:
    """The block recorded in ``work_dir`` (:data:`BLOCK_RECORD`); None when there is none."""
    try:
        first, _, last = (work_dir / BLOCK_RECORD).read_text().strip().partition("-")
        return int(first), int(last)
    except (OSError, ValueError):
        return None


def _uids_running(low: int) -> set[int]:
    """The uids at or above ``low`` some process of this machine has."""
    return {uid for held in uid_cleanup.process_uids().values() for uid in held if uid >= low}


def claim_block(
    needed: int,
    *,
    work_dir: Path,
    job_uids: tuple[int, int] | None = None,
    lock_dir: Path = UID_BLOCK_DIR,
) -> UidBlock:
    """Claim the uids of one worker's pool for this process's life, and record them in
    ``work_dir``.

    ``job_uids`` (the operator's range) is locked as one block. Else ``needed`` uids are
    claimed in whole blocks of :data:`BLOCK_UIDS` from :data:`BLOCK_BASE_UID` up: the block
    recorded in ``work_dir`` first (a restarted agent keeps its jobs' uids), then the first
    free one whose uids no process has (not one a killed agent's jobs still run in).

    Raises:
        NoUidBlock: no block is free, or ``job_uids`` is another agent's.
        OSError: ``lock_dir`` or the record cannot be written.
    """
    lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if job_uids is not None:
        first, last = job_uids
        fds = _lock_all([lock_dir / f"range-{first}-{last}.lock"])
        if fds is None:
            raise NoUidBlock(f"job_uids {first}-{last} is held by another agent on this machine")
        return _recording(UidBlock(first, last, fds), work_dir)
    count = max(1, -(-needed // BLOCK_UIDS))

    def paths(index: int) -> list[Path]:
        return [lock_dir / f"{BLOCK_BASE_UID + (index + i) * BLOCK_UIDS}.lock" for i in range(count)]

    def block(index: int, fds: list[int]) -> UidBlock:
        first = BLOCK_BASE_UID + index * BLOCK_UIDS
        return UidBlock(first, first + count * BLOCK_UIDS - 1, fds)

    recorded = _recorded(work_dir)
    if recorded is not None and (recorded[0] - BLOCK_BASE_UID) % BLOCK_UIDS == 0:
        index = (recorded[0] - BLOCK_BASE_UID) // BLOCK_UIDS
        if 0 <= index <= BLOCK_COUNT - count and recorded[1] == block(index, []).last_uid:
            fds = _lock_all(paths(index))
            if fds is not None:
                return _recording(block(index, fds), work_dir)
    running = _uids_running(BLOCK_BASE_UID)
    for index in range(BLOCK_COUNT - count + 1):
        first, last = block(index, []).first_uid, block(index, []).last_uid
        if any(first <= uid <= last for uid in running):
            continue
        fds = _lock_all(paths(index))
        if fds is not None:
            return _recording(block(index, fds), work_dir)
    raise NoUidBlock(f"every block of {count * BLOCK_UIDS} uids from {BLOCK_BASE_UID} up is held")


def _recording(block: UidBlock, work_dir: Path) -> UidBlock:
    """``block``, once recorded in ``work_dir`` (closed when it cannot be)."""
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        write_private(work_dir / BLOCK_RECORD, f"{block.first_uid}-{block.last_uid}\n")
    except BaseException:
        block.close()
        raise
    return block


@attrs.define(eq=False)
class UidPool:
    """The uids ``first_uid``..``last_uid`` of one worker: each given to one job at a time,
    the one given back longest ago first (a uid's last job is as far in the past as it can be)."""

    first_uid: int
    last_uid: int
    _free: collections.deque[int] = attrs.field(init=False)
    held: set[int] = attrs.field(init=False, factory=set)
    """Uids a running job has (or whose job's leftovers are being removed)."""
    quarantined: set[int] = attrs.field(init=False, factory=set)
    """Uids whose clean-up failed: never given out again by this process."""

    def __attrs_post_init__(self) -> None:
        self._free = collections.deque(range(self.first_uid, self.last_uid + 1))

    def __contains__(self, uid: int) -> bool:
        return self.first_uid <= uid <= self.last_uid

    @property
    def free_count(self) -> int:
        """How many uids can be given out now."""
        return len(self._free)

    def claim(self) -> int | None:
        """The free uid given back longest ago (held from now on); None when none is free."""
        if not self._free:
            return None
        uid = self._free.popleft()
        self.held.add(uid)
        return uid

    def hold(self, uid: int) -> None:
        """Mark ``uid`` held (a job taken over from the previous agent process runs as it)."""
        if uid in self.held or uid not in self:
            return
        with contextlib.suppress(ValueError):
            self._free.remove(uid)
        self.held.add(uid)

    def give_back(self, uid: int) -> None:
        """Make a held ``uid`` free again, given out after every uid free before it."""
        if uid in self.held:
            self.held.discard(uid)
            self._free.append(uid)

    def quarantine(self, uid: int) -> None:
        """Never give ``uid`` out again."""
        self.held.discard(uid)
        with contextlib.suppress(ValueError):
            self._free.remove(uid)
        self.quarantined.add(uid)


@attrs.define(eq=False)
class _Batch(Generic[_M, _R]):
    """Members whose work runs as one (:class:`_Batching`): ``result`` set when ``done`` if it
    ``ran`` (else nothing was done)."""

    members: list[_M] = attrs.field(factory=list)
    started: bool = False
    ran: bool = False
    done: trio.Event = attrs.field(factory=trio.Event)
    result: _R | None = None


@attrs.define(eq=False)
class _Batching(Generic[_M, _R]):
    """Work on behalf of many members that runs as one when they ask at about the same time:
    the first member of a batch runs it for all once it has its ``turn``; members that join
    meanwhile wait for it; those asking after it started wait for the next batch."""

    turn: trio.CapacityLimiter
    gathering: _Batch[_M, _R] = attrs.field(factory=_Batch)

    async def join(
        self,
        member: _M,
        run: Callable[[list[_M]], Awaitable[_R]],
        *,
        gather: Callable[[_Batch[_M, _R]], Awaitable[None]] | None = None,
    ) -> tuple[_Batch[_M, _R], int]:
        """Add ``member`` to the batch gathering now and wait until it ran (or failed); returns
        it and ``member``'s place in it. ``gather``, awaited by the running member once it has
        its turn, lets more join first."""
        batch = self.gathering
        place = len(batch.members)
        batch.members.append(member)
        if batch.started:
            await batch.done.wait()
            return batch, place
        batch.started = True  # this task runs the batch; the others wait for it
        try:
            async with self.turn:
                if gather is not None:
                    await gather(batch)
                self.gathering = _Batch()  # later members wait for the next batch
                batch.result = await run(list(batch.members))
                batch.ran = True
        finally:
            if self.gathering is batch:
                self.gathering = _Batch()
            batch.done.set()
        return batch, place


def sweep_pools(members: Sequence[tuple[JobIdentities, Path]]) -> list[list[int]]:
    """Blocking: what the uids of each member's pool that no job holds left, removed at once
    for all of them (one ``/proc`` scan per round of kills, one walk of each temp folder, one
    read of the IPC tables): their processes, files in the temp folders, IPC objects; the job
    folders in each member's jobs folder they own given back to the member's owner. Uids whose
    processes outlive SIGKILL, or whose files cannot be removed, are quarantined in their pool;
    returns them, by member.

    Raises:
        OSError: a folder or table could not be read as a whole.
    """
    stuck: list[list[int]] = [[] for _ in members]
    by_owner: dict[tuple[int, int], list[int]] = {}
    for n, (ids, _) in enumerate(members):
        by_owner.setdefault(ids.owner, []).append(n)
    for owner, indices in by_owner.items():
        pools = [members[n][0].pool for n in indices]
        idle = uid_cleanup.UidRanges.of(
            [(pool.first_uid, pool.last_uid) for pool in pools], excluded=[u for p in pools for u in p.held]
        )
        left: set[int] = set()
        if uid_cleanup.kill_processes(idle):
            left = {uid for held in uid_cleanup.process_uids().values() for uid in held if uid in idle}
        clean = idle.without(left)
        for n in indices:
            _give_back_folders(members[n][1], clean, owner)
        left.update(uid_cleanup.remove_temp_files(clean, owner=owner))
        uid_cleanup.remove_ipc(clean)
        for n, pool in zip(indices, pools, strict=True):
            stuck[n] = sorted(uid for uid in left if uid in pool)
            for uid in stuck[n]:
                pool.quarantine(uid)
    return stuck


def _give_back_folders(jobs_dir: Path, idle: Collection[int], owner: tuple[int, int]) -> None:
    """Give the job folders in ``jobs_dir`` that a uid of ``idle`` owns back to ``owner``."""
    with contextlib.suppress(OSError):
        for entry in jobs_dir.iterdir():
            with contextlib.suppress(OSError):
                if entry.lstat().st_gid in idle or (entry / "work").lstat().st_uid in idle:
                    uid_cleanup.give_back(entry, *owner)


@attrs.define(eq=False, kw_only=True)
class JobIdentities:
    """A root agent's job uids: its pool, the block it holds, and the clean-up that decides
    when a uid may be given out again. ``owner``: the agent's own (uid, gid), to which a job's
    folder is given back."""

    pool: UidPool
    block: UidBlock | None = None
    owner: tuple[int, int] = attrs.field(factory=lambda: (os.geteuid(), os.getegid()))
    logger: Any = None
    _releases: _Batching[tuple[int, list[Path]], dict[int, list[str]]] = attrs.field(
        factory=lambda: _Batching(trio.CapacityLimiter(CLEANUP_THREADS)), init=False
    )
    """The clean-ups of this worker's uids (each uid with its job folders), at most
    :data:`CLEANUP_THREADS` threads at once: uids ending while every thread is busy join one."""
    swept: trio.Event = attrs.field(factory=trio.Event, init=False)
    """Set once :meth:`sweep_at_start` has run: no uid is given out to a new job before."""

    @classmethod
    def claim(cls, settings: AgentSettings, *, logger: Any, lock_dir: Path = UID_BLOCK_DIR) -> JobIdentities:
        """The pool of ``settings``' worker: ``job_uids`` (at least ``most_jobs_at_once``
        uids, as the settings check), else a block of its own.

        Raises:
            NoUidBlock: no block could be claimed.
        """
        block = claim_block(
            settings.most_jobs_at_once,
            work_dir=Path(settings.work_dir),
            job_uids=settings.job_uids,
            lock_dir=lock_dir,
        )
        return cls(pool=UidPool(block.first_uid, block.last_uid), block=block, logger=logger)

    def close(self) -> None:
        """Give the block up (at the agent's end)."""
        if self.block is not None:
            self.block.close()

    def run_as(self) -> RunAs | None:
        """A uid for a job starting now (its gid the same, no other groups); None: none free."""
        uid = self.pool.claim()
        return None if uid is None else RunAs(uid=uid, gid=uid, name=f"uid {uid}")

    def hold(self, uid: int) -> None:
        """Keep ``uid`` (a job taken over runs as it) from being given out."""
        self.pool.hold(uid)

    async def release(self, uid: int, job_dir: Path | None) -> bool:
        """Remove what the job of ``uid`` left (:func:`agent.uid_cleanup.clean_uids`, in a
        thread; its ``job_dir`` given back to the agent), then give ``uid`` back; or, when
        something is left, quarantine it and log what. Shielded; True when given back.

        Uids released while every clean-up thread is busy wait together and are cleaned up in
        one batch (one walk of the temp folders for all of them); each is given back only once
        its batch's clean-up has ended, so the guarantee is the same as one at a time."""

        async def clean(members: list[tuple[int, list[Path]]]) -> dict[int, list[str]]:
            folders = dict(members)
            return await trio.to_thread.run_sync(lambda: uid_cleanup.clean_uids(folders, owner=self.owner))

        with trio.CancelScope(shield=True):
            batch, _ = await self._releases.join((uid, [] if job_dir is None else [job_dir]), clean)
        problems = (batch.result or {}).get(uid, []) if batch.ran else ["clean-up did not run"]
        if problems:
            self.pool.quarantine(uid)
            if self.logger is not None:
                self.logger.error(
                    "job uid quarantined: what its job left could not all be removed",
                    uid=uid,
                    problems=problems,
                    quarantined=len(self.pool.quarantined),
                )
            return False
        self.pool.give_back(uid)
        return True

    async def sweep_at_start(self, jobs_dir: Path, *, gather: bool = True) -> None:
        """:meth:`sweep` in a thread, then log the pool and set :attr:`swept`. With ``gather``
        (a fleet's workers, swept beside their registration: a job assigned meanwhile waits for
        it before it takes a uid), together with the other workers of this process that ask
        meanwhile (:data:`_START_SWEEPS`); else at once, alone (one agent, before it serves).

        Raises:
            OSError: what :meth:`sweep` raises; the agent stops.
        """
        try:
            sweeps = _START_SWEEPS.get()
        except LookupError:
            sweeps = _Batching(trio.CapacityLimiter(1))
            _START_SWEEPS.set(sweeps)

        async def gather_more(batch: _Batch[tuple[JobIdentities, Path], list[list[int]]]) -> None:
            # A fleet starts its workers one after another: gather them until none has asked
            # for a while, so that they share one walk rather than take turns.
            began = since = trio.current_time()
            joined = len(batch.members)
            while (now := trio.current_time()) - since < START_SWEEP_QUIET_S:
                if now - began >= START_SWEEP_GATHER_MAX_S:
                    break
                await trio.sleep(START_SWEEP_QUIET_S / 4)
                if len(batch.members) > joined:
                    joined, since = len(batch.members), trio.current_time()

        async def sweep(members: list[tuple[JobIdentities, Path]]) -> list[list[int]]:
            return await trio.to_thread.run_sync(sweep_pools, members)

        batch, place = await sweeps.join((self, jobs_dir), sweep, gather=gather_more if gather else None)
        if batch.ran and batch.result is not None:
            stuck = batch.result[place]
        else:  # the batch's own agent stopped or failed before its sweep ran: sweep alone
            async with sweeps.turn:
                stuck = await trio.to_thread.run_sync(self.sweep, jobs_dir)
        pool = self.pool
        if self.logger is not None:
            self.logger.info(
                "jobs run as a uid each",
                first_uid=pool.first_uid,
                last_uid=pool.last_uid,
                held=len(pool.held),
                quarantined=stuck,
            )
        self.swept.set()

    def sweep(self, jobs_dir: Path) -> list[int]:
        """At the agent's start (blocking): :func:`sweep_pools` of this pool alone; returns the
        uids quarantined."""
        return sweep_pools([(self, jobs_dir)])[0]
