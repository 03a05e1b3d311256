"""A device's view follows what others do to its netdev: rdmad is not the only actor on a node
(sim RDMA over real veths, real netns, the real daemon and bus)."""

from __future__ import annotations

import os

from testbed.net import ip
from tests.support.sim_rig import Rig


async def test_a_netdev_moved_away_by_someone_else_makes_its_device_unavailable(
    rig: Rig, netns: str
) -> None:
    device = await rig.client.manager("GetDevice", "s", "sim0")
    nic = rig.nic("sim0")
    mark = rig.client.mark()
    ip("link", "set", "dev", nic, "netns", netns)
    try:
        await rig.client.wait_property(device, "State", "unavailable", since=mark)
    finally:
        ip("link", "set", "dev", nic, "netns", str(os.getpid()), netns=netns)
    await rig.client.wait_property(device, "State", "available", since=mark)
    assert rig.client.property_changes(device, "State", since=mark) == [
        "unavailable",
        "available",
    ]


async def test_a_netdev_renamed_by_someone_else_is_shown_under_its_new_name(rig: Rig) -> None:
    device = await rig.client.manager("GetDevice", "s", "sim1")
    nic = rig.nic("sim1")
    mark = rig.client.mark()
    ip("link", "set", "dev", nic, "down")
    ip("link", "set", "dev", nic, "name", "renamed0")
    try:
        await rig.client.wait_property(device, "NetDevice", "renamed0", since=mark)
        listed = {n: nd for n, _s, nd, _ in await rig.client.manager("ListDevices")}
        assert listed["sim1"] == "renamed0"
    finally:
        ip("link", "set", "dev", "renamed0", "name", nic)
    await rig.client.wait_property(device, "NetDevice", nic, since=mark)
