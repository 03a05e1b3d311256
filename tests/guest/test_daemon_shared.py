"""Shared claims of a real rxe device (the kernel's default, shared netns mode).

A shared claim puts a macvlan child of the device's netdev into the netns; the RDMA device
stays in init_net and, in shared mode, is visible from every netns. The kernel's view is
read with `ip`, `rdma` and sysfs from inside the netns.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
from collections.abc import AsyncIterator

import pytest
from dbus_fast import Variant

from rdmad.kernel.rdma_gids import SETTLE_S
from testbed.daemon import Client, DBusCallError, RdmadProcess
from testbed.net import (
    addresses,
    eventually,
    ip,
    ip_json,
    is_up,
    link,
    link_local_usable,
    netns_inode,
)
from tests.support.rdma import (
    CLAIM_IFACE,
    WAIT,
    Rxe,
    all_props,
    device_props,
    gid_ndevs,
    kernel,
    known_to_rdmad,
    listed,
    rdma_dev_names,
    sh,
    stat_rdev,
)
from tests.support.traffic import (
    PINGPONG_ITERS,
    RPING_COUNT,
    WRITE_BW_ITERS,
    cdi_env,
    gid_joined,
    link_local_gid_index,
    pingpong,
    pingpong_iters,
    rping,
    rping_count,
    sysfs_gid,
    write_bw,
    write_bw_iters,
)

pytestmark = [
    pytest.mark.guest,
    pytest.mark.on_61,
    pytest.mark.usefixtures("in_guest", "daemon_log_on_failure"),
]

IFNAME = "net1"
ADDRESS = "192.0.2.10/24"


# Before its netns support (in 7.3, not in 6.1), rxe looks up the route of every packet it
# sends in init_net (rxe_find_route4/6), so on 6.1 a GID whose netdev left init_net - a
# shared claim's child - carries nothing, while a process in the claim's netns still drives
# the device over the entries of netdevs in init_net (docs/kernel-notes.md).
CHILDS_GID_CARRIES = kernel() != "6.1"
over_the_claims_gid = pytest.mark.skipif(
    not CHILDS_GID_CARRIES,
    reason="6.1's rxe routes in init_net: the claim's GID carries nothing (tested below)",
)
only_61 = pytest.mark.skipif(
    CHILDS_GID_CARRIES, reason="6.1's rxe; this kernel's runs over the claim's GID (above)"
)


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
    await eventually(lambda: IFNAME in gid_ndevs(shared_rxe.name, netns), WAIT)


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


# ---------------------------------------------------------------- traffic through the claim


async def claim_env(
    client: Client, rdmad: RdmadProcess, rxe: Rxe, netns: str
) -> tuple[dict[str, object], dict[str, str]]:
    """A shared claim with an address: (its properties, the env its CDI spec gives a
    container)."""
    _, claim = await shared_claim(client, rxe, netns)
    return claim, cdi_env(rdmad.cdi_dir, str(claim["Id"]))


async def test_the_claims_gids_are_the_childs_entries_as_the_netns_reads_them(
    client: Client, rdmad: RdmadProcess, netns: str, shared_rxe: Rxe
) -> None:
    claim, env = await claim_env(client, rdmad, shared_rxe, netns)
    gids = claim["Gids"]
    assert isinstance(gids, list) and gids
    assert {g[4] for g in gids} == {IFNAME}
    for port, index, gid, _type, _netdev in gids:
        assert sysfs_gid(shared_rxe.name, index, netns, port) == gid
    mapped = "0000:0000:0000:0000:0000:ffff:c000:020a"  # ::ffff:192.0.2.10
    v2 = [g for g in gids if g[2] == mapped and g[3] == "RoCE v2"]
    assert len(v2) == 1
    assert env["NCCL_IB_GID_INDEX"] == env["RDMAD_GID_INDEX"] == str(v2[0][1])
    assert env["RDMAD_DEVICE"] == shared_rxe.name
    assert env["NCCL_IB_HCA"] == f"={shared_rxe.name}:1"


@over_the_claims_gid
async def test_ibv_rc_pingpong_runs_over_the_claims_gid_inside_the_netns(
    client: Client, rdmad: RdmadProcess, netns: str, shared_rxe: Rxe
) -> None:
    _, env = await claim_env(client, rdmad, shared_rxe, netns)
    run = await pingpong(netns, env["RDMAD_DEVICE"], int(env["RDMAD_GID_INDEX"]))
    assert run.both(pingpong_iters) == (PINGPONG_ITERS, PINGPONG_ITERS), run


@over_the_claims_gid
async def test_ib_write_bw_runs_over_the_claims_gid_inside_the_netns(
    client: Client, rdmad: RdmadProcess, netns: str, shared_rxe: Rxe
) -> None:
    _, env = await claim_env(client, rdmad, shared_rxe, netns)
    run = await write_bw(netns, env["RDMAD_DEVICE"], int(env["RDMAD_GID_INDEX"]))
    assert run.both(write_bw_iters) == (WRITE_BW_ITERS, WRITE_BW_ITERS), run


@over_the_claims_gid
async def test_rping_runs_over_the_claims_address_inside_the_netns(
    client: Client, rdmad: RdmadProcess, netns: str, shared_rxe: Rxe
) -> None:
    await claim_env(client, rdmad, shared_rxe, netns)
    run = await rping(netns, ADDRESS.split("/")[0])
    counts = (rping_count(run.server.out, server=True), rping_count(run.client.out, server=False))
    assert counts == (RPING_COUNT, RPING_COUNT), run


async def parents_gid_index(rxe: Rxe, netns: str) -> int:
    """The index of the parent netdev's link-local entry, as the claim's netns reads it,
    once the address behind it can carry traffic."""
    await eventually(lambda: link_local_usable(rxe.netdev), WAIT)
    await eventually(lambda: link_local_gid_index(rxe.name, rxe.netdev, netns) is not None, WAIT)
    index = link_local_gid_index(rxe.name, rxe.netdev, netns)
    assert index is not None
    return index


@only_61
async def test_on_61_ibv_rc_pingpong_in_the_netns_runs_over_the_parents_gid(
    client: Client, rdmad: RdmadProcess, netns: str, shared_rxe: Rxe
) -> None:
    await claim_env(client, rdmad, shared_rxe, netns)
    run = await pingpong(netns, shared_rxe.name, await parents_gid_index(shared_rxe, netns))
    assert run.both(pingpong_iters) == (PINGPONG_ITERS, PINGPONG_ITERS), run


@only_61
async def test_on_61_ib_write_bw_in_the_netns_runs_over_the_parents_gid(
    client: Client, rdmad: RdmadProcess, netns: str, shared_rxe: Rxe
) -> None:
    await claim_env(client, rdmad, shared_rxe, netns)
    run = await write_bw(netns, shared_rxe.name, await parents_gid_index(shared_rxe, netns))
    assert run.both(write_bw_iters) == (WRITE_BW_ITERS, WRITE_BW_ITERS), run


@only_61
async def test_on_61_the_claims_own_gid_carries_no_traffic(
    client: Client, rdmad: RdmadProcess, netns: str, shared_rxe: Rxe
) -> None:
    _, env = await claim_env(client, rdmad, shared_rxe, netns)
    run = await pingpong(netns, env["RDMAD_DEVICE"], int(env["RDMAD_GID_INDEX"]))
    assert run.both(pingpong_iters) == (None, None), run


async def test_after_release_the_claims_gid_is_gone_and_a_pingpong_on_it_fails(
    client: Client, rdmad: RdmadProcess, netns: str, shared_rxe: Rxe
) -> None:
    claim, env = await claim_env(client, rdmad, shared_rxe, netns)
    index = int(env["RDMAD_GID_INDEX"])
    gid = sysfs_gid(shared_rxe.name, index, netns)
    await client.manager("Release", "s", claim["Id"])
    # The kernel drops the entry from a workqueue once the child is gone; nothing announces it.
    await eventually(lambda: sysfs_gid(shared_rxe.name, index, netns) != gid, WAIT)
    run = await pingpong(netns, shared_rxe.name, index)
    assert run.both(pingpong_iters) == (None, None), run
    assert run.client.rc != 0, run


async def test_an_address_added_in_the_netns_joins_the_claims_gids(
    client: Client, netns: str, shared_rxe: Rxe
) -> None:
    path, _ = await shared_claim(client, shared_rxe, netns)
    mark = client.mark()
    ip("addr", "add", "198.51.100.5/24", "dev", IFNAME, netns=netns)
    added = "0000:0000:0000:0000:0000:ffff:c633:6405"  # ::ffff:198.51.100.5
    entries = await gid_joined(client, added, mark)
    for port, index, gid, _type, _netdev in entries:
        assert sysfs_gid(shared_rxe.name, index, netns, port) == gid
    assert added in {g[2] for g in await client.prop(path, CLAIM_IFACE, "Gids")}


def gid_of_address(address: str) -> str:
    """The GID the kernel makes for an IPv6 address: the address, spelt out in full."""
    return ipaddress.IPv6Address(address).exploded


def every_address(name: str, netns: str) -> list[str]:
    """The addresses on a link, link-local ones included, without their prefix length."""
    return [
        str(a["local"])
        for entry in ip_json("addr", "show", "dev", name, netns=netns)
        for a in entry.get("addr_info", [])
    ]


async def test_the_claims_gids_hold_its_childs_link_local_entry_from_the_reply(
    client: Client, netns: str, shared_rxe: Rxe
) -> None:
    # The kernel queues an IPv6 address's entry when the address is made, tentative or not:
    # the reply waits for it as for the IPv4 ones.
    _, props = await shared_claim(client, shared_rxe, netns)
    (link_local,) = (a for a in every_address(IFNAME, netns) if a.startswith("fe80:"))
    gid = gid_of_address(link_local)
    entries = [g for g in props["Gids"] if g[2] == gid]  # type: ignore[attr-defined]
    assert entries, props["Gids"]
    for port, index, entry_gid, _type, netdev in entries:
        assert netdev == IFNAME
        assert sysfs_gid(shared_rxe.name, index, netns, port) == entry_gid


async def test_an_ipv6_address_added_in_the_netns_joins_the_claims_gids(
    client: Client, netns: str, shared_rxe: Rxe
) -> None:
    path, _ = await shared_claim(client, shared_rxe, netns)
    mark = client.mark()
    ip("addr", "add", "2001:db8::5/64", "dev", IFNAME, "nodad", netns=netns)
    added = gid_of_address("2001:db8::5")
    entries = await gid_joined(client, added, mark)
    for port, index, gid, _type, _netdev in entries:
        assert sysfs_gid(shared_rxe.name, index, netns, port) == gid
    assert added in {g[2] for g in await client.prop(path, CLAIM_IFACE, "Gids")}


async def test_a_child_without_addresses_is_claimed_with_no_gids_and_no_wait_for_them(
    client: Client, netns: str, shared_rxe: Rxe
) -> None:
    # No IPv6 in the netns and no address asked for: the child has no address, so no entry
    # of its own can come, and the reply comes well inside the bound of the GID wait.
    sh("sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1", netns=netns)
    claim = client.manager(
        "Claim",
        "ssa{sv}",
        shared_rxe.name,
        netns,
        {"shared": Variant("b", True), "ifname": Variant("s", IFNAME)},
    )
    path = await asyncio.wait_for(claim, SETTLE_S / 2)
    assert every_address(IFNAME, netns) == []
    assert await client.prop(str(path), CLAIM_IFACE, "Gids") == []
