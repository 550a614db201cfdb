"""The local cluster's launcher (:mod:`ops.cluster` is its public face): the record
(:mod:`~ops.launcher.state`), the plan (:mod:`~ops.launcher.plan`), one ``up``
(:mod:`~ops.launcher.up`) over the drivers (:mod:`~ops.launcher.driver`: processes in
:mod:`~ops.launcher.control`, containers in :mod:`~ops.launcher.docker`), readiness and the
operating system's side (:mod:`~ops.launcher.ready`, :mod:`~ops.launcher.procs`), and the
databases beside them (:mod:`~ops.launcher.pg`, :mod:`~ops.launcher.hadb`).
"""
