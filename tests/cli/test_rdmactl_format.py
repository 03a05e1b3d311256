"""rdmactl's tables and JSON for known data."""

from __future__ import annotations

import argparse
import io
import json
import time
from collections.abc import Iterator

import pytest
from dbus_fast import Message, Variant

from rdmad.cli.main import (
    claim_json,
    claim_text,
    claims_json,
    cmd_release,
    device_json,
    devices_json,
    error_line,
    signal_json,
    snake,
)
from rdmad.cli.table import table
from tests.cli.fake_client import FakeClient

DEVICE_PROPS = {
    "Name": "mlx5_0",
    "Index": 1,
    "NodeGuid": "0002:c903:0031:7a40",
    "Ports": [(1, "ACTIVE", "LINK_UP", "ens1f0")],
    "NetDevice": "ens1f0",
    "NumaNode": 0,
    "Claims": [],
}


def test_table_aligns_columns_and_marks_empty_cells() -> None:
    out = table(
        ("DEVICE", "STATE", "NETDEV"),
        [("mlx5_0", "available", "ens1f0"), ("rxe0", "unavailable", "")],
    )
    assert out.splitlines() == [
        "DEVICE  STATE        NETDEV",
        "mlx5_0  available    ens1f0",
        "rxe0    unavailable  -",
    ]


def test_list_json_is_a_list_of_objects_with_snake_case_keys() -> None:
    rows = [("mlx5_0", "available", "ens1f0", "/io/rdmad1/device/mlx5_5f0")]
    assert devices_json(rows) == [
        {
            "name": "mlx5_0",
            "state": "available",
            "netdev": "ens1f0",
            "path": "/io/rdmad1/device/mlx5_5f0",
        }
    ]


def test_claims_json_names_every_column() -> None:
    rows = [("c1", "mlx5_0", "net:[4026532000]", "net1", "ctr", "/io/rdmad1/claim/c1")]
    props = [{"RouteTable": 1000, "PodCdiName": "pod1"}]
    assert list(claims_json(rows, props)[0]) == [
        "id",
        "device",
        "netns",
        "interface",
        "owner",
        "path",
        "route_table",
        "pod_cdi_name",
    ]


def test_claims_json_takes_the_table_and_pod_cdi_name_from_the_claims_properties() -> None:
    rows = [("c1", "mlx5_0", "net:[4026532000]", "net1", "ctr", "/io/rdmad1/claim/c1")]
    (row,) = claims_json(rows, [{"RouteTable": 1000, "PodCdiName": "pod1"}])
    assert (row["route_table"], row["pod_cdi_name"]) == (1000, "pod1")


def test_show_json_spells_ports_out() -> None:
    out = device_json(DEVICE_PROPS, "/p")
    assert out["ports"] == [
        {"port": 1, "state": "ACTIVE", "phys_state": "LINK_UP", "netdev": "ens1f0"}
    ]
    assert out["node_guid"] == "0002:c903:0031:7a40" and out["path"] == "/p"
    json.dumps(out)


def test_claim_json_spells_char_devices_out() -> None:
    out = claim_json(
        {"Id": "c1", "CharDevices": [("/dev/infiniband/uverbs0", 231, 192)], "CreatedAt": 5}, "/c"
    )
    assert out == {
        "id": "c1",
        "char_devices": [{"path": "/dev/infiniband/uverbs0", "major": 231, "minor": 192}],
        "created_at": 5,
        "path": "/c",
    }


def test_claim_json_spells_gids_out() -> None:
    gid = "0000:0000:0000:0000:0000:ffff:c000:020a"
    out = claim_json({"Id": "c1", "Gids": [(1, 3, gid, "RoCE v2", "net1")]}, "/c")
    assert out["gids"] == [{"port": 1, "index": 3, "gid": gid, "type": "RoCE v2", "netdev": "net1"}]


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NodeGuid", "node_guid"),
        ("CdiDevice", "cdi_device"),
        ("Id", "id"),
        ("NetnsPath", "netns_path"),
    ],
)
def test_property_names_become_snake_case(name: str, key: str) -> None:
    assert snake(name) == key


def test_error_line_uses_the_short_error_name() -> None:
    assert (
        error_line("io.rdmad1.Error.NoSuchDevice", "no RDMA device 'mlx5_9'")
        == "rdmactl: NoSuchDevice: no RDMA device 'mlx5_9'"
    )


def test_monitor_json_names_signal_arguments() -> None:
    msg = Message.new_signal(
        "/io/rdmad1", "io.rdmad1.Manager", "Released", "sss", ["c1", "mlx5_0", "netns-gone"]
    )
    assert signal_json(msg) == {
        "signal": "Released",
        "path": "/io/rdmad1",
        "args": {"claim_id": "c1", "device": "mlx5_0", "reason": "netns-gone"},
    }


def test_monitor_json_flattens_properties_changed() -> None:
    msg = Message.new_signal(
        "/io/rdmad1",
        "org.freedesktop.DBus.Properties",
        "PropertiesChanged",
        "sa{sv}as",
        ["io.rdmad1.Manager", {"NetnsMode": Variant("s", "exclusive")}, []],
    )
    assert signal_json(msg)["args"] == {
        "interface": "io.rdmad1.Manager",
        "changed": {"netns_mode": "exclusive"},
        "invalidated": [],
    }


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("utc")
def test_claim_text_shows_when_it_was_made_as_a_local_time() -> None:
    # CreatedAt is microseconds since the epoch; people read a date
    text = claim_text({"id": "c1", "created_at": 1_700_000_000_250_000})
    assert "created_at: 2023-11-14 22:13:20+00:00" in text.splitlines()


def test_claim_json_keeps_created_at_in_microseconds() -> None:
    assert claim_json({"CreatedAt": 1_795_609_587_010_504}, "/c")["created_at"] == (
        1_795_609_587_010_504
    )


@pytest.mark.parametrize(
    ("json_output", "printed"),
    [(False, "released c1\n"), (True, '{"released": "c1"}\n')],
)
async def test_release_says_what_it_released(json_output: bool, printed: str) -> None:
    out = io.StringIO()
    client = FakeClient({"Release": []})
    await cmd_release(client, argparse.Namespace(claim="c1", json=json_output), out)
    assert client.calls == [("Release", ["c1"])]
    assert out.getvalue() == printed
