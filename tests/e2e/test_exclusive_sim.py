"""Exclusive mode with a hardware-like (simulated) RDMA device: the netdev and the RDMA device
move together, the path no kernel available here can show (rxe dies when its netdev moves).
The simulator follows docs/kernel-notes.md; the guest tests check the same rules on real rxe."""

from __future__ import annotations

from dbus_fast import Variant

from testbed.net import ip, link, netns_inode
from tests.support.sim_rig import Rig

DEVICE = "io.rdmad1.Device"
CLAIM = "io.rdmad1.Claim"


async def device_prop(rig: Rig, name: str, prop: str) -> object:
    path = await rig.client.manager("GetDevice", "s", name)
    return await rig.client.prop(path, DEVICE, prop)


async def test_whole_claim_moves_netdev_and_rdma_device_together(
    exclusive_rig: Rig, netns: str
) -> None:
    rig = exclusive_rig
    path = await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, {})
    assert link(rig.nic("sim0"), netns) is not None
    assert await device_prop(rig, "sim0", "Netns") == f"net:[{netns_inode(netns)}]"
    assert await device_prop(rig, "sim0", "State") == "claimed"
    assert await rig.client.prop(path, CLAIM, "Netns") == f"net:[{netns_inode(netns)}]"


async def test_char_devices_are_read_again_after_the_move(exclusive_rig: Rig, netns: str) -> None:
    rig = exclusive_rig
    other = f"{netns}m"
    ip("netns", "add", other)
    try:
        first = await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, {})
        before = await rig.client.prop(first, CLAIM, "CharDevices")
        await rig.client.manager("Release", "s", await rig.client.prop(first, CLAIM, "Id"))
        second = await rig.client.manager("Claim", "ssa{sv}", "sim0", other, {})
        after = await rig.client.prop(second, CLAIM, "CharDevices")
    finally:
        ip("netns", "del", other, check=False)
    # Every move re-creates uverbs: never hand out the minor from before a move.
    assert before[0][0] == after[0][0] == "/dev/infiniband/uverbs0"
    assert before[0][2] != after[0][2]


async def test_rdma_only_claim_leaves_the_netdev_home(exclusive_rig: Rig, netns: str) -> None:
    rig = exclusive_rig
    await rig.client.manager("Claim", "ssa{sv}", "sim1", netns, {"netdev": Variant("b", False)})
    assert link(rig.nic("sim1")) is not None, "netdev=false moves only the RDMA device"
    assert await device_prop(rig, "sim1", "Netns") == f"net:[{netns_inode(netns)}]"


async def test_release_brings_both_home(exclusive_rig: Rig, netns: str) -> None:
    rig = exclusive_rig
    path = await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, {})
    await rig.client.manager("Release", "s", await rig.client.prop(path, CLAIM, "Id"))
    assert link(rig.nic("sim0")) is not None
    assert await device_prop(rig, "sim0", "Netns") == "init"
    assert await device_prop(rig, "sim0", "State") == "available"


async def test_netns_death_returns_the_rdma_device_without_a_removed_signal(
    exclusive_rig: Rig, netns: str
) -> None:
    rig = exclusive_rig
    path = await rig.client.manager(
        "Claim", "ssa{sv}", "sim1", netns, {"netdev": Variant("b", False)}
    )
    cid = await rig.client.prop(path, CLAIM, "Id")
    mark = rig.client.mark()
    ip("netns", "del", netns)
    await rig.client.wait_signal("Released", lambda b: b == [cid, "sim1", "netns-gone"], since=mark)
    assert await device_prop(rig, "sim1", "Netns") == "init"
    assert await device_prop(rig, "sim1", "State") == "available"
    removed = [m for m in rig.client.signals[mark:] if m.member == "DeviceRemoved"]
    assert removed == [], "the device came home: it never left the inventory"
