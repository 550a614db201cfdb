"""``stockade agent`` (one worker) and ``stockade fleet`` (many workers in one process): the
options both take are declared once, in :data:`WORKER_OPTIONS`, which
:func:`ops.cli.options.with_options` gives to each command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import attrs
import typer

from ops.cli.base import app
from ops.cli.common import errors, fail
from ops.cli.options import Option, Options, settings_fields, settings_rows, with_options
from ops.cli.processes import PROCESS_OPTIONS, cert_folder, check_tls_files
from ops.config import named_addresses
from runtime import identifiers
from runtime.identifiers import parse_labels
from runtime.oom import (
    DEFAULT_AGENT_OOM_SCORE_ADJ,
    MAX_OOM_SCORE_ADJ,
    MIN_JOB_OOM_SCORE_ADJ,
    check_oom_score_adj,
)
from runtime.priority import check_nice
from runtime.resources import merge_offers
from runtime.settings.agent import (
    JOB_RESOURCES_CHOICES,
    MAX_JOB_NICE,
    MAX_JOB_PIDS,
    MAX_OUTPUT_MB,
    MIN_JOB_NICE,
    MIN_JOB_PIDS,
    AgentSettings,
    OutputSettings,
)
from runtime.tls import TlsFiles

_OUTPUT = OutputSettings()


def _default(name: str) -> Any:
    """An AgentSettings field's default (the options' defaults come from the settings class)."""
    return getattr(attrs.fields(AgentSettings), name).default


_agent = settings_rows("agent", _default)


def _resources_checked(resources: list[str] | None) -> list[str] | None:
    """The --resource values, checked as they are parsed (as :func:`_labels_checked`)."""
    from runtime.errors import InvalidArgument

    try:
        merge_offers(resources or [])
    except InvalidArgument as exc:
        raise typer.BadParameter(str(exc)) from exc
    return resources


WORKER_OPTIONS: dict[str, Option] = {
    **_agent(
        "heartbeat_interval_s",
        help="Time between heartbeats until the cluster tells another interval, seconds (the "
        "self-fence span stretches in proportion with a longer one).",
    ),
    **_agent(
        "heartbeat_interval_min_s", help="Refuse a heartbeat interval the cluster tells below this, seconds."
    ),
    **_agent(
        "heartbeat_interval_max_s", help="Refuse a heartbeat interval the cluster tells above this, seconds."
    ),
    **_agent(
        "heartbeat_timeout_s",
        help="Send a heartbeat (or registration) to the next control plane too after this long "
        "without an answer, seconds (the first may still answer until shortly before the fence deadline).",
    ),
    **_agent(
        "self_fence_after_s",
        help="Pause every job after this long without an acknowledged heartbeat, seconds.",
    ),
    **_agent(
        "db_outage_grace_s",
        min=0.0,
        help="Kill paused jobs after this long without an acknowledged heartbeat, seconds: the longest "
        "database outage (or cut-off) running work survives; 0: kill at the fence, no pause.",
    ),
    **_agent(
        "restart_hold_s",
        min=0.0,
        max=600.0,
        help="On SIGHUP (a planned restart: the agent exits leaving its jobs running, for the agent "
        "started next on the same work dir to take over) ask the control planes to hold the worker "
        "this long, seconds: no silence counts and nothing is placed on it meanwhile; 0: no hold.",
    ),
    **_agent(
        "leave_timeout_s",
        help="At a clean stop, once every job has ended, keep trying this long to have a control plane "
        "record that the worker left, seconds (past it the worker is declared dead after dead_after "
        "instead).",
    ),
    **_agent(
        "register_timeout_s",
        help="How long a new registration (which holds no job), or a paused worker's heartbeat after "
        "calls that failed, waits at most for its answer, seconds.",
    ),
    **_agent(
        "register_retry_max_s",
        help="Registration retries wait a jittered pause whose ceiling doubles per failed attempt up "
        "to this, seconds.",
    ),
    **_agent(
        "max_concurrent_starts",
        help="Most command jobs of this process starting at once (from their reaper's fork until the "
        "job has exec'd); the others wait, holding their capacity.",
    ),
    **_agent(
        "max_concurrent_leaves",
        help="At a clean stop, most of this process's workers asking a control plane to record their "
        "leave at once (a fleet's workers take turns).",
    ),
    **_agent(
        "job_nice",
        help=f"Run command jobs this much lower in CPU priority than the agent (nice, "
        f"{MIN_JOB_NICE}..{MAX_JOB_NICE}; 0: the agent's priority).",
    ),
    **_agent(
        "job_oom_score_adj",
        help=f"oom_score_adj of command and container jobs ({MIN_JOB_OOM_SCORE_ADJ}..{MAX_OOM_SCORE_ADJ}): "
        "when the machine runs out of memory the kernel kills the highest first; 1000: a job before "
        "anything else.",
    ),
    **_agent(
        "job_pids_max",
        help=f"Most processes (and threads) one command job may have at once ({MIN_JOB_PIDS}.."
        f"{MAX_JOB_PIDS}; its cgroup's pids.max: not enforced in rlimit mode).",
    ),
    **_agent(
        "usage_interval_s",
        help="Measure what the running command jobs use (CPU and memory, from their cgroups) this "
        "often, seconds; the next heartbeat carries it to the console's job and worker pages. 0: never.",
    ),
    **_agent(
        "job_resources",
        help=f"How command jobs' cpu_millis and memory_mb are enforced ({', '.join(JOB_RESOURCES_CHOICES)}): "
        "auto takes cgroup2, else cgroup1, else rlimit (RLIMIT_AS only); a mode named must work "
        "here or the agent does not start. Registered as the label resources=<mode>.",
    ),
    **_agent(
        "job_user",
        help="When the agent runs as root, run every command and container job as this one system "
        "user (created on first use; never root): the shared, weaker mode, in which jobs can reach "
        "each other. Default: a uid of its own for each job (see --job-uids). Ignored when the "
        "agent is not root: jobs run as its user.",
    ),
    "job_uids": Option(
        "",
        group="agent",
        metavar="START-END",
        help="When the agent runs as root, give each running job one uid (and gid) of this range "
        "(1000..2147483646) that no other running job holds; it must hold min(cpu_millis, memory_mb) "
        "uids. A fleet splits it evenly among its workers. Default: a free block of its own from "
        "uid 2**30 up, locked under /run/stockade/uid-blocks.",
    ),
    "max_output_mb": Option(
        _OUTPUT.max_output_mb,
        min=1,
        max=MAX_OUTPUT_MB,
        help="Keep at most this many MiB of each job's stdout, and of its stderr: past it the oldest "
        "part is dropped (stockade logs says how much).",
    ),
    "output_retention_s": Option(
        _OUTPUT.output_retention_s,
        help="Delete a job's folder (its output, its working files) this long after it ended, seconds "
        "(never while it runs).",
    ),
    "oom_score_adj": Option(
        DEFAULT_AGENT_OOM_SCORE_ADJ,
        help="oom_score_adj (-1000..1000) this process and its job supervisors ask for at start, so "
        "the kernel's OOM killer takes jobs first; without CAP_SYS_RESOURCE it goes as low as it "
        "may and says so.",
    ),
    "resource": Option(
        None,
        kind=list[str] | None,
        help="Countable devices offered, NAME=ID,ID,... (repeatable), e.g. --resource gpu=0,1,2,3; each "
        "unit id once; a fleet's workers each offer them (a worker's own resources in the spec win). "
        "Without a gpu here, the GPUs nvidia-smi -L lists, where it exists. Jobs ask them with "
        "stockade submit --resource gpu=2 (docs/devices.md).",
        callback=_resources_checked,
        metavar="NAME=ID,ID,...",
        show_default=False,
    ),
    **PROCESS_OPTIONS,
}
"""The options of ``stockade agent`` and ``stockade fleet``, in the order ``--help`` lists them;
defaults from :class:`AgentSettings` and :class:`OutputSettings`."""


def _settings_fields(options: Options) -> dict[str, Any]:
    """The :class:`AgentSettings` fields the options set, every worker's the same."""
    output = OutputSettings(
        max_output_mb=options["max_output_mb"], output_retention_s=options["output_retention_s"]
    )
    return {**settings_fields(WORKER_OPTIONS, options, "agent"), "output": output}


def _main_arguments(options: Options) -> dict[str, Any]:
    """The keyword arguments of the agent's and the fleet's ``main`` the options set."""
    return {
        "json_logs": options["json_logs"],
        "metrics_port": options["metrics_port"] or None,
        "nice": options["nice"],
        "oom_score_adj": options["oom_score_adj"],
    }


def _check(options: Options) -> None:
    """Check what only this machine can tell (InvalidArgument): the priorities, the job user."""
    from runtime.os_users import resolve_unprivileged_user

    check_nice(options["nice"])
    check_oom_score_adj(options["oom_score_adj"])
    if options["job_user"]:
        resolve_unprivileged_user(options["job_user"])  # refuse to start without the job user


def _fleet_certificate(folder: Path | None, fleet_id: str, worker_ids: list[str]) -> TlsFiles | None:
    """The fleet certificate's files, ``<folder>/<fleet_id>.crt`` and ``.key`` (None where absent,
    or with --insecure), checked: the key private, a fleet certificate naming every worker of
    ``worker_ids`` (else one line, exit 1)."""
    from ops.certs import NotAStockadeCertificate, describe

    if folder is None:
        return None
    files = TlsFiles.in_dir(folder, fleet_id)
    if not files.cert_path.exists():
        return None
    with errors():
        files.check()
        try:
            holder = describe(files.cert_path).identity
        except NotAStockadeCertificate as exc:
            fail(f"{files.cert_path}: {exc}")
        if holder is None or not holder.is_fleet:
            named = holder or "no Stockade identity"
            fail(
                f"{files.cert_path} is not a fleet certificate (it names {named}): "
                f"issue one with `stockade certs issue --role worker --id {fleet_id} --workers "
                f"{','.join(worker_ids)}`, or remove it for one connection per worker"
            )
        missing = [w for w in worker_ids if w not in holder.workers]
        if missing:
            fail(
                f"{files.cert_path} does not name worker {missing[0]!r} ({len(missing)} of the "
                f"fleet's {len(worker_ids)} workers are missing): re-issue it with --workers "
                f"{','.join(worker_ids)}"
            )
    return files


def _labels_checked(labels: list[str] | None) -> list[str] | None:
    """The --label values, checked as they are parsed: `stockade up --agent-args` parses an
    agent's options before it records them, so it refuses a bad label before anything starts."""
    from runtime.errors import InvalidArgument

    try:
        parse_labels(labels or [])
    except InvalidArgument as exc:
        raise typer.BadParameter(str(exc)) from exc
    return labels


@app.command("agent")
@with_options(WORKER_OPTIONS)
def agent(
    *,
    worker_id: Annotated[str, typer.Option("--id", help="This worker's id, e.g. w-1.")],
    cpu_millis: Annotated[int, typer.Option(help="CPU offered, millicores (1000 = one core).")],
    memory_mb: Annotated[int, typer.Option(help="Memory offered, MiB.")],
    control_planes: Annotated[str, typer.Option(help="Control-plane addresses, host:port,...")],
    work_dir: Annotated[Path, typer.Option(help="Folder for agent.jsonl and the jobs' output.")],
    port: Annotated[int, typer.Option(help="gRPC port of the Worker service (0: a free one).")] = 0,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    advertise_address: Annotated[
        str, typer.Option(help="host:port the leader should call (default: the listen address).")
    ] = "",
    options: Options,
    no_containers: Annotated[
        bool,
        typer.Option(
            "--no-containers",
            help="Run no container jobs here: register container=none without asking the Docker "
            "engine (by default container=docker when the engine answers a ping at start).",
        ),
    ] = False,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            help="A label key=value for constraints to match (repeatable), e.g. --label gpu=a100. "
            "The agent sets container=docker|none and resources=cgroup2|cgroup1|rlimit itself.",
            callback=_labels_checked,
        ),
    ] = None,
) -> None:
    """Run one worker agent in the foreground until SIGTERM or Ctrl-C (a clean stop: every job
    stopped), or SIGHUP (a planned restart: it exits leaving its jobs running for the agent
    started next with the same --id and --work-dir).

    It serves the Worker service over mutual TLS with <certs-dir>/<id>.crt (a worker
    certificate for this id), answers only control-plane certificates from the same CA, and
    calls the control planes with its own certificate."""
    from agent.main import main as agent_main

    folder = cert_folder(options["certs_dir"], options["insecure"])
    with errors():
        settings = AgentSettings(
            worker_id=worker_id,
            control_planes=named_addresses(control_planes),
            cpu_millis=cpu_millis,
            memory_mb=memory_mb,
            work_dir=str(work_dir.absolute()),
            listen_host=host,
            listen_port=port,
            advertise_address=advertise_address,
            **_settings_fields(options),
            tls=None if folder is None else TlsFiles.in_dir(folder, worker_id),
            labels={**parse_labels(label or []), **({"container": "none"} if no_containers else {})},
            resources=merge_offers(options["resource"] or []),
        )
    with errors():
        _check(options)
    check_tls_files(folder, "worker", [worker_id], f"worker {worker_id}")
    with errors():  # a registration refused for the certificate's id ends the agent in one line
        agent_main(settings, **_main_arguments(options))


@app.command("fleet")
@with_options(WORKER_OPTIONS)
def fleet(
    *,
    spec: Annotated[
        Path,
        typer.Option(
            help='JSON list of the workers to host: [{"id": "w-1", "port": 7201, "cpu_millis": 8000, '
            '"memory_mb": 16384, "work_dir": "...", "advertise_address": ""}, ...].'
        ),
    ],
    control_planes: Annotated[
        str, typer.Option(help="Control-plane addresses, host:port,... (a worker's own list wins).")
    ] = "",
    fleet_id: Annotated[
        str, typer.Option("--id", help="This process's id, bound to its log lines.")
    ] = "fleet",
    host: Annotated[str, typer.Option(help="Address every worker listens on.")] = "127.0.0.1",
    options: Options,
) -> None:
    """Run many workers' agents in one process until SIGTERM or Ctrl-C.

    Each worker serves with its own certificate, <certs-dir>/<id>.crt, as a lone agent does.
    The workers call the control planes over one connection per control plane, presenting the
    fleet certificate <certs-dir>/<fleet id>.crt (stockade certs issue --role worker --id
    <fleet id> --workers w-1,w-2,...), which must name every hosted worker; without that file
    each worker calls with its own certificate, over connections of its own.

    Each worker keeps its own id, port, registration, heartbeats, work dir and agent.jsonl.
    When one worker's agent fails (its port is taken, ...) every worker's jobs are stopped
    and the command exits 1 naming the worker; a bad spec exits 2.
    """
    from agent.fleet import WorkerFailed, fleet_settings, load_fleet_spec
    from agent.fleet import main as fleet_main

    with errors():
        identifiers.check_id(fleet_id, field="fleet_id")
        workers = load_fleet_spec(spec)
    folder = cert_folder(options["certs_dir"], options["insecure"])
    worker_ids = [w.worker_id for w in workers]
    with errors():
        settings = fleet_settings(
            workers,
            control_planes=named_addresses(control_planes),
            listen_host=host,
            cert_dir=folder,
            resources=merge_offers(options["resource"] or []),
            **_settings_fields(options),
        )
        _check(options)
    check_tls_files(folder, "worker", worker_ids, f"fleet {fleet_id}")
    fleet_tls = _fleet_certificate(folder, fleet_id, worker_ids)
    try:
        fleet_main(
            settings,
            fleet_id=fleet_id,
            control_planes=named_addresses(control_planes),
            fleet_tls=fleet_tls,
            **_main_arguments(options),
        )
    except WorkerFailed as exc:
        fail(f"{fleet_id}: {exc}")
