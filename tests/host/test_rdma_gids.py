"""Reading a netns's sysfs and addresses without entering or keeping it (rdmad.kernel.rdma_gids).

The host kernel has no RDMA: the infiniband class is read in the guest (tests/guest); here
the same netns-tagged sysfs mount is checked on the net class, which is tagged the same way.
"""

from __future__ import annotations

import ipaddress
import os

import pytest

from rdmad.core.backend import Placement
from rdmad.errors import RdmadError
from rdmad.kernel.netns import KernelNetnsResolver, run_in_netns
from rdmad.kernel.rdma_gids import addresses_of, mount_sysfs
from rdmad.kernel.rtnl import RtnlBackend
from testbed.net import ip, link


def _net_class_of_own_sysfs() -> list[str]:
    root = mount_sysfs()
    try:
        fd = os.open("class/net", os.O_RDONLY | os.O_DIRECTORY, dir_fd=root)
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)
    finally:
        os.close(root)


async def test_a_sysfs_mounted_from_inside_a_netns_shows_that_netns(
    netns: str, resolver: KernelNetnsResolver
) -> None:
    ip("link", "add", "gidt0", "type", "veth", "peer", "name", "gidt1", netns=netns)
    with resolver.open(netns) as target:
        seen = await run_in_netns(target.fd, _net_class_of_own_sysfs)
    assert seen == ["gidt0", "gidt1", "lo"]
    assert link("gidt0") is None


async def test_a_placed_netdevs_addresses_are_read_by_its_netns_id(
    netns: str, resolver: KernelNetnsResolver, rtnl: RtnlBackend
) -> None:
    ip("link", "add", "gidt0", "type", "veth", "peer", "name", "gidt1", netns=netns)
    ip("addr", "add", "192.0.2.10/24", "dev", "gidt0", netns=netns)
    ifindex = int(ip("-o", "link", "show", "gidt0", netns=netns).split(":")[0])
    with resolver.open(netns) as target:
        nsid = await rtnl.nsid(target)
    found = await addresses_of(rtnl.channel, Placement(nsid, ifindex, "gidt0"))
    assert ipaddress.ip_interface("192.0.2.10/24") in found


async def test_addresses_behind_an_unknown_netns_id_are_a_named_error(
    rtnl: RtnlBackend,
) -> None:
    with pytest.raises(RdmadError):
        await addresses_of(rtnl.channel, Placement(4_000_000, 1, "gidt0"))
