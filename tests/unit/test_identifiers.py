"""Identity-like fields (ids, addresses, labels) are parsed by one parser each and refused
unless whole and well formed, wherever they are accepted: a registration, the settings, the
fleet spec, the CLI's options and the client's address list."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from actors.validation import check_registration
from agent.fleet import FleetSpecError, parse_fleet_spec
from ops.cli import EXIT_INVALID, app
from ops.cluster import parse_addresses
from runtime.client import ControlPlaneClient
from runtime.constraints import Constraint
from runtime.errors import InvalidArgument
from runtime.identifiers import (
    Address,
    check_id,
    check_label_key,
    check_label_value,
    check_labels,
    format_address,
    parse_address,
    parse_host,
    parse_labels,
)
from runtime.settings.agent import AgentSettings
from runtime.settings.control_plane import ControlPlaneSettings

ISSUE_ADDRESSES = ["a b:80", "http://h:80", "a:b:80", "h\n:80", " :80", "-:1", "host:0080"]
"""The addresses the issue found stored as live workers."""

BAD_ADDRESSES = [
    *ISSUE_ADDRESSES,
    "nowhere",
    ":80",
    "h:",
    "h:0",
    "h:65536",
    "h:+80",
    "h: 80",
    "h:80 ",
    "h:\uff18\uff10",  # full-width digits 80: str.isdigit() says yes
    "h:\u0668\u0660",  # Arabic-Indic digits 80
    "::1:80",  # an IPv6 address needs brackets
    "[::1:80",
    "[1.2.3.4]:80",
    "[fe80::1%eth0]:80",
    "1.2.3:80",  # all-numeric: an IPv4 address or nothing (RFC 1123 2.1)
    "256.1.1.1:80",
    "01.2.3.4:80",
    "h.:80",
    ".h:80",
    "a..b:80",
    "-h:80",
    "h-:80",
    "h_1:80",
    "ünï.example:80",
    f"{'a' * 64}:80",
    f"{'.'.join(['a' * 63] * 4)}:80",  # 255 characters
    "h\x00:80",
    "h:80\n",
]

GOOD_ADDRESSES = {
    "127.0.0.1:7101": Address("127.0.0.1", 7101),
    "[::1]:7101": Address("::1", 7101),
    "[2001:db8::7]:1": Address("2001:db8::7", 1),
    "localhost:65535": Address("localhost", 65535),
    "w-1.example.org:7201": Address("w-1.example.org", 7201),
    "W1.Example.ORG:80": Address("W1.Example.ORG", 80),
    "1host:80": Address("1host", 80),
    "host.123a:80": Address("host.123a", 80),
    f"{'a' * 63}:80": Address("a" * 63, 80),
}


@pytest.mark.parametrize("text", BAD_ADDRESSES)
def test_an_address_that_is_not_host_port_is_refused_naming_the_field_and_value(text: str) -> None:
    """Anything but an IPv4 address, a bracketed IPv6 address or an RFC 1123 host name, then a
    port 1-65535 without leading zeros, is refused."""
    with pytest.raises(InvalidArgument) as info:
        parse_address(text, field="advertise_address")
    assert str(info.value).startswith("advertise_address must be host:port")
    assert info.value.value == text


@pytest.mark.parametrize(("text", "parsed"), GOOD_ADDRESSES.items())
def test_a_good_address_is_taken_as_written(text: str, parsed: Address) -> None:
    """The host comes back without brackets, the port as a number, and str() writes it back."""
    assert parse_address(text) == parsed
    assert str(parsed) == text


@given(st.text(max_size=24))
def test_whatever_is_taken_has_no_space_or_control_character_and_writes_back_the_same(text: str) -> None:
    """An accepted address is printable ASCII without spaces, and writes back as it came."""
    try:
        parsed = parse_address(text)
    except InvalidArgument:
        return
    assert text.isascii() and text.isprintable() and " " not in text
    assert str(parsed) == text


def test_a_listening_host_is_an_address_or_a_host_name_and_an_ipv6_one_is_bracketed_in_addresses() -> None:
    """Listening hosts take IPv6 bare; the address made of one and a port brackets it."""
    assert parse_host("::", field="listen_host") == "::"
    assert parse_host("0.0.0.0", field="listen_host") == "0.0.0.0"
    assert format_address("::1", 7101) == "[::1]:7101"
    assert format_address("127.0.0.1", 7101) == "127.0.0.1:7101"
    for bad in ("", "a b", "[::1]", "h\n", "-"):
        with pytest.raises(InvalidArgument, match="listen_host must be an IPv4 address, an IPv6 address"):
            parse_host(bad, field="listen_host")


@pytest.mark.parametrize("value", ["", "-w", ".w", "w 1", "w/1", "x" * 65, "w\x00", "w\n", "wé", "../etc", 7])
def test_a_bad_id_is_refused(value: Any) -> None:
    """Ids are 1-64 of A-Z a-z 0-9 . _ -, starting with a letter or digit."""
    with pytest.raises(InvalidArgument, match=r"^worker_id must be 1-64 characters of A-Z a-z 0-9 \. _ -"):
        check_id(value, field="worker_id")


def test_a_good_id_is_taken() -> None:
    """Letters, digits, dots, underscores and hyphens, up to 64."""
    for value in ("w-1", "cp_3", "W.1", "9", "x" * 64):
        assert check_id(value, field="worker_id") == value


@pytest.mark.parametrize(
    "key", ["", "-a", "a-", "a b", "a\n", "x" * 64, "/a", "a/", "Example.com/a", "a_b.c/d", "a/b/c", "é"]
)
def test_a_bad_label_key_is_refused(key: str) -> None:
    """A key is a name (1-63, alphanumeric at both ends, - _ . inside), optionally after a
    lower-case DNS subdomain and a slash (Kubernetes' label syntax)."""
    with pytest.raises(InvalidArgument, match=r"^labels key must be a name of 1-63 characters"):
        check_label_key(key)


def test_a_bad_label_key_names_its_field_once() -> None:
    """Given as an option, in a constraint or in a registration, a bad key's error names the
    field once (``--label key``, ``constraints[0].key``, ``labels key``)."""
    for call, field in (
        (lambda: parse_labels(["b@d=1"], field="--label"), "--label key"),
        (lambda: Constraint(key="b@d", op="exists").check(field="constraints[0]"), "constraints[0].key"),
        (lambda: check_labels({"b@d": "1"}), "labels key"),
    ):
        with pytest.raises(InvalidArgument) as caught:
            call()
        assert str(caught.value).startswith(f"{field} must be a name"), str(caught.value)


@pytest.mark.parametrize("value", ["-a", "a-", "a b", "a\n", "x" * 64, "a/b", "é"])
def test_a_bad_label_value_is_refused(value: str) -> None:
    """A value is empty or a name as a key's."""
    with pytest.raises(InvalidArgument, match=r"^labels\[zone\] must be empty or 1-63 characters"):
        check_label_value(value, field="labels[zone]")


def test_good_labels_are_taken_and_too_many_are_refused() -> None:
    """Keys with and without a prefix, empty values; 65 labels are too many."""
    labels = {"zone": "eu-1", "stockade.example.org/rack": "r_7.b", "gpu": ""}
    assert check_labels(labels) == labels
    with pytest.raises(InvalidArgument, match="labels must have at most 64"):
        check_labels({f"k{i}": "" for i in range(65)})


@pytest.mark.parametrize("address", ISSUE_ADDRESSES)
def test_a_registration_with_a_bad_address_is_refused(address: str) -> None:
    """The issue's addresses, in the issue's registration: refused, naming address and value."""
    with pytest.raises(InvalidArgument) as info:
        check_registration(
            worker_id="x-1",
            address=address,
            cpu_millis=1000,
            memory_mb=1024,
            labels={},
            agent_run_id="run",
            registration_seq=1,
        )
    assert (info.value.field, info.value.value) == ("address", address)


def test_a_registration_checks_its_run_id_and_labels() -> None:
    """The agent run id is an id (not empty: it is the registration's idempotency key); labels
    follow the label syntax."""
    good = dict(worker_id="x-1", address="h:1", cpu_millis=1000, memory_mb=1024, labels={})
    check_registration(**good, agent_run_id="0f3a" * 8, registration_seq=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="agent_run_id must not contain control characters"):
        check_registration(**good, agent_run_id="run\x1b[2J", registration_seq=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="agent_run_id must be 1-64 characters"):
        check_registration(**good, agent_run_id="run/1", registration_seq=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"labels\[zone\] must be empty or"):
        check_registration(**{**good, "labels": {"zone": "a b"}}, agent_run_id="run", registration_seq=1)  # type: ignore[arg-type]


AGENT = dict(worker_id="w-1", control_planes=("127.0.0.1:7101",), cpu_millis=1, memory_mb=1, work_dir="/w")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"worker_id": "w 1"}, "worker_id"),
        ({"control_planes": ("127.0.0.1:7101", "a b:80")}, "control_planes[1]"),
        ({"advertise_address": "http://h:80"}, "advertise_address"),
        ({"listen_host": "h\n"}, "listen_host"),
        ({"labels": {"a b": "c"}}, "labels key"),
    ],
)
def test_agent_settings_refuse_a_bad_identity(changes: dict[str, Any], field: str) -> None:
    """An agent does not start with an id, an address or a label it could not register with."""
    with pytest.raises(InvalidArgument) as info:
        AgentSettings(**{**AGENT, **changes})  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"cp_id": "cp 1"}, "cp_id"),
        ({"advertise_address": "host:0080"}, "advertise_address"),
        ({"listen_host": " "}, "listen_host"),
    ],
)
def test_control_plane_settings_refuse_a_bad_identity(changes: dict[str, Any], field: str) -> None:
    """A control plane does not start with an id or an address others could not use."""
    with pytest.raises(InvalidArgument) as info:
        ControlPlaneSettings(**{"cp_id": "cp-1", "database_url": "postgresql://h/db", **changes})
    assert info.value.field == field


FLEET_WORKER = {"id": "w-1", "port": 7201, "cpu_millis": 8000, "memory_mb": 16384, "work_dir": "/srv/w-1"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"id": "w 1"}, "entry 0 (id 'w 1'): id must be 1-64 characters"),
        (
            {"advertise_address": "a:b:80"},
            "entry 0 (id 'w-1'): advertise_address must be host:port with a host",
        ),
        (
            {"control_planes": ["h:1", "-:1"]},
            "entry 0 (id 'w-1'): control_planes[1] must be host:port with a host",
        ),
    ],
)
def test_a_fleet_spec_refuses_a_bad_identity(changes: dict[str, Any], message: str) -> None:
    """The fleet spec parses ids and addresses with the same parsers, naming the entry."""
    with pytest.raises(FleetSpecError) as info:
        parse_fleet_spec([{**FLEET_WORKER, **changes}], source="fleet.json")
    assert str(info.value).startswith(f"fleet.json: {message}")


def test_the_client_and_the_control_planes_option_refuse_a_bad_address() -> None:
    """--control-planes and a client's address list take only host:port addresses."""
    with pytest.raises(InvalidArgument, match=r"^control_planes\[1\] must be host:port with a port"):
        parse_addresses("127.0.0.1:7101, host:0080")
    with pytest.raises(InvalidArgument, match=r"^control_planes\[0\] must be host:port with a host"):
        ControlPlaneClient(["a b:80"])


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("agent", ["--id", "w 1"]),
        ("agent", ["--advertise-address", "a b:80"]),
        ("agent", ["--control-planes", "http://h:80"]),
        ("cp", ["--id", "cp/1"]),
        ("cp", ["--host", "h\n"]),
        ("fleet", ["--id", "fleet 1"]),
        ("status", ["--control-planes", "-:1"]),
    ],
)
def test_cli_options_refuse_a_bad_identity(command: str, args: list[str], tmp_path: Path) -> None:
    """The CLI refuses a bad id or address before starting anything, exiting 2."""
    spec = tmp_path / "fleet.json"
    spec.write_text(json.dumps([{**FLEET_WORKER, "work_dir": str(tmp_path / "w-1")}]))
    defaults = {
        "agent": [
            *("--id", "w-1", "--cpu-millis", "1", "--memory-mb", "1"),
            *("--control-planes", "127.0.0.1:1", "--work-dir", str(tmp_path)),
        ],
        "cp": ["--id", "cp-1", "--database-url", "postgresql://h/db"],
        "fleet": ["--spec", str(spec), "--control-planes", "127.0.0.1:1"],
        "status": [],
    }[command]
    result = CliRunner().invoke(app, [command, *defaults, *args])
    assert result.exit_code == EXIT_INVALID, result.output
    assert "must be" in result.output
