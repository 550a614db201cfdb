"""The local cluster's launcher, in four parts (:mod:`ops.cluster` re-exports the public names):

- :mod:`ops.launcher.state`: the state folder and cluster.json (:class:`StateDir`,
  :class:`ClusterConfig`, :class:`ProcessSpec`, :class:`WorkerSpec`); light imports;
- :mod:`ops.launcher.plan`: what ``up`` starts and stops, a pure function;
- :mod:`ops.launcher.control`: :class:`LocalCluster`, which starts, kills and stops processes;
- :mod:`ops.launcher.ready` and :mod:`ops.launcher.procs`: waiting for readiness, and the
  operating-system helpers.
"""
