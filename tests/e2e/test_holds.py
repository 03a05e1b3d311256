"""Hold and Attach through the real bus and the real daemon, on real netns and veths (sim
RDMA): a device kept for a pod before its netns exists, attached when it does."""

from __future__ import annotations

import json

from dbus_fast import Variant

from testbed.net import addresses, ip, link, netns_inode
from tests.support.sim_rig import Rig

CLAIM_IFACE = "io.rdmad1.Claim"
POD = "0f6a2c44-7d1e-4c8e-9a55-3b7e1c2d9f10"


async def hold(rig: Rig, device: str, **options: Variant) -> str:
    path: str = await rig.client.manager("Hold", "ssa{sv}", device, POD, options)
    return path


async def attach(rig: Rig, netns: str, **options: Variant) -> list[str]:
    paths: list[str] = await rig.client.manager("Attach", "ssa{sv}", POD, netns, options)
    return paths


async def prop(rig: Rig, path: str, name: str) -> object:
    return await rig.client.prop(path, CLAIM_IFACE, name)


async def device_state(rig: Rig, device: str) -> str:
    path = await rig.client.manager("GetDevice", "s", device)
    state: str = await rig.client.prop(path, "io.rdmad1.Device", "State")
    return state


async def test_a_hold_leaves_the_netdev_home_and_writes_the_cdi_spec(rig: Rig) -> None:
    path = await hold(rig, "sim0", ifname=Variant("s", "rdma0"))
    assert link(rig.nic("sim0")) is not None
    assert await prop(rig, path, "State") == "held"
    assert await device_state(rig, "sim0") == "claimed"
    cid = await prop(rig, path, "Id")
    spec = json.loads((rig.daemon.cdi_dir / f"rdmad.io-rdma-{cid}.json").read_text())
    assert [d["name"] for d in spec["devices"]] == [cid]


async def test_attach_moves_the_held_netdev_into_the_pods_netns(rig: Rig, netns: str) -> None:
    path = await hold(rig, "sim0", ifname=Variant("s", "rdma0"), mtu=Variant("u", 1400))
    paths = await attach(rig, netns, addresses=Variant("as", ["192.0.2.5/24"]))
    assert paths == [path]
    inside = link("rdma0", netns)
    assert inside is not None and inside["mtu"] == 1400
    assert "192.0.2.5/24" in addresses("rdma0", netns)
    assert await prop(rig, path, "State") == "active"
    assert await prop(rig, path, "Netns") == f"net:[{netns_inode(netns)}]"


async def test_attach_for_a_pod_without_holds_moves_nothing(rig: Rig, netns: str) -> None:
    assert await attach(rig, netns) == []
    assert link(rig.nic("sim0")) is not None and link(rig.nic("sim1")) is not None


async def test_a_hold_survives_a_restart_and_attaches_after_it(rig: Rig, netns: str) -> None:
    path = await hold(rig, "sim0")
    await rig.daemon.kill()
    await rig.daemon.start()
    assert await prop(rig, path, "State") == "held"
    assert await attach(rig, netns) == [path]
    assert link(rig.nic("sim0"), netns) is not None


async def test_an_attached_hold_is_held_for_its_pod_again_when_its_netns_dies(
    rig: Rig, netns: str
) -> None:
    """The pod's sandbox died, not the pod: its next sandbox attaches the hold again."""
    path = await hold(rig, "sim0", shared=Variant("b", True))
    await attach(rig, netns)
    mark = rig.client.mark()
    ip("netns", "del", netns)
    await rig.client.wait_signal(
        "PropertiesChanged",
        lambda b: b[0] == CLAIM_IFACE and "State" in b[1] and b[1]["State"].value == "held",
        since=mark,
    )
    assert await prop(rig, path, "Netns") == ""
    assert [m.member for m in rig.client.signals[mark:] if m.member == "Released"] == []
    assert await device_state(rig, "sim0") == "shared"


async def test_detach_brings_the_netdev_home_and_holds_it_for_the_pod_again(
    rig: Rig, netns: str
) -> None:
    """The pod's CNI DEL: the device home before the runtime deletes the netns (a veth would
    go with it), held for the pod's next sandbox."""
    ip("link", "set", rig.nic("sim0"), "mtu", "1450")
    path = await hold(rig, "sim0", ifname=Variant("s", "rdma0"))
    await attach(rig, netns)
    await rig.client.manager("Detach", "s", await prop(rig, path, "Id"))
    home = link(rig.nic("sim0"))
    assert home is not None and home["mtu"] == 1450 and link("rdma0", netns) is None
    assert (await prop(rig, path, "State"), await prop(rig, path, "Netns")) == ("held", "")
    assert await attach(rig, netns) == [path], "the next sandbox attaches it again"


async def test_release_of_a_hold_frees_the_device_and_removes_its_spec(rig: Rig) -> None:
    path = await hold(rig, "sim0")
    cid = await prop(rig, path, "Id")
    await rig.client.manager("Release", "s", cid)
    assert await rig.client.manager("ListClaims") == []
    assert await device_state(rig, "sim0") == "available"
    assert not (rig.daemon.cdi_dir / f"rdmad.io-rdma-{cid}.json").exists()


async def test_in_exclusive_mode_attach_rewrites_the_char_devices_after_the_move(
    exclusive_rig: Rig, netns: str
) -> None:
    rig = exclusive_rig
    path = await hold(rig, "sim0")
    cid = await prop(rig, path, "Id")
    spec_path = rig.daemon.cdi_dir / f"rdmad.io-rdma-{cid}.json"
    before = await prop(rig, path, "CharDevices")
    await attach(rig, netns)
    after = await prop(rig, path, "CharDevices")
    assert isinstance(before, list) and isinstance(after, list)
    assert before[0][0] == after[0][0] == "/dev/infiniband/uverbs0"
    assert before[0][2] != after[0][2], "every move re-creates uverbs: the new minor"
    nodes = json.loads(spec_path.read_text())["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes[0]["minor"] == after[0][2]
