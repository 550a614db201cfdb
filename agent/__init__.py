"""The worker program: the Worker gRPC service, acceptance rules, job runtimes, heartbeats.

Entry points are in :mod:`agent.main` (:func:`agent.main.run_agent`, :func:`agent.main.main`).
Modules: :mod:`agent.messages` (typed messages), :mod:`agent.acceptance` (the pure Assign /
Cancel rules), :mod:`agent.runtimes` (sleep and command jobs), :mod:`agent.joblog` (the
``agent.jsonl`` start/stop log), :mod:`agent.core` (the :class:`~agent.core.Agent`:
registration, heartbeats, self-fence, jobs), :mod:`agent.control_plane` (register/heartbeat
behind a protocol), :mod:`agent.service` (the protobuf boundary of the Worker service).
Imports only :mod:`runtime` and :mod:`protocol`.
"""
