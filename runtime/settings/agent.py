"""The settings of a worker's agent: :class:`AgentSettings`, how it keeps its jobs' output
(:class:`OutputSettings`) and watches their processes (:class:`JobProcessSettings`), and the
defaults the control planes' rules reckon with."""

from __future__ import annotations

import re

import attrs

from runtime import identifiers
from runtime.errors import InvalidArgument
from runtime.jobs import MAX_CPU_MILLIS, MAX_MEMORY_MB
from runtime.oom import DEFAULT_JOB_OOM_SCORE_ADJ, MIN_JOB_OOM_SCORE_ADJ, check_oom_score_adj
from runtime.resources import check_offered
from runtime.settings.fields import (
    advertise_address,
    an_id,
    between,
    check_not_below,
    integer_between,
    listen_host,
    non_negative,
    positive,
    str_tuple,
)
from runtime.tls import TlsFiles

DEFAULT_SELF_FENCE_AFTER_S = 1.5
"""The default of ``AgentSettings.self_fence_after_s`` (see there)."""

DEFAULT_LEAVE_TIMEOUT_S = 10.0
"""The default of ``AgentSettings.leave_timeout_s`` (see there)."""

DEFAULT_DB_OUTAGE_GRACE_S = 45.0
"""The default of ``AgentSettings.db_outage_grace_s``: longer than a Patroni failover (its
leader key's ttl is at least 20 s, and a promotion takes 20-30 s), so a failover kills no job."""

DEFAULT_RESTART_HOLD_S = 30.0
"""A planned restart's hold (``AgentSettings.restart_hold_s``): an agent started again within
it keeps every job without pausing it."""
MAX_RESTART_HOLD_S = 600.0
"""The longest restart hold, in seconds (``actors.validation.MAX_RESTART_HOLD_S`` too)."""

DEFAULT_STOP_GRACE_S = 0.5
"""The default of ``AgentSettings.stop_grace_s`` (see there)."""
DEFAULT_SELF_FENCE_MARGIN_S = 0.5
"""The default of ``AgentSettings.self_fence_margin_s`` (see there)."""


@attrs.frozen(kw_only=True)
class JobProcessSettings:
    """How the agent watches a command job's processes (:mod:`agent.runtimes`). The same for
    every worker of a process; the reaper itself (:mod:`agent.reaper`, a program of its own
    that imports nothing of ours to start fast) keeps its poll times next to its code."""

    exit_poll_s: float = attrs.field(default=0.05, validator=positive)
    """How often the agent looks whether a job's reaper has exited, while waiting for it, in
    seconds."""
    reaper_slack_s: float = attrs.field(default=1.0, validator=positive)
    """How long past its due time the agent waits for a reaper before it steps in, in seconds."""


JOB_PROCESSES = JobProcessSettings()
"""The :class:`JobProcessSettings` the agent uses."""


MIN_JOB_NICE = 0
MAX_JOB_NICE = 19
"""The range of ``AgentSettings.job_nice`` (19 is the lowest priority Linux knows)."""

MIN_JOB_PIDS = 1
MAX_JOB_PIDS = 4_194_304
"""The range of ``AgentSettings.job_pids_max``: up to ``PID_MAX_LIMIT`` of 64-bit Linux (4 Mi)."""
DEFAULT_JOB_PIDS_MAX = 4096
"""The default of ``AgentSettings.job_pids_max``."""
AUTO = "auto"
"""``AgentSettings.job_resources``: the best way the machine offers (cgroup2, else cgroup1, else
rlimit)."""
JOB_RESOURCES_CHOICES = (AUTO, "cgroup2", "cgroup1", "rlimit")
"""The values of ``AgentSettings.job_resources`` (:class:`agent.resources.Mode`, and ``auto``)."""


_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
"""A system user name ``useradd`` takes (and that cannot pass for one of its options)."""

SHARED_JOB_USER = "stockade-job"
"""The name the documentation gives the one shared job user (``job_user``), when an operator
wants the shared mode."""

MIN_JOB_UID = 1000
"""The lowest uid a ``job_uids`` range may hold: below it are the system's own accounts."""
MAX_JOB_UID = 2**31 - 2
"""The highest uid a job may run as: 2**31 - 1 and above are refused or mean "no user" (-1) to
some tools and kernels' interfaces."""
AGENT_BLOCKS_FIRST_UID = 2**30
"""From this uid up to :data:`MAX_JOB_UID`, agents claim blocks of uids themselves
(:mod:`agent.identities`), each locked; an operator's ``job_uids`` range ends below it, so it
never holds a uid another agent's jobs may run as."""


def uid_range(value: object) -> tuple[int, int] | None:
    """``job_uids`` from the option's text ``"START-END"`` (both included), a pair, or
    None/``""`` (none: the agent claims a block itself).

    Raises:
        InvalidArgument: not ``START-END``, uid 0 or below :data:`MIN_JOB_UID`,
            :data:`AGENT_BLOCKS_FIRST_UID` or above, or START above END; the message names the
            field and value.
    """
    if value is None or value == "":
        return None
    if isinstance(value, str):
        first, sep, last = value.strip().partition("-")
        if not (sep and first.isdigit() and last.isdigit()):
            raise InvalidArgument("job_uids", value, "must be START-END, two uids, e.g. 200000-299999")
        pair = (int(first), int(last))
    elif isinstance(value, tuple | list) and len(value) == 2 and all(type(v) is int for v in value):
        pair = (value[0], value[1])
    else:
        raise InvalidArgument("job_uids", value, "must be START-END, two uids, e.g. 200000-299999")
    if pair[0] == 0:
        raise InvalidArgument("job_uids", value, "must not hold uid 0 (root)")
    if pair[0] < MIN_JOB_UID:
        raise InvalidArgument("job_uids", value, f"must start at uid {MIN_JOB_UID} or above")
    if pair[1] >= AGENT_BLOCKS_FIRST_UID:
        raise InvalidArgument(
            "job_uids",
            value,
            f"must end at uid {AGENT_BLOCKS_FIRST_UID - 1} or below (from {AGENT_BLOCKS_FIRST_UID} up, "
            "agents claim uids themselves)",
        )
    if pair[0] > pair[1]:
        raise InvalidArgument("job_uids", value, "must have START at most END")
    return pair


MAX_OUTPUT_MB = 1_048_576
"""The largest ``max_output_mb`` (1 TiB)."""
DEFAULT_OUTPUT_RETENTION_S = 86_400.0
"""The default of ``OutputSettings.output_retention_s``: a day."""


@attrs.frozen(kw_only=True)
class OutputSettings:
    """How a worker keeps its jobs' output files (``stdout.log``, ``stderr.log`` in each job's
    folder) and serves them (Worker.ReadLogs); see :mod:`agent.output` and :mod:`agent.logs`."""

    max_output_mb: int = attrs.field(default=100, validator=integer_between(1, MAX_OUTPUT_MB))
    """Most MiB of each job's stdout, and of its stderr, the worker keeps on disk: past it the
    oldest part is dropped (from the head of the file, at block multiples), down to seven
    eighths of it, and readers are told how many bytes were dropped."""
    output_retention_s: float = attrs.field(default=DEFAULT_OUTPUT_RETENTION_S, validator=positive)
    """A job's folder (its output, the reaper's files, a command's working directory) is deleted
    this long after the job ended, in seconds (a day); never while it runs."""
    check_interval_s: float = attrs.field(default=0.25, validator=positive)
    """The longest time between two checks of a running job's output sizes, in seconds; a job
    that writes fast is checked more often, down to ``min_check_interval_s``."""
    min_check_interval_s: float = attrs.field(default=0.02, validator=positive)
    """The shortest time between two checks of the output sizes, in seconds: how late the cap
    can be enforced on a job that writes as fast as it can (it bounds by how much a file can
    pass the cap)."""
    sweep_interval_s: float = attrs.field(default=60.0, validator=positive)
    """Time between two sweeps of the jobs' folders for those past ``output_retention_s``."""
    max_sweep_deletions: int = attrs.field(default=100, validator=positive)
    """Most job folders one sweep deletes (the rest wait for the next), so a sweep after a long
    stop stays short."""
    follow_poll_s: float = attrs.field(default=0.25, validator=positive)
    """How often a followed output is looked at for new bytes, in seconds."""
    keepalive_s: float = attrs.field(default=5.0, validator=positive)
    """A followed stream with nothing new sends an empty chunk after this long, in seconds, so
    its reader can tell a quiet job from a dead worker."""
    read_chunk_bytes: int = attrs.field(default=64 * 1024, validator=positive)
    """Most bytes read from a file at once (off the agent's event loop) and sent in one chunk."""

    def __attrs_post_init__(self) -> None:
        if self.min_check_interval_s > self.check_interval_s:
            raise InvalidArgument(
                "min_check_interval_s",
                self.min_check_interval_s,
                f"must be at most check_interval_s = {self.check_interval_s:g}",
            )

    @property
    def max_output_bytes(self) -> int:
        """``max_output_mb`` in bytes."""
        return self.max_output_mb * 1024 * 1024


@attrs.frozen(kw_only=True)
class AgentSettings:
    """Everything one worker agent needs."""

    worker_id: str = attrs.field(validator=an_id)
    """Stable id of this worker, e.g. ``w-1`` (an id, :func:`runtime.identifiers.check_id`)."""
    control_planes: tuple[str, ...] = attrs.field(converter=str_tuple)
    """host:port of every control plane (:func:`runtime.identifiers.parse_address`); heartbeats
    go to the first that answers."""
    cpu_millis: int = attrs.field(validator=between(1, MAX_CPU_MILLIS))
    """CPU this worker offers, in millicores (1000 = one core), 1 to
    :data:`runtime.jobs.MAX_CPU_MILLIS` (what a registration may offer)."""
    memory_mb: int = attrs.field(validator=between(1, MAX_MEMORY_MB))
    """Memory this worker offers, in MiB, 1 to :data:`runtime.jobs.MAX_MEMORY_MB`."""
    work_dir: str
    """Folder for the JSON-lines log and the jobs' stdout/stderr files."""
    listen_host: str = attrs.field(default="127.0.0.1", validator=listen_host)
    """Host to listen on: an IPv4 or IPv6 address or a host name."""
    listen_port: int = 0
    """gRPC port of the Worker service; 0 picks a free one."""
    advertise_address: str = attrs.field(default="", validator=advertise_address)
    """host:port the leader should call (:func:`runtime.identifiers.parse_address`); defaults
    to listen_host:actual port."""
    labels: dict[str, str] = attrs.field(factory=dict)
    """Sent with every registration (:func:`runtime.identifiers.check_labels`: Kubernetes'
    syntax for keys and values)."""
    resources: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    """The countable devices this worker offers, name -> unit ids (``--resource gpu=0,1``;
    :func:`runtime.resources.check_offered`), sent with every registration (docs/devices.md).
    Without ``gpu`` here, the agent adds the GPUs ``nvidia-smi -L`` lists, where it exists
    (``detect_gpus``)."""
    detect_gpus: bool = True
    """Whether the agent asks ``nvidia-smi -L`` for GPUs when ``resources`` names no gpu."""
    heartbeat_interval_s: float = attrs.field(default=0.25, validator=positive)
    """Time between heartbeats until the cluster tells another interval (in the replies to
    registrations and heartbeats; docs/design.md, "Heartbeat interval"), in seconds; the
    self-fence span grows with a longer told interval in proportion (:func:`agent.fence.fence_after_s`)."""
    heartbeat_interval_min_s: float = attrs.field(default=0.05, validator=positive)
    """A told heartbeat interval below this is refused (logged; the last good one is kept)."""
    heartbeat_interval_max_s: float = attrs.field(default=10.0, validator=positive)
    """A told heartbeat interval above this is refused (logged; the last good one is kept)."""
    heartbeat_timeout_s: float = attrs.field(default=0.5, validator=positive)
    """How long a heartbeat (or registration) waits for one control plane before it is sent
    to the next one too (:meth:`runtime.client.ControlPlaneClient.call_hedged`); also the
    shortest deadline a call gets."""
    self_fence_after_s: float = attrs.field(default=DEFAULT_SELF_FENCE_AFTER_S, validator=positive)
    """Pause every job when no heartbeat sent in the last this-many seconds was acknowledged.
    Must stay below the control planes' dead_after_s by more than stop_grace_s."""
    db_outage_grace_s: float = attrs.field(default=DEFAULT_DB_OUTAGE_GRACE_S, validator=non_negative)
    """Paused jobs are killed once no heartbeat sent in the last this-many seconds was
    acknowledged (the longest database outage, or cut-off, running work survives); until then
    a heartbeat the database acknowledges resumes those whose assignment is still active
    (DESIGN.md, "Outages"). 0, or anything up to ``self_fence_after_s``: no pause, jobs are
    killed at the fence deadline."""
    stop_grace_s: float = attrs.field(default=DEFAULT_STOP_GRACE_S, validator=positive)
    """Time between SIGTERM and SIGKILL when stopping a command job."""
    restart_hold_s: float = attrs.field(default=DEFAULT_RESTART_HOLD_S)
    """How long a planned restart (SIGHUP: the agent exits leaving its jobs running) asks the
    control planes to hold the worker, in seconds: no silence of it counts and nothing is placed
    on it for that long, and its jobs pause only that much later than without the hold; a new
    agent process on the same work folder takes them over within it (docs/design.md,
    "Restarts"). 0 to 600; 0: no hold (the restart then has the fence span)."""
    self_fence_margin_s: float = attrs.field(default=DEFAULT_SELF_FENCE_MARGIN_S, validator=non_negative)
    """A worker's jobs must be stopped at least this long before the cluster may declare it
    dead: the self-fence deadline is lowered to ``dead_after_s - stop_grace_s`` minus this
    when the control planes' ``dead_after_s`` asks for it (:func:`agent.fence.fence_after_s`)."""
    min_self_fence_s: float = attrs.field(default=0.1, validator=positive)
    """The self-fence deadline is never lowered below this, in seconds."""
    call_deadline_margin_s: float = attrs.field(default=0.1, validator=non_negative)
    """A heartbeat or registration gives up this long before the fence deadline (an answer
    after it would come too late to keep the jobs), in seconds."""
    register_timeout_s: float = attrs.field(default=10.0, validator=positive)
    """The longest a new registration waits for an answer, in seconds, where the outage grace
    allows (:meth:`agent.fence.FenceClock.register_deadline_s`): a new incarnation holds no job,
    so a late answer costs nothing, while giving up sends another copy into the queues. Also
    the longest a paused worker's heartbeat waits after calls that failed
    (:func:`agent.fence.patient_deadline_s`)."""
    register_retry_s: float = attrs.field(default=0.5, validator=positive)
    """The longest pause after the first failed registration attempt, in seconds: the pauses
    are drawn uniformly below a ceiling that starts here and doubles with each failed attempt
    up to ``register_retry_max_s`` (:class:`runtime.backoff.FullJitterBackoff`)."""
    register_retry_max_s: float = attrs.field(default=5.0, validator=positive)
    """The cap of the registration retries' ceiling (see ``register_retry_s``), in seconds."""
    leave_timeout_s: float = attrs.field(default=DEFAULT_LEAVE_TIMEOUT_S, validator=positive)
    """How long a clean stop keeps trying to have a control plane record that the worker left,
    from its first attempt once every job has ended (attempts no replica answered are tried
    again after a jittered backoff), in seconds; past it the worker is declared dead after
    dead_after_s instead. A launcher waits this long and more before it SIGKILLs an agent."""
    max_concurrent_leaves: int = attrs.field(default=4, validator=positive)
    """Most leave attempts in flight at once in this process, shared by every worker of a
    fleet, so a fleet's leaves do not reach the control planes all in one instant."""
    max_concurrent_starts: int = attrs.field(default=2, validator=positive)
    """Most command jobs *starting* at once in this process, shared by every worker of a fleet
    (from the fork of a job's reaper until it has exec'd the job, or ended): the rest wait for
    a start slot, holding their capacity."""
    job_nice: int = attrs.field(default=10, validator=integer_between(MIN_JOB_NICE, MAX_JOB_NICE))
    """How much lower a command job's CPU priority is than the agent's (added to the agent's
    nice value in the job's process just before it execs; the kernel caps it at 19); 0: the
    agent's. The job's reaper keeps the agent's priority."""
    job_oom_score_adj: int = attrs.field(default=DEFAULT_JOB_OOM_SCORE_ADJ)
    """The ``oom_score_adj`` of every command and container job's processes, 0..1000 (1000: a
    job is the first the kernel kills when the machine runs out of memory; :mod:`runtime.oom`).
    The agent and its reapers keep the process's ``--oom-score-adj``."""

    job_pids_max: int = attrs.field(
        default=DEFAULT_JOB_PIDS_MAX, validator=integer_between(MIN_JOB_PIDS, MAX_JOB_PIDS)
    )
    """The most processes (and threads) one command job may have at once, enforced by its
    cgroup (``pids.max``); a fork past it fails (``EAGAIN``). Not enforced in ``rlimit`` mode."""
    usage_interval_s: float = attrs.field(default=5.0, validator=non_negative)
    """How often the agent measures what its running command jobs use (CPU and memory, from
    their cgroups), in seconds; the next heartbeat carries the samples (docs/console.md,
    "Usage"). 0: never (also without cgroups: ``rlimit`` mode counts nothing)."""
    job_resources: str = attrs.field(default=AUTO)
    """How command jobs' ``cpu_millis`` and ``memory_mb`` are enforced (:mod:`agent.resources`):
    ``auto`` (cgroup2 where the unified hierarchy offers the cpu, memory and pids controllers,
    else cgroup1, else rlimit), or one of ``cgroup2``, ``cgroup1``, ``rlimit`` (the agent
    refuses to start when the machine cannot do it). Registered as the label ``resources``."""

    job_user: str = attrs.field(default="")
    """The one system user every command and container job runs as when the agent runs as root
    (created as a system account without home or login shell on first use; never ``root`` or
    uid 0): the shared, weaker mode, in which jobs can reach each other's processes and files.
    Empty (the default): each job runs as a uid of its own from the worker's pool (``job_uids``;
    docs/tenancy.md, "Identities"). Ignored when the agent is not root: jobs then run as the
    agent's user."""
    job_uids: tuple[int, int] | None = attrs.field(default=None, converter=uid_range)
    """The uids (first, last, both included) a root agent gives its jobs, one each, none held
    by two running jobs (``--job-uids START-END``); at least ``min(cpu_millis, memory_mb)`` of
    them (the most jobs the worker can run at once). None: the agent claims a free block of its
    own (:mod:`agent.identities`). Ignored when the agent is not root or ``job_user`` is set."""

    output: OutputSettings = attrs.field(factory=OutputSettings)
    """How the jobs' output files are capped, kept and served."""

    tls: TlsFiles | None = None
    """This worker's mutual-TLS files (the CA, its ``worker`` certificate for its id, and the
    key): it serves the Worker service over mutual TLS, accepting only control-plane
    certificates, and calls the control planes with that certificate. None: plaintext and no
    identity checks (``--insecure``, for development)."""

    @job_user.validator
    def _job_user(self, attribute: attrs.Attribute[str], value: str) -> None:
        if value == "":
            return
        if value == "root" or (isinstance(value, str) and value.isdigit()):
            raise InvalidArgument("job_user", value, "must name a user other than root (uid 0)")
        if not isinstance(value, str) or not _USER_NAME.fullmatch(value):
            raise InvalidArgument(
                "job_user",
                value,
                "must be a user name: 1 to 32 of A-Z a-z 0-9 _ . -, not starting with - or .",
            )

    @restart_hold_s.validator
    def _hold(self, attribute: attrs.Attribute[float], value: float) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 <= value <= MAX_RESTART_HOLD_S
        ):
            raise InvalidArgument(
                "restart_hold_s", value, f"must be a number of seconds between 0 and {MAX_RESTART_HOLD_S:g}"
            )

    @job_oom_score_adj.validator
    def _oom(self, attribute: attrs.Attribute[int], value: int) -> None:
        check_oom_score_adj(value, field="job_oom_score_adj", low=MIN_JOB_OOM_SCORE_ADJ)

    @job_resources.validator
    def _resources(self, attribute: attrs.Attribute[str], value: str) -> None:
        if value not in JOB_RESOURCES_CHOICES:
            raise InvalidArgument(
                "job_resources", value, f"must be one of {', '.join(JOB_RESOURCES_CHOICES)}"
            )

    @control_planes.validator
    def _cps(self, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
        if not value:
            raise InvalidArgument("control_planes", value, "must name at least one host:port")
        identifiers.parse_addresses(value, field="control_planes")

    @labels.validator
    def _labels(self, attribute: attrs.Attribute[dict[str, str]], value: dict[str, str]) -> None:
        identifiers.check_labels(value, field="labels")

    @resources.validator
    def _devices(
        self, attribute: attrs.Attribute[dict[str, tuple[str, ...]]], value: dict[str, tuple[str, ...]]
    ) -> None:
        check_offered(value)

    @property
    def most_jobs_at_once(self) -> int:
        """The most jobs the worker can run at once, each asking at least 1 millicore and 1 MiB:
        ``min(cpu_millis, memory_mb)``, so the fewest uids its pool of job uids may hold."""
        return min(self.cpu_millis, self.memory_mb)

    def __attrs_post_init__(self) -> None:
        if self.job_uids is not None:
            first, last = self.job_uids
            if self.job_user:
                raise InvalidArgument(
                    "job_uids",
                    f"{first}-{last}",
                    f"must not be set with job_user = {self.job_user!r} (one shared user, or a uid per job)",
                )
            if last - first + 1 < self.most_jobs_at_once:
                raise InvalidArgument(
                    "job_uids",
                    f"{first}-{last}",
                    f"must hold at least min(cpu_millis, memory_mb) = min({self.cpu_millis}, "
                    f"{self.memory_mb}) = {self.most_jobs_at_once} uids, one per job the worker can run "
                    "at once",
                    detail=f"it holds {last - first + 1}",
                )
        check_not_below(self, "register_retry_max_s", "register_retry_s")
        check_not_below(self, "heartbeat_interval_max_s", "heartbeat_interval_min_s")
        if not self.heartbeat_interval_min_s <= self.heartbeat_interval_s <= self.heartbeat_interval_max_s:
            raise InvalidArgument(
                "heartbeat_interval_s",
                self.heartbeat_interval_s,
                f"must be between heartbeat_interval_min_s = {self.heartbeat_interval_min_s:g}"
                f" and heartbeat_interval_max_s = {self.heartbeat_interval_max_s:g}",
            )
        if self.heartbeat_interval_s >= self.self_fence_after_s:
            raise InvalidArgument(
                "heartbeat_interval_s",
                self.heartbeat_interval_s,
                f"must be below self_fence_after_s = {self.self_fence_after_s:g} (a worker must hear back"
                " at least once before it fences itself, or it pauses its jobs at every heartbeat)",
            )
