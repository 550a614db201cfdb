"""The rules of countable devices (runtime/resources.py): a worker's ``NAME=ID,...`` and a job's
``NAME=COUNT`` are parsed and checked, bad input refused naming field, value and limit; the
environment names; nvidia-smi's listing read as GPU indexes; a job spec's ``resources`` on the
wire and in its check."""

from __future__ import annotations

import pytest

from runtime.errors import InvalidArgument
from runtime.jobs import JobSpec, SleepRuntime
from runtime.resources import (
    MAX_RESOURCE_UNITS,
    check_offered,
    env_name,
    merge_asks,
    merge_offers,
    nvidia_smi_units,
)
from runtime.wire_jobs import job_spec_from_pb, job_spec_to_pb


def test_a_workers_offers_are_read_per_name() -> None:
    """Repeated ``--resource`` options give name -> unit ids in the order given."""
    assert merge_offers(["gpu=0,1,2,3", "fpga=a"]) == {"fpga": ("a",), "gpu": ("0", "1", "2", "3")}


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (["gpu=0,1,1"], "--resource\\[gpu\\] must list each unit id once \\(listed twice\\), got '1'"),
        (["GPU=0"], "must be 1 to 32 characters of \\[a-z\\]\\[a-z0-9_-\\]\\*, got 'GPU'"),
        (["gpu"], "must be NAME=ID,ID,... \\(e.g. gpu=0,1,2,3\\), got 'gpu'"),
        (["gpu="], "must list at least one unit id"),
        (["gpu=0", "gpu=1"], "must name each resource once \\(gpu named twice\\)"),
        (["gpu=0,a b"], "must be 1 to 64 characters of A-Z a-z 0-9"),
    ],
)
def test_a_bad_offer_is_refused_naming_field_value_and_limit(texts: list[str], message: str) -> None:
    """A unit listed twice, a bad name or unit id, or a resource named twice is refused."""
    with pytest.raises(InvalidArgument, match=message):
        merge_offers(texts)


def test_an_offer_of_too_many_units_is_refused() -> None:
    """More than MAX_RESOURCE_UNITS units of one resource are refused, the count named."""
    with pytest.raises(
        InvalidArgument, match=f"resources\\[gpu\\] must list at most {MAX_RESOURCE_UNITS} units"
    ):
        check_offered({"gpu": [str(i) for i in range(MAX_RESOURCE_UNITS + 1)]})


def test_a_jobs_asks_are_read_and_checked() -> None:
    """``gpu=2`` asks two gpu; a zero, a non-number or a name twice is refused."""
    assert merge_asks(["gpu=2", "fpga=1"]) == {"gpu": 2, "fpga": 1}
    with pytest.raises(InvalidArgument, match="must ask a count between 1 and 256, got 'gpu=0'"):
        merge_asks(["gpu=0"])
    with pytest.raises(InvalidArgument, match="must be NAME=COUNT"):
        merge_asks(["gpu=two"])
    with pytest.raises(InvalidArgument, match="gpu named twice"):
        merge_asks(["gpu=1", "gpu=2"])


def spec(**resources: int) -> JobSpec:
    return JobSpec(
        name="j", cpu_millis=100, memory_mb=10, runtime=SleepRuntime(duration_ms=1), resources=resources
    )


def test_a_spec_carries_its_resources_over_the_wire_and_checks_them() -> None:
    """A spec's resources survive the wire; a count above the limit or a bad name is refused by
    its check; a zero count reads as none."""
    checked = spec(gpu=2).check()
    assert job_spec_from_pb(job_spec_to_pb(checked)) == checked
    assert spec(gpu=0).resources == ()
    with pytest.raises(
        InvalidArgument, match="resources\\[gpu\\] must be a count between 0 and 256, got 300"
    ):
        spec(gpu=300).check()
    with pytest.raises(InvalidArgument, match="resources must be 1 to 32 characters"):
        JobSpec(
            name="j", cpu_millis=100, memory_mb=10, runtime=SleepRuntime(duration_ms=1), resources={"Bad!": 1}
        ).check()


def test_the_environment_names_a_resource_in_capitals() -> None:
    """``gpu`` is STOCKADE_RESOURCE_GPU, ``my-fpga`` STOCKADE_RESOURCE_MY_FPGA."""
    assert env_name("gpu") == "STOCKADE_RESOURCE_GPU"
    assert env_name("my-fpga") == "STOCKADE_RESOURCE_MY_FPGA"


def test_nvidia_smis_listing_gives_the_gpu_indexes() -> None:
    """``nvidia-smi -L`` lines give their GPU indexes; MIG lines under them are not units."""
    listing = (
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1a)\n"
        "  MIG 1g.5gb Device 0: (UUID: MIG-2b)\n"
        "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-3c)\n"
    )
    assert nvidia_smi_units(listing) == ("0", "1")
    assert nvidia_smi_units("") == ()
