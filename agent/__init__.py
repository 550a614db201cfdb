"""The worker program: the Worker gRPC service, acceptance rules, job runtimes, heartbeats.

Entry points are in :mod:`agent.main` (:func:`agent.main.run_agent`, :func:`agent.main.main`).
Modules: :mod:`agent.messages` (typed messages), :mod:`agent.acceptance` (the pure Assign /
Cancel rules), :mod:`agent.runtimes` (sleep and command jobs), :mod:`agent.reaper` (the
per-job supervisor process of a command job: pauses the job at the fence deadline, kills it at
the grace, outlives the agent), :mod:`agent.adoption` (the records a restarted agent takes its
predecessor's jobs over by), :mod:`agent.joblog` (the ``agent.jsonl`` start/stop log), :mod:`agent.core`
(the :class:`~agent.core.Agent`, in layers over :mod:`agent.state`: :mod:`agent.registration`,
:mod:`agent.heartbeat`, :mod:`agent.self_fence`, :mod:`agent.leave`), :mod:`agent.fence` (its
fence deadline), :mod:`agent.running` (its jobs' tasks, start and stop lines),
:mod:`agent.control_plane` (register/heartbeat behind a protocol), :mod:`agent.service` (the
protobuf boundary of the Worker service).
Imports only :mod:`runtime` and :mod:`protocol`.

Keep this file free of imports: every command job's reaper process imports it on its way to
:mod:`agent.reaper`, and its start cost is part of every job's.
"""
