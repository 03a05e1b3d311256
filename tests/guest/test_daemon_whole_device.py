"""Whole-device claims of a physical NIC: the netdev moves into the netns and comes home.

The guest's isolated virtio NIC ($RDMA_VM_NIC) is a real physical netdev: when its netns
dies the kernel moves it back to init_net (under its in-netns name, or devN), down and
without addresses, and rdmad puts back its name, MTU, admin state and addresses. No kernel
here has hardware whose RDMA device moves together with its netdev (mlx5), so this module
binds the SIMULATED RDMA half to the NIC (--sim-devices hw0=NIC); every netdev step is real.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from dbus_fast import Variant

from testbed.daemon import Client
from testbed.net import addresses, ip, is_up, link, netns_inode
from tests.support.rdma import (
    CLAIM_IFACE,
    WAIT,
    all_props,
    device_props,
    known_to_rdmad,
)

pytestmark = [
    pytest.mark.guest,
    pytest.mark.usefixtures("in_guest", "daemon_log_on_failure"),
]

DEVICE = "hw0"
HOST_MTU = 1400
HOST_ADDRESS = "203.0.113.7/24"
IN_NETNS = "rdma0"
NETNS_MTU = 1300
NETNS_ADDRESS = "198.51.100.5/24"


@pytest.fixture(scope="module")
def nic() -> str:
    name = os.environ.get("RDMA_VM_NIC", "")
    assert name, "the harness exports RDMA_VM_NIC"
    return name


@pytest.fixture(scope="module")
def sim_devices(nic: str) -> str:
    return f"{DEVICE}={nic}"


@dataclass(frozen=True)
class HostSide:
    name: str
    ifindex: int
    mtu: int
    up: bool
    addresses: frozenset[str]


def host_side(name: str) -> HostSide:
    info = link(name)
    assert info is not None, f"{name} is not in init_net"
    return HostSide(name, info["ifindex"], info["mtu"], is_up(info), frozenset(addresses(name)))


@pytest.fixture
def configured_nic(nic: str) -> Iterator[HostSide]:
    """The NIC in init_net with a host MTU, an address, and up; put back as found after."""
    before = link(nic)
    assert before is not None, f"{nic} is not in init_net"
    ip("link", "set", nic, "mtu", str(HOST_MTU), "up")
    ip("addr", "add", HOST_ADDRESS, "dev", nic)
    yield host_side(nic)
    if link(nic) is not None:
        ip("addr", "del", HOST_ADDRESS, "dev", nic, check=False)
        ip("link", "set", nic, "mtu", str(before["mtu"]), "up" if is_up(before) else "down")


async def claim_whole(client: Client, netns: str) -> dict[str, object]:
    await known_to_rdmad(client, DEVICE)
    path = await client.manager(
        "Claim",
        "ssa{sv}",
        DEVICE,
        netns,
        {
            "ifname": Variant("s", IN_NETNS),
            "mtu": Variant("u", NETNS_MTU),
            "addresses": Variant("as", [NETNS_ADDRESS]),
        },
    )
    return await all_props(client, str(path), CLAIM_IFACE)


async def test_claim_moves_the_nic_into_the_netns_configured(
    client: Client, netns: str, configured_nic: HostSide
) -> None:
    claim = await claim_whole(client, netns)
    try:
        inside = link(IN_NETNS, netns)
        assert inside is not None, "renamed to ifname inside the netns"
        assert (inside["mtu"], is_up(inside)) == (NETNS_MTU, True)
        assert NETNS_ADDRESS in addresses(IN_NETNS, netns)
        assert link(configured_nic.name) is None, "the NIC has left init_net"
        assert claim["Netns"] == f"net:[{netns_inode(netns)}]"
        props = await device_props(client, DEVICE)
        assert (props["State"], props["NetDevice"]) == ("claimed", configured_nic.name)
    finally:
        await client.manager("Release", "s", claim["Id"])


async def test_release_restores_name_mtu_admin_state_and_addresses(
    client: Client, netns: str, configured_nic: HostSide
) -> None:
    claim = await claim_whole(client, netns)
    mark = client.mark()
    await client.manager("Release", "s", claim["Id"])
    released = await client.wait_signal("Released", lambda b: b[0] == claim["Id"], since=mark)
    assert released == [claim["Id"], DEVICE, "requested"]
    assert link(IN_NETNS, netns) is None
    assert host_side(configured_nic.name) == configured_nic
    assert (await device_props(client, DEVICE))["State"] == "available"


async def test_netns_deletion_returns_the_nic_under_its_original_name_restored(
    client: Client, netns: str, configured_nic: HostSide
) -> None:
    claim = await claim_whole(client, netns)
    mark = client.mark()
    ip("netns", "del", netns)
    released = await client.wait_signal("Released", lambda b: b[0] == claim["Id"], since=mark)
    assert released == [claim["Id"], DEVICE, "netns-gone"]
    # The kernel brought it back as "rdma0" (its in-netns name): rdmad renamed it back.
    assert link(IN_NETNS) is None
    assert host_side(configured_nic.name) == configured_nic
    assert await client.manager("ListClaims") == []
    assert (await device_props(client, DEVICE))["State"] == "available"


async def test_observers_see_claimed_then_available_around_a_release(
    client: Client, netns: str, configured_nic: HostSide
) -> None:
    device = await client.manager("GetDevice", "s", DEVICE)
    mark = client.mark()
    claim = await claim_whole(client, netns)
    await client.manager("Release", "s", claim["Id"])
    await client.wait_property(device, "State", "available", since=mark, timeout=WAIT)
    assert client.property_changes(device, "State", since=mark) == ["claimed", "available"]


async def test_observers_see_claimed_then_available_around_a_netns_death(
    client: Client, netns: str, configured_nic: HostSide
) -> None:
    # The NIC comes back by itself, down and misnamed: no "unavailable" while rdmad fixes it.
    device = await client.manager("GetDevice", "s", DEVICE)
    mark = client.mark()
    await claim_whole(client, netns)
    ip("netns", "del", netns)
    await client.wait_property(device, "State", "available", since=mark, timeout=WAIT)
    assert client.property_changes(device, "State", since=mark) == ["claimed", "available"]
