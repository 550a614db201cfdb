"""The worker program: the Worker gRPC service, acceptance rules, job runtimes, heartbeats.

Entry points are in :mod:`agent.main`; the modules are listed in docs/development.md, "Layout".
Imports only :mod:`runtime` and :mod:`protocol`.

Keep this file free of imports: every command job's reaper process imports it on its way to
:mod:`agent.reaper`, and its start cost is part of every job's.
"""
