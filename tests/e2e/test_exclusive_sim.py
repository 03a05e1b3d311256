"""Exclusive mode with a hardware-like (simulated) RDMA device: the netdev and the RDMA device
move together, the path no kernel available here can show (rxe dies when its netdev moves).
The simulator follows kernel-facts.md; the guest tests check the same rules on real rxe."""

from __future__ import annotations

import signal

from dbus_fast import Variant

from tests.support.net import ip, link, netns_inode, netns_reusing_inode
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


async def test_a_netns_given_the_dead_ones_inode_does_not_keep_its_rdma_device(
    exclusive_rig: Rig, netns: str
) -> None:
    # The kernel hands a dead netns's inode to the next one made. rdmad, stopped meanwhile,
    # finds a netns of that inode when it looks again: the device is home all the same
    # (rdma_dev_exit_net) at once, as the simulator tells by the netns's cookie.
    rig = exclusive_rig
    path = await rig.client.manager(
        "Claim", "ssa{sv}", "sim1", netns, {"netdev": Variant("b", False)}
    )
    cid = await rig.client.prop(path, CLAIM, "Id")
    inode = netns_inode(netns)
    assert rig.daemon.proc is not None
    mark = rig.client.mark()
    rig.daemon.proc.send_signal(signal.SIGSTOP)
    try:
        ip("netns", "del", netns)
        with netns_reusing_inode(inode):
            rig.daemon.proc.send_signal(signal.SIGCONT)
            await rig.client.wait_signal("Released", lambda b: b[0] == cid, since=mark)
            assert await device_prop(rig, "sim1", "Netns") == "init"
            assert await device_prop(rig, "sim1", "State") == "available"
            assert "has not come back" not in rig.daemon.log()  # it waited 5 s, then gave up
    finally:
        rig.daemon.proc.send_signal(signal.SIGCONT)
