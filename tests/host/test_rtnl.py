"""RtnlBackend against real netns, veth and macvlan."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import replace
from ipaddress import ip_interface

import pytest

from rdmad.core.backend import Placement
from rdmad.errors import InvalidArgs, InvalidNetns, KernelError
from rdmad.kernel.addr_events import RTNLGRP_IPV4_IFADDR
from rdmad.kernel.netlink import Build, Message, split
from rdmad.kernel.netns import KernelNetnsResolver, NetnsHandle
from rdmad.kernel.nlsocket import RECV_SIZE, NlChannel, open_socket
from rdmad.kernel.rtnl import RtnlBackend
from rdmad.kernel.rtnl_msgs import RTM_NEWADDR, RTM_NEWLINK, RTNLGRP_LINK, addr_from, link_from
from rdmad.model import HostConfig
from testbed.net import VethPair, addresses, ip, is_up, link, temp_netns, unique_name
from testbed.steps import on_steps
from tests.support.sending_threads import watched_channel

pytestmark = pytest.mark.usefixtures("root")  # each test makes links or netns


def _host(veth: VethPair, mtu: int = 1500, addrs: tuple[str, ...] = ()) -> HostConfig:
    return HostConfig(veth.host_ifindex(), veth.host, mtu, True, addrs)


@pytest.fixture
def configured(veth: VethPair) -> HostConfig:
    """The host end of `veth` up, MTU 1450, with one address: what a claim must restore."""
    ip("link", "set", veth.host, "mtu", "1450", "up")
    ip("addr", "add", "192.0.2.1/24", "dev", veth.host)
    return _host(veth, 1450, ("192.0.2.1/24",))


async def test_list_netdevs_includes_veth_with_kind(rtnl: RtnlBackend, veth: VethPair) -> None:
    by_name = {d.name: d for d in await rtnl.list_netdevs()}
    assert by_name[veth.host].kind == "veth"
    assert by_name[veth.host].ifindex == veth.host_ifindex()


async def test_host_config_reads_name_mtu_state_and_addresses(
    rtnl: RtnlBackend, configured: HostConfig
) -> None:
    assert await rtnl.host_config(configured.ifindex) == configured


class _Recording(NlChannel):
    """A channel that keeps every message the kernel answered with."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self.received: list[Message] = []

    async def request(self, build: Build) -> list[Message]:
        replies = await super().request(build)
        self.received += replies
        return replies


@contextlib.contextmanager
def _addressed_netdevs(n: int) -> Iterator[list[str]]:
    """`n` other veth pairs, up, one end with an IPv4 address, both with the IPv6
    link-local an up netdev gets: what a node with pods, VFs and VLANs has around a claimed
    netdev."""
    prefix = unique_name("ad", room=len(f"d{n - 1}p"))
    names = [f"{prefix}d{i}" for i in range(n)]
    batch = "".join(
        f"link add {name} type veth peer name {name}p\n"
        f"link set {name} up\nlink set {name}p up\n"
        f"addr add 10.{200 + i // 65536}.{i // 256 % 256}.{i % 256 + 1}/32 dev {name}\n"
        for i, name in enumerate(names)
    )
    try:
        subprocess.run(["ip", "-batch", "-"], input=batch, text=True, check=True)
        yield names
    finally:
        subprocess.run(
            ["ip", "-force", "-batch", "-"],
            input="".join(f"link del {name}\n" for name in names),
            text=True,
            capture_output=True,
        )


async def test_host_config_reads_only_its_own_netdevs_messages(
    resolver: KernelNetnsResolver, configured: HostConfig
) -> None:
    # A claim reads its netdev's host config: on a node with many addressed netdevs, the
    # kernel must filter the address dump (strict checking, the ifindex in the request),
    # so the claim's cost does not grow with the node.
    with _addressed_netdevs(64):
        channel = _Recording(open_socket(socket.NETLINK_ROUTE))
        backend = RtnlBackend(channel, resolver)
        try:
            assert await backend.host_config(configured.ifindex) == configured
        finally:
            await backend.close()
    links = [link_from(m) for m in channel.received if m.type == RTM_NEWLINK]
    addrs = [addr_from(m) for m in channel.received if m.type == RTM_NEWADDR]
    assert [x.index for x in links] == [configured.ifindex]
    assert addrs and {a.index for a in addrs} == {configured.ifindex}
    assert len(channel.received) == len(links) + len(addrs)


async def test_has_netdev_says_whether_init_net_has_the_ifindex(
    rtnl: RtnlBackend, veth: VethPair
) -> None:
    assert await rtnl.has_netdev(veth.host_ifindex())
    assert not await rtnl.has_netdev(2_000_000_000)


async def test_place_moves_renames_and_configures_inside_netns(
    rtnl: RtnlBackend, resolver: KernelNetnsResolver, veth: VethPair, netns: str
) -> None:
    with resolver.open(netns) as target:
        p = await rtnl.place(
            veth.host_ifindex(), target, "net1", 1400, (ip_interface("198.51.100.2/24"),)
        )
    inside = link("net1", netns)
    assert inside is not None and link(veth.host) is None
    assert (p.ifname, p.ifindex, inside["mtu"], is_up(inside)) == (
        "net1",
        inside["ifindex"],
        1400,
        True,
    )
    assert addresses("net1", netns) == {"198.51.100.2/24"}
    assert p.nsid in await rtnl.live_nsids()


async def test_place_rolls_back_when_address_is_invalid(
    rtnl: RtnlBackend,
    resolver: KernelNetnsResolver,
    veth: VethPair,
    netns: str,
    configured: HostConfig,
) -> None:
    # a well-formed CIDR the kernel refuses (IPv6 multicast): fails after the move
    with resolver.open(netns) as target, pytest.raises(KernelError, match="ff02::5/64"):
        await rtnl.place(configured.ifindex, target, "net1", None, (ip_interface("ff02::5/64"),))
    assert link("net1", netns) is None
    assert await rtnl.host_config(veth.host_ifindex()) == configured


async def test_place_rolls_back_when_mtu_is_refused(
    rtnl: RtnlBackend,
    resolver: KernelNetnsResolver,
    veth: VethPair,
    netns: str,
    configured: HostConfig,
) -> None:
    with resolver.open(netns) as target, pytest.raises(KernelError, match="MTU"):
        await rtnl.place(configured.ifindex, target, "net1", 1_000_000, ())
    assert await rtnl.host_config(veth.host_ifindex()) == configured


async def test_place_reports_a_name_taken_in_the_netns(
    rtnl: RtnlBackend, resolver: KernelNetnsResolver, veth: VethPair, netns: str
) -> None:
    ip("link", "set", veth.peer, "netns", netns)
    with resolver.open(netns) as target, pytest.raises(InvalidArgs, match="already taken"):
        await rtnl.place(veth.host_ifindex(), target, veth.peer, None, ())
    assert link(veth.host) is not None


async def test_bring_home_restores_name_mtu_addresses_and_state(
    rtnl: RtnlBackend,
    resolver: KernelNetnsResolver,
    veth: VethPair,
    netns: str,
    configured: HostConfig,
) -> None:
    with resolver.open(netns) as target:
        p = await rtnl.place(
            configured.ifindex, target, "net1", 1400, (ip_interface("198.51.100.2/24"),)
        )
    # no netns fd is passed: the backend finds the netns by its nsid
    home = await rtnl.bring_home(p, configured)
    assert link("net1", netns) is None
    assert await rtnl.host_config(home.ifindex) == replace(configured, ifindex=home.ifindex)
    assert (home.name, home.mtu, home.up) == (configured.name, configured.mtu, configured.up)


async def test_bring_home_gives_the_netdev_its_addresses_before_it_comes_up(
    rtnl: RtnlBackend,
    resolver: KernelNetnsResolver,
    veth: VethPair,
    netns: str,
    configured: HostConfig,
) -> None:
    # As ifupdown does; and coming up starts the kernel's own work under the RTNL lock
    # (linkwatch, IPv6 routes), which the address request would otherwise wait behind.
    seen = await _brought_home_seen_from_init_net(rtnl, resolver, netns, configured)
    added = next(i for i, m in enumerate(seen) if m.type == RTM_NEWADDR)
    up = next(i for i, m in enumerate(seen) if m.type == RTM_NEWLINK and link_from(m).up)
    assert added < up


async def test_bring_home_sets_the_host_mtu_before_the_netdev_leaves_the_claims_netns(
    rtnl: RtnlBackend,
    resolver: KernelNetnsResolver,
    veth: VethPair,
    netns: str,
    configured: HostConfig,
) -> None:
    # An MTU change walks every IPv6 route of the netdev's netns: few in the claim's,
    # thousands in init_net on a large node. So init_net sees it arrive with the host MTU.
    seen = await _brought_home_seen_from_init_net(rtnl, resolver, netns, configured)
    links = [link_from(m) for m in seen if m.type == RTM_NEWLINK]
    assert links and {lk.mtu for lk in links} == {configured.mtu}


async def _brought_home_seen_from_init_net(
    rtnl: RtnlBackend, resolver: KernelNetnsResolver, netns: str, configured: HostConfig
) -> list[Message]:
    """Place the `configured` netdev with MTU 1400, bring it home, and return the link and
    IPv4 address events init_net saw about it meanwhile, in order."""
    with resolver.open(netns) as target:
        p = await rtnl.place(configured.ifindex, target, "net1", 1400, ())
    events = open_socket(socket.NETLINK_ROUTE, (RTNLGRP_LINK, RTNLGRP_IPV4_IFADDR))
    with events:
        home = await rtnl.bring_home(p, configured)
        seen = _drained(events)
    return [
        m
        for m in seen
        if (m.type == RTM_NEWLINK and link_from(m).index == home.ifindex)
        or (m.type == RTM_NEWADDR and addr_from(m).index == home.ifindex)
    ]


def _drained(sock: socket.socket) -> list[Message]:
    """Every message queued on a non-blocking subscription socket."""
    out: list[Message] = []
    while True:
        try:
            out += split(sock.recv(RECV_SIZE))
        except BlockingIOError:
            return out


async def test_bring_home_fails_clearly_when_the_netns_is_gone(
    rtnl: RtnlBackend, configured: HostConfig
) -> None:
    with pytest.raises(InvalidNetns, match="nsid 4242"):
        await rtnl.bring_home(Placement(4242, 7, "net1"), configured)


async def test_bring_home_from_a_file_that_is_not_a_netns_is_a_kernel_error(
    rtnl: RtnlBackend, configured: HostConfig
) -> None:
    # The mover thread's setns() into it fails (EINVAL) before any request is sent.
    source = NetnsHandle(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC), 0, "/dev/null")
    with source, pytest.raises(KernelError, match="EINVAL"):
        await rtnl.bring_home(Placement(4242, 7, "net1"), configured, source)


@pytest.fixture
def returned(veth: VethPair, configured: HostConfig) -> str:
    """The configured host end, renamed devN as the kernel returns a NIC from a dead netns."""
    name = "dev" + veth.host[-8:]
    ip("link", "set", veth.host, "name", name)
    return name


async def test_restore_renames_and_reconfigures_a_returned_netdev(
    rtnl: RtnlBackend, returned: str, configured: HostConfig
) -> None:
    # what the kernel leaves after netns death: renamed, down, no addresses
    ip("link", "set", returned, "down", "mtu", "1500")
    ip("addr", "flush", "dev", returned)
    ip("addr", "add", "203.0.113.9/24", "dev", returned)
    await rtnl.restore(configured.ifindex, configured)
    assert await rtnl.host_config(configured.ifindex) == configured


async def test_restore_takes_back_a_host_name_that_udev_made_an_altname(
    rtnl: RtnlBackend, veth: VethPair, returned: str, configured: HostConfig
) -> None:
    # udev gives a NIC that came back as devN its predictable name as an altname; the
    # kernel then refuses a rename to that name (EEXIST) until the altname is dropped.
    ip("link", "property", "add", "dev", returned, "altname", veth.host)
    await rtnl.restore(configured.ifindex, configured)
    assert await rtnl.host_config(configured.ifindex) == configured


async def test_restore_takes_back_a_host_name_that_udev_makes_an_altname_mid_restore(
    rtnl: RtnlBackend, veth: VethPair, returned: str, configured: HostConfig
) -> None:
    # udev works asynchronously: the altname can appear after restore has read the link.
    added: list[str] = []

    def udev_adds_the_altname(step: str) -> None:
        if step == "host-renaming" and not added:
            ip("link", "property", "add", "dev", returned, "altname", veth.host)
            added.append(step)

    with on_steps(udev_adds_the_altname):
        await rtnl.restore(configured.ifindex, configured)
    assert added and await rtnl.host_config(configured.ifindex) == configured


async def test_restore_does_not_steal_another_netdevs_name(
    rtnl: RtnlBackend, veth: VethPair, returned: str, configured: HostConfig
) -> None:
    ip("link", "property", "add", "dev", veth.peer, "altname", veth.host)
    with pytest.raises(InvalidArgs, match="already taken"):
        await rtnl.restore(configured.ifindex, configured)
    assert link(returned) is not None and link(veth.peer) is not None


async def test_add_macvlan_creates_configured_child_inside_netns(
    rtnl: RtnlBackend, resolver: KernelNetnsResolver, veth: VethPair, netns: str
) -> None:
    with resolver.open(netns) as target:
        p = await rtnl.add_macvlan(
            veth.host_ifindex(), target, "net1", 1400, (ip_interface("198.51.100.3/24"),)
        )
    inside = link("net1", netns)
    assert inside is not None
    assert inside["linkinfo"]["info_kind"] == "macvlan"
    assert inside["linkinfo"]["info_data"]["mode"] == "bridge"
    assert (inside["ifindex"], inside["mtu"], is_up(inside)) == (p.ifindex, 1400, True)
    assert addresses("net1", netns) == {"198.51.100.3/24"}


@pytest.mark.parametrize("how", ["place", "add_macvlan"])
async def test_placing_reports_the_netdev_as_a_read_in_its_netns_shows_it(
    rtnl: RtnlBackend,
    resolver: KernelNetnsResolver,
    configured: HostConfig,
    netns: str,
    how: str,
) -> None:
    """A claim takes its MAC and addresses from what placing it reported, reading nothing
    back (rdmad.core.take): the host's address stays behind, link-local is left out."""
    cidrs = (ip_interface("2001:db8::7/64"), ip_interface("198.51.100.7/24"))
    with resolver.open(netns) as target:
        placing = rtnl.place if how == "place" else rtnl.add_macvlan
        p = await placing(configured.ifindex, target, "net1", None, cidrs)
    assert p.netdev is not None
    assert p.netdev == await rtnl.read_placed(p)
    assert p.netdev.addresses == ("198.51.100.7/24", "2001:db8::7/64")
    inside = link("net1", netns)
    assert inside is not None and p.netdev.mac == inside["address"]


async def test_add_macvlan_leaves_nothing_behind_on_failure(
    rtnl: RtnlBackend, resolver: KernelNetnsResolver, veth: VethPair, netns: str
) -> None:
    with resolver.open(netns) as target, pytest.raises(KernelError):
        await rtnl.add_macvlan(
            veth.host_ifindex(), target, "net1", None, (ip_interface("ff02::5/64"),)
        )
    assert link("net1", netns) is None


async def test_delete_removes_the_child_by_nsid(
    rtnl: RtnlBackend, resolver: KernelNetnsResolver, veth: VethPair, netns: str
) -> None:
    with resolver.open(netns) as target:
        p = await rtnl.add_macvlan(veth.host_ifindex(), target, "net1", None, ())
    await rtnl.delete(p)
    assert link("net1", netns) is None


async def test_delete_of_an_already_gone_child_is_a_no_op(
    rtnl: RtnlBackend, resolver: KernelNetnsResolver, veth: VethPair, netns: str
) -> None:
    with resolver.open(netns) as target:
        p = await rtnl.add_macvlan(veth.host_ifindex(), target, "net1", None, ())
    ip("link", "del", "net1", netns=netns)
    await rtnl.delete(p)


async def test_nsid_assigns_one_when_the_netns_has_none(
    rtnl: RtnlBackend, resolver: KernelNetnsResolver
) -> None:
    with temp_netns() as name, resolver.open(name) as target:
        nsid = await rtnl.nsid(target)
        assert nsid >= 0
        assert await rtnl.nsid(target) == nsid
        assert nsid in await rtnl.live_nsids()


async def test_nsid_is_not_answered_from_memory_for_a_closed_handle(
    rtnl: RtnlBackend, resolver: KernelNetnsResolver
) -> None:
    # nsids are reused once a netns dies; only an open handle keeps its netns (and nsid).
    with temp_netns() as name:
        target = resolver.open(name)
        await rtnl.nsid(target)
        target.close()
        with pytest.raises(ValueError, match="closed"):
            await rtnl.nsid(target)


async def test_deleting_a_macvlan_is_sent_off_the_event_loop(
    resolver: KernelNetnsResolver, veth: VethPair, netns: str
) -> None:
    # Unregistering a netdev waits for RCU inside send(): the loop must keep serving.
    channel, sock = watched_channel()
    backend = RtnlBackend(channel, resolver)
    try:
        with resolver.open(netns) as target:
            placed = await backend.add_macvlan(veth.host_ifindex(), target, "net1", None, ())
        sock.senders.clear()
        await backend.delete(placed)
    finally:
        await backend.close()
    assert link("net1", netns) is None
    assert sock.senders and threading.get_ident() not in sock.senders
