"""Claim's options as they arrive on the bus: the bus edge takes the options it knows, each
in its own D-Bus type, and hands their values to rdmad.options to check."""

from __future__ import annotations

import dataclasses
import inspect
from ipaddress import ip_interface

import pytest
from dbus_fast import Variant
from dbus_fast.errors import DBusError

from rdmad.bus.objects import OPTION_SIGNATURES
from rdmad.errors import InvalidArgs
from rdmad.model import ChardevKind, ClaimOptions, RdmaLimit
from rdmad.options import parse_claim_options
from tests.bus.conftest import Live


def test_the_bus_takes_exactly_the_claim_options_rdmad_has() -> None:
    assert set(OPTION_SIGNATURES) == set(inspect.signature(parse_claim_options).parameters)
    # the claimant is the caller's uid, which the bus edge sets: never an option;
    # hca_handles and hca_objects arrive as one field: the device's line in rdma.max.
    limit = {"hca_handles", "hca_objects"}
    fields = {f.name for f in dataclasses.fields(ClaimOptions)}
    assert set(OPTION_SIGNATURES) == fields - {"claimant", "limit"} | limit


async def test_options_reach_the_core_as_claim_options(live: Live) -> None:
    options = {
        "ifname": Variant("s", "net0"),
        "mtu": Variant("u", 9000),
        "addresses": Variant("as", ["10.0.0.5/24"]),
        "chardevs": Variant("as", ["umad"]),
        "owner": Variant("s", "ctr"),
        "netdev": Variant("b", False),
        "cdi_name": Variant("s", "web.eth0"),
    }
    await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", options])
    assert live.core.last_options == ClaimOptions(
        ifname="net0",
        mtu=9000,
        addresses=(ip_interface("10.0.0.5/24"),),
        chardevs=(ChardevKind.UMAD,),
        owner="ctr",
        netdev=False,
        cdi_name="web.eth0",
    )


async def test_an_unknown_claim_option_is_invalid_args_naming_the_known_ones(live: Live) -> None:
    with pytest.raises(DBusError) as caught:
        await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {"colour": Variant("s", "red")}])
    assert caught.value.type == InvalidArgs.dbus_name
    assert caught.value.text == (
        "unknown claim option 'colour' (known: addresses, cdi_name, cgroup, chardevs, "
        "hca_handles, hca_objects, ifname, mtu, netdev, owner, pod_cdi_name, routes, shared, "
        "table)"
    )


async def test_a_claim_option_of_the_wrong_type_is_invalid_args(live: Live) -> None:
    with pytest.raises(DBusError) as caught:
        await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {"mtu": Variant("i", 1500)}])
    assert caught.value.type == InvalidArgs.dbus_name
    assert caught.value.text == "claim option 'mtu' must be of type 'u', not 'i'"


async def test_a_bad_option_value_is_invalid_args_from_the_one_check(live: Live) -> None:
    with pytest.raises(DBusError) as caught:
        await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {"mtu": Variant("u", 67)}])
    assert caught.value.type == InvalidArgs.dbus_name
    assert caught.value.text == "mtu 67 is out of range 68-65535"
    assert live.core.claims() == []


async def test_a_limit_reaches_the_core_and_shows_on_the_claim(live: Live) -> None:
    options = {
        "cgroup": Variant("s", "kubepods/pod1"),
        "hca_handles": Variant("u", 1),
        "hca_objects": Variant("u", 3),
    }
    (path,) = await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", options])
    assert live.core.last_options == ClaimOptions(
        cgroup="kubepods/pod1", limit=RdmaLimit(hca_handle=1, hca_object=3)
    )
    props = await live.get_all(path, "io.rdmad1.Claim")
    assert props["Cgroup"] == "kubepods/pod1"
    assert props["RdmaLimit"] == {"hca_handle": 1, "hca_object": 3}


async def test_a_limit_without_a_cgroup_is_invalid_args(live: Live) -> None:
    with pytest.raises(DBusError) as caught:
        await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {"hca_handles": Variant("u", 1)}])
    assert caught.value.type == InvalidArgs.dbus_name
    assert "need option 'cgroup'" in caught.value.text
    assert live.core.claims() == []
