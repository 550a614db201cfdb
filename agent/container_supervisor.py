"""The per-job supervisor process of a container job: the reaper's protocol, with Docker calls.

A container job's processes are the Docker engine's children, not the agent's, so this process
takes the reaper's place and keeps its protocol and deadline loop (:class:`agent.deadman.Deadman`),
its report with ``reason`` (:class:`Reason`), ``reason_detail`` and ``removed=1`` more. Threads
copy the container's log into the job's files, wait in ``docker wait`` and ping the engine; an
engine that is gone has the container's processes SIGKILLed here. docs/design.md, "Job runtimes".

Command line (:func:`agent.container.supervisor_argv`): ``python -I -c BOOTSTRAP SPEC_JSON``; the
engine is the one the ``DOCKER_*`` variables name, or the default socket.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from agent import deadman

PING_EVERY_S = 1.0
"""How often the engine is pinged while the container runs, in seconds."""
PINGS_LOST = 3
"""Failed pings in a row after which the engine counts as gone: a slow engine (a loaded
machine) must not get its containers killed; one whose socket is gone fails each at once."""
API_TIMEOUT_S = 10.0
"""Timeout of one engine call (a ping: :data:`PING_TIMEOUT_S`), in seconds."""
PING_TIMEOUT_S = 5.0
LOG_DRAIN_S = 2.0
"""How long the log threads may take to write the container's last output after its end."""
_BOOTSTRAP = "import sys; sys.path.append({root!r}); from agent.container_supervisor import run; run()"


class Reason(enum.Enum):
    """Why a container job ended, where its exit code does not say it: the first word of its
    outcome's ``detail`` (``oom_killed: ...``), which ``stockade job`` shows."""

    OOM_KILLED = "oom_killed"
    """The kernel's OOM killer killed it: it used more than its ``memory_mb`` (no swap)."""
    IMAGE_NOT_FOUND = "image_not_found"
    """Its image is not on the worker (nothing is pulled)."""
    COMMAND_NOT_FOUND = "command_not_found"
    """Its command is not in the image, or cannot be executed there."""
    NO_CONTAINER_ENGINE = "no_container_engine"
    """The worker's Docker engine did not answer, when it was to start or while it ran."""
    CONTAINER_ERROR = "container_error"
    """The engine refused to create or start it for another reason (the words say which)."""


def bootstrap(package_root: str) -> str:
    """The ``-c`` program that imports this module from ``package_root`` and runs it."""
    return _BOOTSTRAP.format(root=package_root)


def _engine_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says the engine did not answer (no connection, a timeout), as opposed to
    an answer that refused the call."""
    import docker.errors
    import requests.exceptions

    if isinstance(exc, docker.errors.APIError):
        return False
    return isinstance(exc, requests.exceptions.RequestException | docker.errors.DockerException | OSError)


def _not_running(exc: BaseException) -> bool:
    """Whether ``exc`` is the engine saying the container is not running (any more) or gone."""
    import docker.errors

    return isinstance(exc, docker.errors.NotFound) or (
        isinstance(exc, docker.errors.APIError) and exc.status_code == 409
    )


class _Supervisor(deadman.Deadman):
    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(
            grace_s=float(spec["stop_grace_s"]), deadline_path=str(spec.get("deadline_path") or "")
        )
        self.spec = spec
        self.engine_lost: str | None = None
        """Why the engine counts as gone (None while it answers)."""
        self.exit_status: int | None = None
        """The container's exit code once ``docker wait`` returned it."""
        self.ended = threading.Event()
        """Set when the container has ended or the engine is gone."""
        self.client: Any = None
        self.container: Any = None
        self.pid = 0
        """The host pid of the container's init process (0: unknown)."""

    def lose_engine(self, why: str) -> None:
        """The engine is gone: SIGKILL the container's processes ourselves, and end."""
        if self.engine_lost is None:
            self.engine_lost = why
        self.kill_without_engine()
        self.ended.set()

    def kill_without_engine(self) -> None:
        """SIGKILL the container's processes without the engine: every process whose cgroup
        names the container's id (its init first, when known)."""
        if self.container is None:
            return
        victims = _processes_in_cgroup(self.container.id, first=self.pid)
        if not victims:
            _say("cannot kill the container without its engine: none of its processes was found")
            return
        killed = []
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError as exc:
                _say(f"cannot kill the container's process {pid} without its engine: {exc}")
                continue
            killed.append(pid)
        if killed:
            # A paused container's processes are frozen: SIGKILL takes effect once they thaw.
            _thaw(victims[0])
            _say(f"the engine is gone: killed the container's processes {killed}")
            self.killed = True

    def call(self, what: str, *args: Any, **kwargs: Any) -> bool:
        """Call the container's method ``what``; True when it was done. A container that is not
        running any more is fine (False); an engine that does not answer is lost."""
        try:
            getattr(self.container, what)(*args, **kwargs)
        except Exception as exc:
            if _not_running(exc):
                return False
            if _engine_gone(exc):
                self.lose_engine(f"the engine did not answer docker {what}: {exc}")
                return False
            _say(f"docker {what} failed: {exc}")
            return False
        return True

    def kill(self) -> None:
        self.call("kill")
        self.killed = True

    def job_exited(self) -> bool:
        return self.ended.is_set()

    def ended_early(self) -> bool:
        return self.ended.is_set()

    def term(self) -> None:
        self.call("kill", signal="SIGTERM")

    def pause(self) -> None:
        """Pause the container (``docker pause``) and record when. One that has just ended is
        left to end on its own; one whose pause fails otherwise may be running, which the fence
        forbids: it is killed (through the engine, and without it)."""
        try:
            self.container.pause()
        except Exception as exc:
            if _not_running(exc):
                return  # it ended: the waiter reports its end
            if _engine_gone(exc):
                self.lose_engine(f"the engine did not answer docker pause: {exc}")
            else:
                _say(f"docker pause failed, killing the container instead: {exc}")
                self.kill()
                self.kill_without_engine()
            self.stopped = True
        else:
            self.paused = True
        self.record_fenced()

    def unpause(self) -> None:
        self.call("unpause")

    def wait_for_end(self) -> None:
        """Thread: block in ``docker wait`` until the container ends (or the engine goes)."""
        try:
            self.exit_status = int(self.container.wait()["StatusCode"])
        except Exception as exc:
            if not self.ended.is_set():
                self.lose_engine(f"docker wait failed: {exc}")
        self.ended.set()

    def watch_engine(self) -> None:
        """Thread: ping the engine until the container ended; lose it after failed pings."""
        import docker

        failures = 0
        pinger: Any = None
        try:
            while not self.ended.wait(PING_EVERY_S):
                try:
                    if pinger is None:
                        pinger = docker.DockerClient(**self.client_args(PING_TIMEOUT_S))
                    pinger.ping()
                    failures = 0
                except Exception as exc:
                    failures += 1
                    if failures >= PINGS_LOST:
                        self.lose_engine(f"{failures} pings failed, the last: {exc}")
        finally:
            if pinger is not None:
                pinger.close()

    def follow_log(self, stream: str, fd: int) -> None:
        """Thread: copy the container's ``stream`` (stdout or stderr) to ``fd`` as it comes."""
        try:
            for chunk in self.container.logs(
                stdout=stream == "stdout", stderr=stream == "stderr", stream=True, follow=True
            ):
                os.write(fd, chunk)
        except Exception as exc:
            if self.engine_lost is None and not self.ended.is_set():
                _say(f"cannot follow its {stream}: {exc}")

    def client_args(self, timeout_s: float) -> dict[str, Any]:
        from docker.utils import kwargs_from_env

        return {**kwargs_from_env(), "timeout": timeout_s}

    def create(self) -> str | None:
        """Create and start the container; None once it runs, else the report's ``error``."""
        import docker
        import docker.errors

        spec = self.spec
        try:
            self.client = docker.DockerClient(**self.client_args(API_TIMEOUT_S))
            self.client.ping()
        except Exception as exc:
            return f"{Reason.NO_CONTAINER_ENGINE.value}: the Docker engine does not answer: {exc}"
        nano_cpus = int(spec["nano_cpus"])
        with contextlib.suppress(Exception):
            # The engine refuses more CPUs than its host has (a worker may offer more than the
            # machine holds): the container then gets them all.
            nano_cpus = min(nano_cpus, int(self.client.info()["NCPU"]) * 1_000_000_000)
        options = {
            "command": list(spec["argv"]) or None,
            "name": spec["name"],
            "labels": dict(spec["labels"]),
            "environment": dict(spec["env"]),
            "nano_cpus": nano_cpus,
            "mem_limit": int(spec["mem_bytes"]),
            "memswap_limit": int(spec["mem_bytes"]),  # equal: no swap
            "init": True,
            "user": str(spec.get("user") or "") or None,  # None: the image's user
            "working_dir": str(spec.get("workdir") or "") or None,  # None: the image's
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "stdin_open": False,
            "detach": True,
        }
        if spec.get("oom_score_adj") is not None:
            options["oom_score_adj"] = int(spec["oom_score_adj"])  # the first the OOM killer takes
        gpus = [str(u) for u in spec.get("gpus") or ()]
        if gpus and self.offers_gpus():
            # Those GPUs alone (docker run --gpus '"device=0,3"'); inside, CUDA numbers them from
            # 0, so the host's CUDA_VISIBLE_DEVICES would name the wrong ones.
            options["device_requests"] = [
                docker.types.DeviceRequest(driver="nvidia", device_ids=gpus, capabilities=[["gpu"]])
            ]
            options["environment"] = {
                k: v for k, v in options["environment"].items() if k != "CUDA_VISIBLE_DEVICES"
            }
        try:
            try:
                self.container = self.client.containers.create(spec["image"], **options)
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: a container of this name is left over
                    raise
                self.client.containers.get(spec["name"]).remove(force=True)
                self.container = self.client.containers.create(spec["image"], **options)
        except docker.errors.ImageNotFound:
            return (
                f"{Reason.IMAGE_NOT_FOUND.value}: image {spec['image']!r} is not on this worker "
                "(nothing is pulled: load or build it there)"
            )
        except Exception as exc:
            return _refused("create", exc)
        try:
            self.container.start()
        except Exception as exc:
            with contextlib.suppress(Exception):
                self.container.remove(force=True)
            text = _explain(exc)
            if "executable file not found" in text or "no such file or directory" in text:
                return f"{Reason.COMMAND_NOT_FOUND.value}: {text}"
            return _refused("start", exc)
        with contextlib.suppress(Exception):
            self.container.reload()
            self.pid = int(self.container.attrs["State"]["Pid"] or 0)
        return None

    def offers_gpus(self) -> bool:
        """Whether the engine can hand GPUs to a container: it knows the ``nvidia`` runtime (the
        NVIDIA Container Toolkit). Else a job's gpu units reach it only as environment
        variables, and it runs all the same."""
        try:
            return "nvidia" in (self.client.info().get("Runtimes") or {})
        except Exception:
            return False

    def supervise(self) -> int:
        """Run until the container has ended (or the engine is gone)."""
        for target in (self.wait_for_end, self.watch_engine):
            threading.Thread(target=target, daemon=True).start()
        return super().supervise()

    def reap(self) -> int | None:
        """0 once the container has ended (:meth:`finish` reads how), else None."""
        return 0 if self.ended.is_set() else None

    def finish(self, log_threads: list[threading.Thread]) -> dict[str, object]:
        """The report's fields once the container ended: its state, then remove it."""
        end = time.monotonic()
        code = self.exit_status
        reason: Reason | None = None
        detail: str | None = None
        if self.engine_lost is not None:
            reason, detail = Reason.NO_CONTAINER_ENGINE, f"the Docker engine is gone: {self.engine_lost}"
            code = None
        else:
            try:
                self.container.reload()
                state = self.container.attrs["State"]
                code = int(state.get("ExitCode", code if code is not None else -1))
                if state.get("OOMKilled"):
                    mib = int(self.spec["mem_bytes"]) // 2**20
                    reason = Reason.OOM_KILLED
                    detail = f"the kernel killed it: it used more than its memory_mb of {mib} (no swap)"
            except Exception as exc:
                if _engine_gone(exc):
                    reason, detail = Reason.NO_CONTAINER_ENGINE, f"the Docker engine is gone: {exc}"
        for thread in log_threads:
            thread.join(LOG_DRAIN_S)
        if reason is None and code in (126, 127):
            missing = self.init_error()
            if missing:
                reason, detail = Reason.COMMAND_NOT_FOUND, missing
        removed = None
        if self.engine_lost is None:
            try:
                self.container.remove(force=True)
                removed = 1
            except Exception as exc:
                if _not_running(exc):
                    removed = 1
        return {
            "exit_code": code,
            "ended_monotonic_s": repr(end),
            "stopped": int(self.stopped),
            "fenced_monotonic_s": None if self.fenced_monotonic_s is None else repr(self.fenced_monotonic_s),
            "reason": None if reason is None else reason.value,
            "reason_detail": detail,
            "removed": removed,
        }

    def init_error(self) -> str | None:
        """The message of the container's init (``docker run --init``: tini) when it could not
        exec the command (``exec foo failed: No such file or directory``), else None."""
        try:
            tail = self.container.logs(stdout=False, stderr=True, tail=5).decode("utf-8", "replace")
        except Exception:
            return None
        for line in tail.splitlines():
            if "[FATAL tini" in line and "exec " in line:
                return line.split("]", 1)[-1].strip()
        return None


def _processes_in_cgroup(container_id: str, *, first: int = 0) -> list[int]:
    """The processes whose cgroup (``/proc/<pid>/cgroup``) names ``container_id``, ``first``
    (the container's init, when known) before the others."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cgroup", encoding="ascii", errors="replace") as file:
                if container_id in file.read():
                    found.append(int(entry))
        except OSError:
            continue
    return sorted(found, key=lambda pid: (pid != first, pid))


def _thaw(pid: int) -> None:
    """Thaw the freezer cgroup of process ``pid`` (where ``docker pause`` froze it), so the
    SIGKILLs sent to its frozen processes take effect; best effort (cgroup v1 ``freezer``, v2
    ``cgroup.freeze``)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as file:
            lines = file.read().splitlines()
    except OSError:
        return
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "freezer" in controllers.split(","):
            target, value = f"/sys/fs/cgroup/freezer{path}/freezer.state", "THAWED"
        elif controllers == "":
            target, value = f"/sys/fs/cgroup{path}/cgroup.freeze", "0"
        else:
            continue
        with contextlib.suppress(OSError), open(target, "w", encoding="ascii") as file:
            file.write(value)


def _say(text: str) -> None:
    """One line of the supervisor's own in the job's ``stderr.log``, saying it is the supervisor's."""
    print(f"[stockade container supervisor] {text}", file=sys.stderr, flush=True)


def _explain(exc: BaseException) -> str:
    """The engine's own words for a refused call, else the exception's."""
    return str(getattr(exc, "explanation", None) or exc)


def _refused(what: str, exc: BaseException) -> str:
    """The report's ``error`` for a container the engine did not ``what`` (create, start)."""
    if _engine_gone(exc):
        return f"{Reason.NO_CONTAINER_ENGINE.value}: the Docker engine stopped answering: {exc}"
    return f"{Reason.CONTAINER_ERROR.value}: cannot {what} the container: {_explain(exc)}"


def main(args: list[str]) -> int:
    """Run the supervisor (docs/design.md, "Job runtimes"); returns its exit status."""
    if len(args) != 2:
        print("usage: container_supervisor.py SPEC_JSON", file=sys.stderr)
        return 2
    spec = json.loads(args[1])
    started_fd = int(spec.get("started_fd", -1))
    if started_fd >= 0:
        os.set_inheritable(started_fd, False)
    # Blocked in every thread (threads inherit the mask), taken with sigtimedwait.
    signal.pthread_sigmask(signal.SIG_BLOCK, _Supervisor.handled)
    libc = deadman.load_libc()
    if libc is not None:
        libc.prctl(deadman.PR_SET_PDEATHSIG, deadman.KILL_SIGNAL, 0, 0, 0)  # type: ignore[attr-defined]
    if os.getppid() != int(spec["parent_pid"]):
        return deadman.EXIT_AGENT_GONE
    supervisor = _Supervisor(spec)
    supervisor.read_deadline()
    if supervisor.fence_due():
        return deadman.refuse_fenced()
    error = supervisor.create()
    if error is not None:
        return deadman.cannot_start(error)
    deadman.tell_started(started_fd)
    log_threads = [
        threading.Thread(target=supervisor.follow_log, args=stream, daemon=True)
        for stream in (("stdout", 1), ("stderr", 2))
    ]
    for thread in log_threads:
        thread.start()
    supervisor.supervise()
    fields = supervisor.finish(log_threads)
    deadman.write_report(**fields)
    code = fields["exit_code"]
    return code if isinstance(code, int) and 0 <= code < 256 else 1


def run() -> None:
    """The process entry point: :func:`main` on ``sys.argv``, then exit at once."""
    deadman.exit_with(main)


if __name__ == "__main__":
    run()
