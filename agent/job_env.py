"""The variables the agent sets in every job's environment, named in this one place. A job's own
variables may not start with ``STOCKADE_`` (``runtime.jobs.RESERVED_ENV_PREFIX``), so none of
these can be overridden.
"""

from __future__ import annotations

from collections.abc import Collection

from agent.messages import JobOrder
from runtime.resources import GPU, env_name

JOB_ID = "STOCKADE_JOB_ID"
"""The job's id (a task of an array: the task's own id)."""
ASSIGNMENT_ID = "STOCKADE_ASSIGNMENT_ID"
"""The assignment's id: this run of the job."""
ARRAY_ID = "STOCKADE_ARRAY_ID"
"""A task of an array: the array's id (its first task's id). Unset for other jobs."""
ARRAY_INDEX = "STOCKADE_ARRAY_INDEX"
"""A task of an array: its index (``--array 1-100``: 1 to 100). Unset for other jobs."""
WORKER_ID = "STOCKADE_WORKER_ID"
"""The worker's id (container jobs)."""
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
"""A job holding gpu units: their ids, comma-separated, as CUDA reads them (NVIDIA's CUDA
C++ Programming Guide, "CUDA Environment Variables"). Empty for a job holding none on a worker
that offers gpu units (CUDA then shows it no device: another job's units stay that job's);
unset on a worker that offers none (Stockade does not manage its GPUs, if any)."""


def job_environment(order: JobOrder, offered: Collection[str] = ()) -> dict[str, str]:
    """The variables of ``order``'s job: :data:`JOB_ID` and :data:`ASSIGNMENT_ID`, for a task of
    an array :data:`ARRAY_ID` and :data:`ARRAY_INDEX`, for each device it holds
    ``STOCKADE_RESOURCE_<NAME>`` (:func:`runtime.resources.env_name`) with its unit ids,
    comma-separated (``0,3``), and for gpu :data:`CUDA_VISIBLE_DEVICES` too, empty when the
    worker ``offered`` (the resource names it offers) gpu and the job holds none (docs/devices.md);
    for a gang's task its seat's ``STOCKADE_GANG_*`` (:meth:`runtime.gangs.GangSeat.env`: id,
    rank, size, port, peers)."""
    env = {JOB_ID: str(order.job_id), ASSIGNMENT_ID: str(order.assignment_id)}
    if order.array_index is not None:
        env[ARRAY_INDEX] = str(order.array_index)
        env[ARRAY_ID] = str(order.array_id or order.job_id)
    for name, units in order.units:
        env[env_name(name)] = ",".join(units)
        if name == GPU:
            env[CUDA_VISIBLE_DEVICES] = ",".join(units)
    if GPU in offered and CUDA_VISIBLE_DEVICES not in env:
        env[CUDA_VISIBLE_DEVICES] = ""
    if order.gang is not None:
        env.update(order.gang.env())
    return env
