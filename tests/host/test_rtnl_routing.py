"""RtnlBackend's policy routing against a real netns: the rule, route and devconf messages
of rdmad/kernel/rtnl_routing.py, all or nothing, and removal by table."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator
from ipaddress import ip_interface
from pathlib import Path

import pytest

from rdmad.errors import KernelError
from rdmad.kernel.netns import KernelNetnsResolver, NetnsHandle
from rdmad.kernel.rtnl import RtnlBackend
from rdmad.options import parse_route
from testbed.net import ip, temp_netns, unique_name

pytestmark = pytest.mark.usefixtures("root")  # each test makes links or netns

ADDRS = (ip_interface("10.5.0.2/24"), ip_interface("fd05::2/64"))
KERNEL_TABLES = {253, 254, 255}
ASKED = (42, 252, 1000, 1001, 70000)  # below 256 a dump's header names the table


async def tables_in_use(rtnl: RtnlBackend, target: NetnsHandle) -> set[int]:
    """Which of the kernel's tables and ASKED hold a route or are looked up, by free_table."""
    return {t for t in (*KERNEL_TABLES, *ASKED) if not await rtnl.free_table(target, (t,))}


@pytest.fixture
def pod(resolver: KernelNetnsResolver) -> Iterator[tuple[NetnsHandle, int]]:
    """A netns with one interface up (a veth, both ends there), and its index there."""
    with temp_netns("prt") as name:
        ifname, peer = unique_name("rl"), unique_name("rl")
        ip("link", "add", ifname, "type", "veth", "peer", "name", peer, netns=name)
        for end in (ifname, peer):
            ip("link", "set", end, "up", netns=name)
        index = int(ip("-o", "link", "show", ifname, netns=name).split(":")[0])
        handle = resolver.open(name)
        try:
            yield handle, index
        finally:
            handle.close()


async def test_a_table_holds_the_connected_routes_and_the_routes_and_rules_look_it_up(
    rtnl: RtnlBackend, pod: tuple[NetnsHandle, int]
) -> None:
    target, index = pod
    assert await tables_in_use(rtnl, target) == KERNEL_TABLES
    extra = (parse_route("0.0.0.0/0,via=10.5.0.1"), parse_route("::/0,via=fd05::1"))
    await rtnl.add_policy_routing(target, index, 1000, ADDRS, extra)
    assert await tables_in_use(rtnl, target) == KERNEL_TABLES | {1000}
    await rtnl.remove_policy_routing(target, 1000)
    assert await tables_in_use(rtnl, target) == KERNEL_TABLES


@pytest.mark.parametrize("table", [42, 252, 70000])
@pytest.mark.parametrize("what", ["route", "rule"])
async def test_a_table_that_only_a_route_is_in_or_only_a_rule_looks_up_is_in_use(
    rtnl: RtnlBackend, pod: tuple[NetnsHandle, int], what: str, table: int
) -> None:
    # Below 256 a dump's header names the table; from 256 only its attribute does.
    target, _ = pod
    netns = Path(target.path).name
    if what == "route":
        ip("route", "add", "blackhole", "10.7.0.0/16", "table", str(table), netns=netns)
    else:
        ip("rule", "add", "from", "10.7.0.2", "lookup", str(table), netns=netns)
    assert await tables_in_use(rtnl, target) == KERNEL_TABLES | {table}


async def test_a_route_the_kernel_refuses_leaves_nothing_of_the_table(
    rtnl: RtnlBackend, pod: tuple[NetnsHandle, int]
) -> None:
    target, index = pod
    off_link = (parse_route("10.9.0.0/16,via=10.6.0.1"),)  # what rdmad.options would refuse
    with pytest.raises(KernelError, match="ENETUNREACH"):
        await rtnl.add_policy_routing(target, index, 1000, ADDRS, off_link)
    assert await tables_in_use(rtnl, target) == KERNEL_TABLES


async def test_the_free_table_is_the_first_candidate_in_use_by_nothing(
    rtnl: RtnlBackend, pod: tuple[NetnsHandle, int]
) -> None:
    target, index = pod
    await rtnl.add_policy_routing(target, index, 1000, ADDRS, ())
    assert await rtnl.free_table(target, (254, 1000, 1001, 1002)) == 1001
    assert await rtnl.free_table(target, (254, 1000)) == 0


async def test_removing_a_table_twice_is_no_error(
    rtnl: RtnlBackend, pod: tuple[NetnsHandle, int]
) -> None:
    target, index = pod
    await rtnl.add_policy_routing(target, index, 1000, ADDRS, ())
    await rtnl.remove_policy_routing(target, 1000)
    await rtnl.remove_policy_routing(target, 1000)
    assert await tables_in_use(rtnl, target) == KERNEL_TABLES


SIOCGSKNS = 0x894C  # linux/sockios.h: a socket's netns, as a new fd


def sockets_in(inode: int) -> int:
    """How many of this process's open sockets were made in the netns of `inode`."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        with contextlib.suppress(OSError):  # not a socket, or closed since the listing
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            ns = fcntl.ioctl(fd, SIOCGSKNS)
            try:
                count += os.fstat(ns).st_ino == inode
            finally:
                os.close(ns)
    return count


async def test_a_handles_operations_share_one_socket_in_its_netns_closed_with_it(
    rtnl: RtnlBackend, resolver: KernelNetnsResolver, pod: tuple[NetnsHandle, int]
) -> None:
    """A socket closed frees itself through RCU, which a netns move soon after waits for:
    a routed claim's reads and writes in the netns go through one, closed after its move."""
    target, index = pod
    handle = resolver.open(target.path)
    await rtnl.free_table(handle, (1000,))
    await rtnl.add_policy_routing(handle, index, 1000, ADDRS, ())
    await rtnl.remove_policy_routing(handle, 1000)
    assert sockets_in(handle.inode) == 1
    handle.close()
    assert sockets_in(target.inode) == 0
