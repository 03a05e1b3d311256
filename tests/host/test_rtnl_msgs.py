"""rtnl_msgs' decoders read what pyroute2's full decoder reads (an independent oracle), on
real kernel messages, and its requests do what they say through the NlChannel the daemon
sends them on."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pyroute2 import AsyncIPRoute

from rdmad.kernel.netlink import Message, NetlinkError
from rdmad.kernel.nlsocket import NlChannel, NlSubscription, open_socket
from rdmad.kernel.rtnl_msgs import (
    RTM_NEWLINK,
    RTNLGRP_LINK,
    Link,
    add_address,
    addr_from,
    addr_local,
    addr_request,
    addresses,
    assign_nsid,
    del_address,
    del_altname,
    dellink,
    dump_links,
    getlink,
    ifindex_of,
    link_from,
    live_nsids,
    move_link_blocking,
    netns_nsid,
    new_macvlan,
)
from testbed.net import VethPair, ip, is_up, link, netns_fd

pytestmark = pytest.mark.usefixtures("root")  # each test makes links or netns


@contextlib.asynccontextmanager
async def _opened(ipr: AsyncIPRoute) -> AsyncIterator[AsyncIPRoute]:
    try:
        await ipr.setup_endpoint()
        yield ipr
    finally:
        ipr.close()


@pytest.fixture
async def full() -> AsyncIterator[AsyncIPRoute]:
    """pyroute2 as it comes: every attribute decoded."""
    async with _opened(AsyncIPRoute()) as ipr:
        yield ipr


@pytest.fixture
def varied(veth: VethPair) -> VethPair:
    """Netdevs with every attribute the decoder reads set: a kind, an odd MTU, an altname,
    and a macvlan child."""
    ip("link", "set", veth.host, "mtu", "1234")
    ip("link", "property", "add", "dev", veth.host, "altname", veth.host + "alt")
    ip("link", "add", veth.peer + "m", "link", veth.peer, "type", "macvlan")
    return veth


def _full_view(m: Any) -> tuple[int, str, int, str, frozenset[str], int]:
    """The same fields from pyroute2's ifinfmsg, every attribute decoded."""
    info = m.get_attr("IFLA_LINKINFO")
    props = m.get_attr("IFLA_PROP_LIST")
    alts = [v for k, v in props.get("attrs", []) if k == "IFLA_ALT_IFNAME"] if props else []
    kind = (info.get_attr("IFLA_INFO_KIND") if info is not None else None) or ""
    return (
        m["index"],
        m.get_attr("IFLA_IFNAME"),
        m.get_attr("IFLA_MTU"),
        kind,
        frozenset(alts),
        m["flags"],
    )


def _lean_view(m: Link) -> tuple[int, str, int, str, frozenset[str], int]:
    return (m.index, m.ifname, m.mtu, m.kind, m.altnames, m.flags)


async def test_a_dump_decodes_as_pyroute2_decodes_it_for_every_netdev(
    channel: NlChannel, full: AsyncIPRoute, varied: VethPair
) -> None:
    # Only netdevs this test owns (and lo): other test runs share the host and change theirs.
    mine = {"lo", varied.host, varied.peer, varied.peer + "m"}
    ours = {m.ifname: _lean_view(m) for m in await dump_links(channel) if m.ifname in mine}
    theirs = {
        v[1]: v
        async for v in (_full_view(m) async for m in await full.link("dump"))
        if v[1] in mine
    }
    assert ours == theirs
    assert ours.keys() == mine
    by_name = ours
    assert by_name[varied.host][2:5] == (1234, "veth", frozenset({varied.host + "alt"}))
    assert by_name[varied.peer + "m"][3] == "macvlan"


async def test_getlink_finds_a_netdev_by_index_and_by_name(
    channel: NlChannel, varied: VethPair
) -> None:
    by_index = await getlink(channel, varied.host_ifindex())
    by_name = await getlink(channel, name=varied.host)
    assert by_index == by_name
    assert by_name.ifname == varied.host


async def test_ifindex_of_names_a_netdevs_index_or_raises_enodev(
    channel: NlChannel, veth: VethPair
) -> None:
    assert await ifindex_of(channel, veth.host) == veth.host_ifindex()
    with pytest.raises(NetlinkError) as caught:
        await ifindex_of(channel, "rdmad-nosuch")
    assert caught.value.errno == errno.ENODEV


async def test_link_events_decode_on_a_subscription(veth: VethPair) -> None:
    seen: asyncio.Queue[Message] = asyncio.Queue()
    sock = open_socket(socket.NETLINK_ROUTE, (RTNLGRP_LINK,))
    sub = NlSubscription(sock, seen.put_nowait, lambda: None)
    try:
        ip("link", "set", veth.host, "mtu", "1300")
        async with asyncio.timeout(5):
            while True:
                msg = await seen.get()
                got = link_from(msg) if msg.type == RTM_NEWLINK else None
                if got is not None and got.ifname == veth.host and got.mtu == 1300:
                    break
    finally:
        sub.close()


async def test_an_address_dump_decodes_as_pyroute2_decodes_it(
    channel: NlChannel, full: AsyncIPRoute, veth: VethPair
) -> None:
    ip("addr", "add", "192.0.2.9/24", "dev", veth.host)
    ip("addr", "add", "2001:db8::9/64", "dev", veth.host)
    ip("addr", "add", "10.9.9.1", "peer", "10.9.9.2/32", "dev", veth.host)  # IFA_ADDRESS differs
    ours = [addr_from(m) for m in await channel.request(addr_request(0))]
    theirs = [m async for m in await full.addr("dump")]
    # Compared on this test's netdev: the host's other addresses may come and go between
    # the two dumps (a netns being deleted, another process's interfaces).
    index = veth.host_ifindex()
    mine = {str(a.cidr) for a in ours if a.index == index}
    assert mine == {
        f"{m.get_attr('IFA_LOCAL') or m.get_attr('IFA_ADDRESS')}/{m['prefixlen']}"
        for m in theirs
        if m["index"] == index
    }
    assert {"192.0.2.9/24", "2001:db8::9/64", "10.9.9.1/32"} <= mine


async def test_an_address_events_index_and_address_are_the_full_decodes(
    channel: NlChannel, veth: VethPair
) -> None:
    ip("addr", "add", "192.0.2.10/24", "dev", veth.host)
    ip("addr", "add", "2001:db8::10/64", "dev", veth.host)
    dumped = await channel.request(addr_request(0))
    full = [addr_from(m) for m in dumped]
    assert [addr_local(m) for m in dumped] == [(a.index, a.cidr and a.cidr.ip) for a in full]
    ours = {address for index, address in map(addr_local, dumped) if index == veth.host_ifindex()}
    assert {ipaddress.ip_address("192.0.2.10"), ipaddress.ip_address("2001:db8::10")} <= ours


async def test_addresses_are_added_listed_and_deleted(channel: NlChannel, veth: VethPair) -> None:
    index = veth.host_ifindex()
    v4, v6 = ipaddress.ip_interface("192.0.2.7/24"), ipaddress.ip_interface("2001:db8::7/64")
    await add_address(channel, index, v4)
    await add_address(channel, index, v6)
    assert {v4, v6} <= set(await addresses(channel, index))
    await del_address(channel, index, v4)
    await del_address(channel, index, v6)
    assert not {v4, v6} & set(await addresses(channel, index))


async def test_the_kernel_filters_an_address_dump_by_the_index_in_it(
    channel: NlChannel, veth: VethPair
) -> None:
    # What keeps a claim's host-config read independent of how many netdevs the host has.
    ip("addr", "add", "192.0.2.8/24", "dev", veth.host)
    ip("addr", "add", "198.51.100.8/24", "dev", veth.peer)
    index = veth.host_ifindex()
    dumped = [addr_from(m) for m in await channel.request(addr_request(index))]
    assert {a.index for a in dumped} == {index}
    assert ipaddress.ip_interface("192.0.2.8/24") in {a.cidr for a in dumped}


def test_a_refused_move_raises_the_kernels_errno(netns: str) -> None:
    # An ifindex nothing has: the kernel answers ENODEV.
    with netns_fd(netns) as target, pytest.raises(NetlinkError) as refused:
        move_link_blocking(0x7FFFFFF0, net_ns_fd=target)
    assert refused.value.errno == errno.ENODEV


def test_a_move_lands_the_netdev_in_the_target_with_its_settings(
    veth: VethPair, netns: str
) -> None:
    with netns_fd(netns) as target:
        move_link_blocking(
            veth.host_ifindex(), net_ns_fd=target, ifname="moved0", mtu=1380, up=True
        )
    inside = link("moved0", netns)
    assert inside is not None and (inside["mtu"], is_up(inside)) == (1380, True)


async def test_dellink_deletes_a_netdev_by_index_or_by_name(
    channel: NlChannel, veth: VethPair
) -> None:
    ip("link", "add", veth.peer + "a", "link", veth.peer, "type", "macvlan")
    ip("link", "add", veth.peer + "b", "link", veth.peer, "type", "macvlan")
    await dellink(channel, (await getlink(channel, name=veth.peer + "a")).index)
    await dellink(channel, 0, name=veth.peer + "b")
    assert link(veth.peer + "a") is None and link(veth.peer + "b") is None


async def test_netns_nsid_reads_an_assigned_nsid_and_none_where_there_is_none(
    channel: NlChannel, netns: str
) -> None:
    with netns_fd(netns) as fd:
        assert await netns_nsid(channel, fd) is None
        ip("netns", "set", netns, "77")
        assert await netns_nsid(channel, fd) == 77
    assert 77 in await live_nsids(channel)


async def test_assign_nsid_has_the_kernel_pick_one(channel: NlChannel, netns: str) -> None:
    with netns_fd(netns) as fd:
        await assign_nsid(channel, fd)
        nsid = await netns_nsid(channel, fd)
    assert nsid is not None and nsid >= 0
    assert nsid in await live_nsids(channel)


async def test_new_macvlan_is_created_in_the_target_netns_in_bridge_mode(
    channel: NlChannel, veth: VethPair, netns: str
) -> None:
    with netns_fd(netns) as fd:
        await new_macvlan(channel, veth.host_ifindex(), "mv0", net_ns_fd=fd, mtu=1280)
    inside = link("mv0", netns)
    assert inside is not None and inside["mtu"] == 1280
    assert inside["linkinfo"]["info_kind"] == "macvlan"
    assert inside["linkinfo"]["info_data"]["mode"] == "bridge"
    assert link("mv0") is None


async def test_del_altname_drops_that_altname_only(channel: NlChannel, veth: VethPair) -> None:
    ip("link", "property", "add", "dev", veth.host, "altname", veth.host + "a1")
    ip("link", "property", "add", "dev", veth.host, "altname", veth.host + "a2")
    await del_altname(channel, veth.host_ifindex(), veth.host + "a1")
    assert (await getlink(channel, veth.host_ifindex())).altnames == {veth.host + "a2"}
