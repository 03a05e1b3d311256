"""Shared claims of a real rxe device (the kernel's default, shared netns mode).

A shared claim puts a macvlan child of the device's netdev into the netns; the RDMA device
stays in init_net and, in shared mode, is visible from every netns. The kernel's view is
read with `ip`, `rdma` and sysfs from inside the netns.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import pytest
from dbus_fast import Variant

from tests.support.daemon import Client, DBusCallError
from tests.support.net import addresses, ip, is_up, link, netns_inode
from tests.support.rdma import (
    CLAIM_IFACE,
    Rxe,
    all_props,
    device_props,
    eventually,
    gid_ndevs,
    known_to_rdmad,
    listed,
    rdma_dev_names,
    stat_rdev,
)

pytestmark = [pytest.mark.guest, pytest.mark.usefixtures("in_guest", "daemon_log_on_failure")]

IFNAME = "net1"
ADDRESS = "192.0.2.10/24"


@pytest.fixture
async def shared_rxe(client: Client, rxe: Rxe) -> AsyncIterator[Rxe]:
    """An rxe device rdmad lists, in shared mode; no claim on it is left afterwards.
    Tests request `netns` first, so that claims are released before their netns goes."""
    assert await client.prop("/io/rdmad1", "io.rdmad1.Manager", "NetnsMode") == "shared"
    await known_to_rdmad(client, rxe.name)
    yield rxe
    for cid, dev, *_ in await client.manager("ListClaims"):
        if dev == rxe.name:
            with contextlib.suppress(DBusCallError):  # ended meanwhile
                await client.manager("Release", "s", cid)


async def shared_claim(client: Client, rxe: Rxe, netns: str) -> tuple[str, dict[str, object]]:
    """Claim `rxe` shared into `netns` as net1 with an address; (object path, properties)."""
    path = await client.manager(
        "Claim",
        "ssa{sv}",
        rxe.name,
        netns,
        {
            "shared": Variant("b", True),
            "ifname": Variant("s", IFNAME),
            "addresses": Variant("as", [ADDRESS]),
        },
    )
    return str(path), await all_props(client, str(path), CLAIM_IFACE)


async def test_shared_claim_puts_a_macvlan_child_into_the_netns(
    client: Client, netns: str, shared_rxe: Rxe
) -> None:
    _, claim = await shared_claim(client, shared_rxe, netns)
    child = link(IFNAME, netns)
    assert child is not None and is_up(child)
    assert child["linkinfo"]["info_kind"] == "macvlan"
    assert ADDRESS in addresses(IFNAME, netns)
    assert link(shared_rxe.netdev) is not None, "the parent netdev stays in init_net"
    assert (claim["Shared"], claim["InterfaceName"]) == (True, IFNAME)
    assert claim["Netns"] == f"net:[{netns_inode(netns)}]"
    props = await device_props(client, shared_rxe.name)
    assert (props["State"], props["Netns"]) == ("shared", "init")


async def test_inside_the_netns_the_device_is_listed_and_its_gids_name_the_child(
    client: Client, netns: str, shared_rxe: Rxe
) -> None:
    await shared_claim(client, shared_rxe, netns)
    assert shared_rxe.name in rdma_dev_names(netns)
    assert shared_rxe.name in rdma_dev_names(), "the device stays in init_net"
    # The kernel fills the GID table from a workqueue after the address appears.
    await eventually(lambda: IFNAME in gid_ndevs(shared_rxe.name, netns))


async def test_claims_char_devices_are_the_dev_nodes(
    client: Client, netns: str, shared_rxe: Rxe
) -> None:
    _, claim = await shared_claim(client, shared_rxe, netns)
    nodes = claim["CharDevices"]
    assert isinstance(nodes, list)
    assert sorted(os.path.basename(p).rstrip("0123456789") for p, _, _ in nodes) == [
        "rdma_cm",
        "uverbs",
    ]
    seen = stat_rdev([p for p, _, _ in nodes], netns)
    assert seen == {p: (major, minor) for p, major, minor in nodes}


async def test_release_deletes_the_macvlan_and_ends_the_claim(
    client: Client, netns: str, shared_rxe: Rxe
) -> None:
    _, claim = await shared_claim(client, shared_rxe, netns)
    mark = client.mark()
    await client.manager("Release", "s", claim["Id"])
    released = await client.wait_signal("Released", lambda b: b[0] == claim["Id"], since=mark)
    assert released == [claim["Id"], shared_rxe.name, "requested"]
    assert link(IFNAME, netns) is None
    assert await client.manager("ListClaims") == []
    assert (await listed(client))[shared_rxe.name][0] == "available"


async def test_netns_deletion_ends_the_claim_and_the_device_stays_available(
    client: Client, netns: str, shared_rxe: Rxe
) -> None:
    _, claim = await shared_claim(client, shared_rxe, netns)
    mark = client.mark()
    ip("netns", "del", netns)
    released = await client.wait_signal("Released", lambda b: b[0] == claim["Id"], since=mark)
    assert released == [claim["Id"], shared_rxe.name, "netns-gone"]
    assert await client.manager("ListClaims") == []
    assert (await listed(client))[shared_rxe.name][0] == "available"
    assert shared_rxe.name in rdma_dev_names()
    assert link(shared_rxe.netdev) is not None
