"""The countable devices a worker offers (docs/devices.md): those its settings declare
(``--resource gpu=0,1,2,3``), and, when they declare no ``gpu``, the GPUs ``nvidia-smi -L``
lists where that program exists (none where it does not).
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import attrs
import trio

from runtime.resources import GPU, check_offered, nvidia_smi_units
from runtime.settings.agent import AgentSettings

NVIDIA_SMI = "nvidia-smi"
"""The program that lists a machine's NVIDIA GPUs (``nvidia-smi -L``: one line per GPU)."""
NVIDIA_SMI_TIMEOUT_S = 10.0
"""Longest ``nvidia-smi -L`` may take before the agent goes on without its GPUs, in seconds."""


def listed_gpus(
    program: str = NVIDIA_SMI, *, timeout_s: float = NVIDIA_SMI_TIMEOUT_S
) -> tuple[tuple[str, ...], str]:
    """The GPU indexes ``program -L`` lists, and why there are none when there are none (the
    program is absent, failed or timed out). Blocking: run it in a thread."""
    path = shutil.which(program)
    if path is None:
        return (), f"{program} not found"
    try:
        done = subprocess.run([path, "-L"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return (), f"{program} -L failed: {exc}"
    if done.returncode != 0:
        return (), f"{program} -L exited with {done.returncode}: {done.stderr.strip()[:200]}"
    units = nvidia_smi_units(done.stdout)
    return units, "" if units else f"{program} -L listed no GPU"


async def device_settings(
    settings: AgentSettings, logger: Any, *, program: str = NVIDIA_SMI
) -> AgentSettings:
    """``settings`` with the GPUs ``program -L`` lists as its ``gpu`` units, when its resources
    declare no ``gpu`` and ``detect_gpus`` is on; the offer logged either way.

    Raises:
        runtime.errors.InvalidArgument: the listing holds a unit id twice or too many units.
    """
    resources = dict(settings.resources)
    if GPU not in resources and settings.detect_gpus:
        units, why = await trio.to_thread.run_sync(lambda: listed_gpus(program))
        if units:
            resources[GPU] = units
            logger.info("gpus found", program=program, units=list(units))
        else:
            logger.info("no gpus found", reason=why)
    if resources:
        logger.info("devices offered", **{name: ",".join(units) for name, units in resources.items()})
    return attrs.evolve(settings, resources=check_offered(resources))
