"""The channel decoders read what pyroute2's full decoder reads, on real kernel messages, and
the raw requests do what they say through the NlSocket channel the daemon sends them on."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pyroute2 import AsyncIPRoute
from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_GETADDR

from rdmad.kernel.nlsock import NlSocket
from rdmad.kernel.rtnl_msgs import (
    AddrMsg,
    LinkMsg,
    add_address,
    addr_request,
    addresses,
    cidr_from_addr_msg,
    del_address,
    dellink,
    dump_links,
    getlink,
    lean_links,
    move_link_blocking,
    netns_nsid,
)
from tests.support.net import VethPair, ip, is_up, link


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


def _lean_view(m: LinkMsg) -> tuple[int, str, int, str, frozenset[str], int]:
    return (m["index"], m.ifname, m.mtu, m.kind, m.altnames, m["flags"])


async def test_a_dump_decodes_as_pyroute2_decodes_it_for_every_netdev(
    channel: NlSocket, full: AsyncIPRoute, varied: VethPair
) -> None:
    ours = {m["index"]: _lean_view(m) for m in await dump_links(channel)}
    theirs = {m["index"]: _full_view(m) async for m in await full.link("dump")}
    assert ours == theirs
    by_name = {v[1]: v for v in ours.values()}
    assert by_name[varied.host][2:5] == (1234, "veth", frozenset({varied.host + "alt"}))
    assert by_name[varied.peer + "m"][3] == "macvlan"


async def test_getlink_finds_a_netdev_by_index_and_by_name(
    channel: NlSocket, varied: VethPair
) -> None:
    by_index = await getlink(channel, varied.host_ifindex())
    by_name = await getlink(channel, name=varied.host)
    assert _lean_view(by_index) == _lean_view(by_name)
    assert by_name.ifname == varied.host


async def test_events_decode_lean_on_a_subscribed_socket(veth: VethPair) -> None:
    ipr = lean_links(AsyncIPRoute())
    try:
        await ipr.bind(groups=1)  # RTMGRP_LINK
        ip("link", "set", veth.host, "mtu", "1300")
        async with asyncio.timeout(5):
            async for msg in ipr.get():
                if isinstance(msg, LinkMsg) and msg.ifname == veth.host and msg.mtu == 1300:
                    break
    finally:
        ipr.close()


async def test_an_address_dump_decodes_as_pyroute2_decodes_it(
    channel: NlSocket, full: AsyncIPRoute, veth: VethPair
) -> None:
    ip("addr", "add", "192.0.2.9/24", "dev", veth.host)
    ip("addr", "add", "2001:db8::9/64", "dev", veth.host)
    ip("addr", "add", "10.9.9.1", "peer", "10.9.9.2/32", "dev", veth.host)  # IFA_ADDRESS differs
    request = await channel.nlm_request(addr_request(), RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP)
    ours = [m async for m in request]
    assert ours and all(isinstance(m, AddrMsg) for m in ours)
    theirs = [m async for m in await full.addr("dump")]
    view = {(m["index"], m["family"], m["prefixlen"], str(cidr_from_addr_msg(m))) for m in ours}
    assert view == {
        (
            m["index"],
            m["family"],
            m["prefixlen"],
            f"{m.get_attr('IFA_LOCAL') or m.get_attr('IFA_ADDRESS')}/{m['prefixlen']}",
        )
        for m in theirs
    }
    mine = {str(cidr_from_addr_msg(m)) for m in ours if m["index"] == veth.host_ifindex()}
    assert {"192.0.2.9/24", "2001:db8::9/64", "10.9.9.1/32"} <= mine


async def test_addresses_are_added_listed_and_deleted_by_raw_requests(
    channel: NlSocket, veth: VethPair
) -> None:
    index = veth.host_ifindex()
    v4, v6 = ipaddress.ip_interface("192.0.2.7/24"), ipaddress.ip_interface("2001:db8::7/64")
    await add_address(channel, index, v4)
    await add_address(channel, index, v6)
    assert {v4, v6} <= set(await addresses(channel, index))
    await del_address(channel, index, v4)
    await del_address(channel, index, v6)
    assert not {v4, v6} & set(await addresses(channel, index))


async def test_a_strict_socket_has_the_kernel_filter_an_address_dump_by_index(
    channel: NlSocket, veth: VethPair
) -> None:
    # What keeps a claim's host-config read independent of how many netdevs the host has.
    ip("addr", "add", "192.0.2.8/24", "dev", veth.host)
    ip("addr", "add", "198.51.100.8/24", "dev", veth.peer)
    index = veth.host_ifindex()
    request = await channel.nlm_request(
        addr_request(index), RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP
    )
    dumped = [m async for m in request]
    assert {m["index"] for m in dumped} == {index}
    assert ipaddress.ip_interface("192.0.2.8/24") in {cidr_from_addr_msg(m) for m in dumped}


def test_a_refused_move_raises_the_kernels_errno(netns: str) -> None:
    # An ifindex nothing has: the kernel answers ENODEV, as pyroute2 would report it.
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        with pytest.raises(NetlinkError) as refused:
            move_link_blocking(0x7FFFFFF0, ("IFLA_NET_NS_FD", target))
    finally:
        os.close(target)
    assert refused.value.code == errno.ENODEV


def test_a_move_lands_the_netdev_in_the_target_with_its_settings(
    veth: VethPair, netns: str
) -> None:
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        move_link_blocking(
            veth.host_ifindex(),
            ("IFLA_NET_NS_FD", target),
            ("IFLA_IFNAME", "moved0"),
            ("IFLA_MTU", 1380),
            up=True,
        )
    finally:
        os.close(target)
    inside = link("moved0", netns)
    assert inside is not None and (inside["mtu"], is_up(inside)) == (1380, True)


async def test_dellink_deletes_a_netdev_by_index_or_by_name(
    channel: NlSocket, veth: VethPair
) -> None:
    ip("link", "add", veth.peer + "a", "link", veth.peer, "type", "macvlan")
    ip("link", "add", veth.peer + "b", "link", veth.peer, "type", "macvlan")
    await dellink(channel, int((await getlink(channel, name=veth.peer + "a"))["index"]))
    await dellink(channel, 0, name=veth.peer + "b")
    assert link(veth.peer + "a") is None and link(veth.peer + "b") is None


async def test_netns_nsid_reads_an_assigned_nsid_and_none_where_there_is_none(
    channel: NlSocket, netns: str
) -> None:
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        assert await netns_nsid(channel, fd) is None
        ip("netns", "set", netns, "77")
        assert await netns_nsid(channel, fd) == 77
    finally:
        os.close(fd)
