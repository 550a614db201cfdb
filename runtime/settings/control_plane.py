"""The settings of a control-plane replica: its service (:class:`IngestSettings`), its web
console (:class:`ConsoleSettings`), its database watch (:class:`DatabaseWatchSettings`), and
the whole replica (:class:`ControlPlaneSettings`, which checks the rules between groups)."""

from __future__ import annotations

import math

import attrs

from runtime import identifiers
from runtime.errors import InvalidArgument
from runtime.settings.fields import (
    DEFAULT_READ_STATEMENT_TIMEOUT_S,
    advertise_address,
    an_id,
    check_not_above,
    listen_host,
    non_negative,
    positive,
)
from runtime.settings.leader import (
    MAX_STATEMENTS_PER_FENCED_WRITE,
    DispatchSettings,
    LeaseSettings,
    LedgerSettings,
    PlacerSettings,
    ReconcilerSettings,
)
from runtime.tls import TlsFiles

DEFAULT_WIRE_WORK_BURST_S = 0.01
"""The default of ``IngestSettings.wire_work_burst_s`` (see there)."""

MAX_HEARTBEAT_GROUP_WAIT_S = 0.1
"""The longest :attr:`IngestSettings.heartbeat_group_wait_s`, in seconds: a fifth of an
agent's default heartbeat deadline (0.5 s), which every grouped heartbeat's answer spends it from."""
MAX_HEARTBEAT_GROUP = 5000
"""The most heartbeats :attr:`IngestSettings.heartbeat_group_max` may allow in one group."""


@attrs.frozen(kw_only=True)
class IngestSettings:
    """The ControlPlane gRPC service's database capacity and how it sheds load (see
    :mod:`actors.admission`)."""

    pool_size: int = attrs.field(default=8, validator=positive)
    """Database connections of the service, all opened at start and kept open."""
    liveness_reserved_connections: int = attrs.field(default=2, validator=positive)
    """Connections only heartbeats, registrations and the replica's presence may use; every
    other RPC shares the remaining ``pool_size - liveness_reserved_connections``."""
    shed_lag_s: float = attrs.field(default=0.25, validator=positive)
    """Refuse new work (RESOURCE_EXHAUSTED, "busy") while the ingest loop's worst lag over the
    last second exceeds this, in seconds."""
    max_requests_in_progress: int = attrs.field(default=2, validator=positive)
    """RPCs other than heartbeats and registrations served at once, each from its admission
    until its reply is encoded (database work and reply building both); the rest wait their
    turn. At most ``pool_size - liveness_reserved_connections`` count, whatever this says."""
    max_waiting_requests: int = attrs.field(default=16, validator=non_negative)
    """Refuse new work that would wait for its turn behind this many others."""
    max_admission_wait_s: float = attrs.field(default=1.0, validator=positive)
    """Refuse new work ("busy") that has waited this long for its turn without getting one, in
    seconds (a client's own deadline may end the wait earlier)."""
    max_wire_work_share: float = attrs.field(default=0.25, validator=positive)
    """Most of the service's event-loop time that building, encoding, decoding and checking
    large messages (in slices of ``wire_step_messages``) may take, as a fraction of wall time
    (0.25: a quarter); past it the slices pause, so heartbeats and the gRPC exchanges get the rest."""
    wire_work_burst_s: float = attrs.field(default=DEFAULT_WIRE_WORK_BURST_S, validator=non_negative)
    """The most loop time those slices may save up while idle and then spend at once, in
    seconds (:class:`actors.admission.LoopShare`)."""
    wire_step_messages: int = attrs.field(default=32, validator=positive)
    """Elements of a large reply (a listing's jobs) encoded, or of a large request (a batch's
    jobs) decoded and checked, between two yields to the service's event loop."""
    statement_timeout_s: float = attrs.field(default=5.0, validator=positive)
    """Longest one statement of the service may run (its connections' ``statement_timeout``),
    in seconds."""
    idle_in_transaction_timeout_s: float = attrs.field(default=0.5, validator=positive)
    """PostgreSQL ends a service session idle inside a transaction this long (a replica frozen
    in the middle of a registration), so it does not keep a worker's row locked, in seconds."""
    lock_timeout_s: float = attrs.field(default=0.3, validator=positive)
    """Longest a statement of the service waits for a row lock (the worker then tries the next
    replica), in seconds."""
    liveness_connection_wait_s: float = attrs.field(default=5.0, validator=positive)
    """Longest liveness work (heartbeats, registrations, presence) waits for a connection, in
    seconds (other work waits at most ``max_admission_wait_s``)."""
    answer_timeout_s: float = attrs.field(default=6.0, validator=positive)
    """Longest a request's database work may run once started, in seconds. It is not
    cancelled by its client's deadline (its server-side ``statement_timeout_s`` bounds it);
    past this bound, a stalled connection is dropped."""
    shed_log_every_s: float = attrs.field(default=5.0, validator=positive)
    """At most one log line about refused requests per this many seconds."""
    max_pending_jobs: int = attrs.field(default=20_000, validator=non_negative)
    """Refuse submissions ("busy") while this many jobs are pending (0: no limit). Soft: a
    replica counts the queue at most every ``pending_count_max_age_s``, and a batch that
    arrives while the queue is under the limit is taken whole (Slurm's ``MaxJobCount``)."""
    pending_count_max_age_s: float = attrs.field(default=0.5, validator=positive)
    """How old the pending count a submission is admitted on may be, in seconds."""
    idempotency_key_retention_s: float = attrs.field(default=86_400.0, validator=positive)
    """How long a mutating call's idempotency key and answer are kept after its first use, in
    seconds (24 h, as Stripe keeps its keys): a copy arriving within it gets the first answer,
    a later one is a new call (:mod:`actors.idempotency`)."""
    idempotency_sweep_interval_s: float = attrs.field(default=10.0, validator=positive)
    """How often each replica deletes expired idempotency keys and usage samples, in seconds."""
    idempotency_sweep_rows: int = attrs.field(default=5_000, validator=positive)
    """Most keys (or usage samples) one delete statement of the sweep removes (a pass runs
    statements until one removes fewer, or the service is busy)."""
    usage_retention_s: float = attrs.field(default=3_600.0, validator=positive)
    """How long the usage samples workers report with their heartbeats are kept, in seconds
    (docs/console.md, "Usage"): the span the console's job and worker pages can draw."""
    max_log_streams: int = attrs.field(default=64, validator=positive)
    """Job output streams (ReadJobLogs) one replica relays at once; one more is refused
    ("busy", another replica may take it)."""
    log_open_timeout_s: float = attrs.field(default=5.0, validator=positive)
    """The longest a replica waits for the first chunk of a job's output from its worker, the
    connection and its TLS handshake included, in seconds; past it the worker counts as
    unreachable (UNAVAILABLE naming it)."""
    log_idle_timeout_s: float = attrs.field(default=20.0, validator=positive)
    """A relayed output stream whose worker has sent nothing this long, not even a keep-alive
    (a following worker sends one every ``keepalive_s``, 5 s), is ended as unreachable, in
    seconds: the worker froze or its host went away."""
    heartbeat_group_wait_s: float = attrs.field(default=0.005, validator=non_negative)
    """How long the ingest gathers liveness-only heartbeats before it records them together in
    one statement, in seconds (:mod:`actors.heartbeat_group`; docs/design.md, "Grouped
    heartbeats"). 0: every heartbeat is its own statement. At most
    :data:`MAX_HEARTBEAT_GROUP_WAIT_S`."""
    heartbeat_group_max: int = attrs.field(default=500, validator=positive)
    """Most heartbeats one group records (a full group is recorded at once, without waiting
    out ``heartbeat_group_wait_s``). At most :data:`MAX_HEARTBEAT_GROUP`."""
    heartbeat_groups_in_flight: int = attrs.field(default=2, validator=positive)
    """Most group statements one ingest runs at once; a group whose wait ended meanwhile keeps
    gathering, so under load the groups grow instead of queueing for connections. At most
    ``liveness_reserved_connections`` is useful."""

    def __attrs_post_init__(self) -> None:
        if self.max_wire_work_share > 1:
            raise InvalidArgument(
                "max_wire_work_share", self.max_wire_work_share, "must be a fraction in (0, 1]"
            )
        if self.heartbeat_group_wait_s > MAX_HEARTBEAT_GROUP_WAIT_S:
            raise InvalidArgument(
                "heartbeat_group_wait_s",
                self.heartbeat_group_wait_s,
                f"must be at most {MAX_HEARTBEAT_GROUP_WAIT_S:g} s (every heartbeat's answer waits it out)",
            )
        if self.heartbeat_group_max > MAX_HEARTBEAT_GROUP:
            raise InvalidArgument(
                "heartbeat_group_max", self.heartbeat_group_max, f"must be at most {MAX_HEARTBEAT_GROUP}"
            )
        if self.liveness_reserved_connections >= self.pool_size:
            raise InvalidArgument(
                "liveness_reserved_connections",
                self.liveness_reserved_connections,
                f"must be < pool_size = {self.pool_size} (other RPCs need a connection too)",
            )


@attrs.frozen(kw_only=True)
class ConsoleSettings:
    """The read-only web console every replica serves on its ``http_port`` (:mod:`actors.console`)."""

    read_timeout_s: float = attrs.field(default=2.0, validator=positive)
    """Longest one page's database reads may take, waiting for a connection included, in
    seconds; past it the page says the database does not answer (and since when) instead."""
    output_timeout_s: float = attrs.field(default=2.0, validator=positive)
    """Longest a job page waits for the tail of the job's output from its worker (through the
    log relay of ``stockade logs``), in seconds; past it the page says the output is out of reach."""
    output_tail_lines: int = attrs.field(default=40, validator=positive)
    """Lines of each of stdout and stderr a job page shows."""
    output_tail_max_bytes: int = attrs.field(default=32 * 1024, validator=positive)
    """Most bytes of each output tail a job page shows."""
    refresh_interval_s: float = attrs.field(default=1.0, validator=positive)
    """How often an open page asks its console for fresh content, in seconds."""
    sample_interval_s: float = attrs.field(default=2.0, validator=positive)
    """How often the replica samples the cluster's allocated CPU and memory for the packing
    chart, in seconds."""
    history_s: float = attrs.field(default=900.0, validator=positive)
    """How far back the packing chart reaches, in seconds (the ring holds
    ``history_s / sample_interval_s`` samples; it starts empty when the replica starts)."""
    pool_size: int = attrs.field(default=2, validator=positive)
    """Database connections of the console (its own pool, apart from the ingest's)."""
    max_token_lifetime_s: float = attrs.field(default=12 * 3600.0, validator=positive)
    """The longest lifetime of a login token the console accepts, in seconds (12 h)."""

    @property
    def history_samples(self) -> int:
        """How many samples the packing ring keeps."""
        return max(2, math.ceil(self.history_s / self.sample_interval_s))


@attrs.frozen(kw_only=True)
class DatabaseWatchSettings:
    """What every replica watches in the database for what Stockade cannot fix itself (a
    transaction left open, dead rows vacuum could not remove), and when it warns
    (:mod:`actors.database_watch`)."""

    sample_interval_s: float = attrs.field(default=5.0, validator=positive)
    """How often the replica samples the oldest open transaction and the tables' rows, in
    seconds."""
    statement_timeout_s: float = attrs.field(default=DEFAULT_READ_STATEMENT_TIMEOUT_S, validator=positive)
    """Longest one sample's read may run, in seconds."""
    oldest_transaction_warn_s: float = attrs.field(default=60.0, validator=positive)
    """A warning is logged when the oldest transaction open in the database (another session's)
    has been open longer than this, in seconds; once per crossing, and a line again once none is."""
    dead_rows_warn_ratio: float = attrs.field(default=10.0, validator=positive)
    """A warning is logged when a watched table holds more dead row versions than this many times
    its live rows (and more than ``dead_rows_warn_min``); once per crossing and table. (Vacuum
    keeps dead rows below about a fifth of the live ones plus 50.)"""
    dead_rows_warn_min: int = attrs.field(default=1000, validator=positive)
    """Fewer dead rows than this never warn, whatever the ratio (the lease's one row)."""


@attrs.frozen(kw_only=True)
class ControlPlaneSettings:
    """Everything one control-plane replica needs."""

    cp_id: str = attrs.field(validator=an_id)
    """This replica's id, e.g. ``cp-1`` (an id, :func:`runtime.identifiers.check_id`)."""
    database_url: str = attrs.field(validator=lambda _i, _a, value: identifiers.check_database_url(value))
    """asyncpg URL of the shared database (:func:`runtime.identifiers.check_database_url`)."""
    listen_host: str = attrs.field(default="127.0.0.1", validator=listen_host)
    """Host to listen on: an IPv4 or IPv6 address or a host name."""
    listen_port: int = 0
    """gRPC port of the ControlPlane service; 0 picks a free one."""
    advertise_address: str = attrs.field(default="", validator=advertise_address)
    """host:port others should use (:func:`runtime.identifiers.parse_address`); defaults to
    listen_host:actual port."""
    presence_interval_s: float = attrs.field(default=1.0, validator=positive)
    """How often the replica records that it is up (control_planes.seen_at)."""
    schema_retry_base_s: float = attrs.field(default=0.05, validator=positive)
    """While the database cannot be reached at start-up, the schema is applied again after a
    random wait below this, then below twice, four times ... this (seconds; full jitter,
    :func:`runtime.loops.retry`)."""
    schema_retry_max_s: float = attrs.field(default=2.0, validator=positive)
    """The largest bound of that wait, in seconds."""
    ingest: IngestSettings = attrs.field(factory=IngestSettings)
    lease: LeaseSettings = attrs.field(factory=LeaseSettings)
    ledger: LedgerSettings = attrs.field(factory=LedgerSettings)
    placer: PlacerSettings = attrs.field(factory=PlacerSettings)
    reconciler: ReconcilerSettings = attrs.field(factory=ReconcilerSettings)
    dispatch: DispatchSettings = attrs.field(factory=DispatchSettings)
    http_port: int | None = attrs.field(default=None)
    """Port of the read-only web console (:mod:`actors.console`), 1 to 65535; None: no console.
    With ``tls`` it serves HTTPS on ``listen_host`` with this replica's certificate and asks
    every request for a login token (``stockade console``); without, plain HTTP on 127.0.0.1
    only, with no login."""
    console: ConsoleSettings = attrs.field(factory=ConsoleSettings)
    database_watch: DatabaseWatchSettings = attrs.field(factory=DatabaseWatchSettings)
    tls: TlsFiles | None = None
    """This replica's mutual-TLS files (the CA, its ``control-plane`` certificate and key):
    it serves the ControlPlane service over mutual TLS and calls workers with that
    certificate. None: plaintext and no identity checks (``--insecure``, for development)."""

    @http_port.validator
    def _http_port(self, attribute: attrs.Attribute[int | None], value: int | None) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
            raise InvalidArgument(
                "http_port", value, "must be a port between 1 and 65535, or None for no console"
            )

    def __attrs_post_init__(self) -> None:
        """The fence rule: a fenced write begun just before the leader stops deciding must have
        ended before its lease can expire, so a takeover never waits for it: the longest hold
        of the lease's share lock (:attr:`LedgerSettings.longest_share_lock_hold_s`, 2 x the
        ledger's statement timeout) must fit in the step-down margin. (The leader's renewal
        does not wait for that lock: fenced writes take it FOR KEY SHARE, which a renewal's
        update of ``expires_at`` does not conflict with; see ``schema.sql``.) A placer round is
        one fenced write, so it is bounded by the rows one may hold.

        Raises:
            InvalidArgument: a setting breaks the rule; the message names both sides.
        """
        hold_s = self.ledger.longest_share_lock_hold_s
        timeout_s = self.ledger.statement_timeout_s
        if hold_s > self.lease.step_down_margin_s:
            raise InvalidArgument(
                "ledger.statement_timeout_s",
                timeout_s,
                f"must be <= lease.step_down_margin_s / {MAX_STATEMENTS_PER_FENCED_WRITE} = "
                f"{self.lease.step_down_margin_s / MAX_STATEMENTS_PER_FENCED_WRITE:g}: a fenced write "
                f"holds the lease's share lock up to {MAX_STATEMENTS_PER_FENCED_WRITE} x it, and one "
                f"begun as the leader steps down must end before its lease expires",
            )
        if self.placer.preempt_grace_s != self.reconciler.preempt_grace_s:
            raise InvalidArgument(
                "reconciler.preempt_grace_s",
                self.reconciler.preempt_grace_s,
                f"must be placer.preempt_grace_s = {self.placer.preempt_grace_s:g} (the placer holds"
                " a preempted worker for the grace the reconciler asks of it)",
            )
        check_not_above(
            self,
            "placer.max_placements_per_round",
            "ledger.max_rows_per_fenced_write",
            "a round's placements are one fenced write",
        )
