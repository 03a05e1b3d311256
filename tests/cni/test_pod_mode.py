"""Pod mode ("pod": true): rdmad-cni attaches the devices rdmad holds for the pod
(Manager.Hold, as rdmad-dra makes them) to the pod's netns, found by K8S_POD_UID in
CNI_ARGS; chained after the node's network plugin, or through Multus with IPAM."""

from __future__ import annotations

from dbus_fast import Variant

from testbed.net import addresses, link
from tests.cni.conftest import CniRig

POD_UID = "6f1c0a52-3b7d-4e0a-9c1f-2d5e8b7a4c30"
POD_ARGS = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=ml;K8S_POD_NAME=trainer-0;K8S_POD_UID={POD_UID}"
PRIMARY = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "eth0", "sandbox": "SANDBOX"}],
    "ips": [{"address": "10.5.0.9/24", "interface": 0}],
    "routes": [],
}


async def hold(rig: CniRig, device: str, ifname: str) -> str:
    options = {"ifname": Variant("s", ifname), "owner": Variant("s", "dra/claim-uid")}
    path: str = await rig.client.manager("Hold", "ssa{sv}", device, POD_UID, options)
    return path


async def test_a_chained_add_attaches_every_device_held_for_the_pod(
    rig: CniRig, netns: str
) -> None:
    path = await hold(rig, "sim0", "rdma0")
    conf = rig.conf(pod=True, ipam=None, prevResult=PRIMARY)
    done = rig.run("ADD", conf, netns, ifname="eth0", args=POD_ARGS)
    assert done.code == 0, done
    assert link("rdma0", netns) is not None
    assert await rig.client.prop(path, "io.rdmad1.Claim", "State") == "active"
    assert done.out is not None
    assert [i["name"] for i in done.out["interfaces"]] == ["eth0", "rdma0"]
    assert done.out["ips"] == PRIMARY["ips"], "the primary plugin's addresses pass through"


async def test_a_chained_add_for_a_pod_with_nothing_held_passes_the_result_on(
    rig: CniRig, netns: str
) -> None:
    conf = rig.conf(pod=True, ipam=None, prevResult=PRIMARY)
    done = rig.run("ADD", conf, netns, ifname="eth0", args=POD_ARGS)
    assert done.code == 0, done
    assert done.out is not None and [i["name"] for i in done.out["interfaces"]] == ["eth0"]
    assert await rig.client.manager("ListClaims") == []


async def test_an_add_without_a_pod_uid_touches_nothing(rig: CniRig, netns: str) -> None:
    await hold(rig, "sim0", "rdma0")
    conf = rig.conf(pod=True, ipam=None, prevResult=PRIMARY)
    done = rig.run("ADD", conf, netns, ifname="eth0", args="K8S_POD_NAME=trainer-0")
    assert done.code == 0, done
    assert link("rdma0", netns) is None


async def test_through_multus_the_hold_named_by_ifname_gets_the_ipam_addresses(
    rig: CniRig, netns: str
) -> None:
    await hold(rig, "sim0", "net1")
    await hold(rig, "sim1", "net2")
    done = rig.run("ADD", rig.conf(pod=True), netns, ifname="net1", args=POD_ARGS)
    assert done.code == 0, done
    assert link("net1", netns) is not None and link("net2", netns) is None
    (leased,) = rig.leases()
    assert f"{leased}/24" in addresses("net1", netns)
    assert done.out is not None and done.out["ips"][0]["interface"] == 0


async def test_pod_mode_refuses_a_config_that_names_the_device(rig: CniRig, netns: str) -> None:
    done = rig.run("ADD", rig.conf(pod=True, device="sim0"), netns, args=POD_ARGS)
    assert done.error == 7
    assert done.out is not None and done.out["msg"].startswith("device does not go with pod")


async def test_del_brings_the_attached_device_home_and_gives_the_lease_back(
    rig: CniRig, netns: str
) -> None:
    path = await hold(rig, "sim0", "net1")
    await hold(rig, "sim1", "net2")
    conf = rig.conf(pod=True)
    assert rig.run("ADD", conf, netns, args=POD_ARGS).code == 0
    assert rig.run("DEL", conf, netns, args=POD_ARGS).code == 0
    assert rig.leases() == set()
    assert link(rig.nic("sim0")) is not None, "home before the runtime deletes the netns"
    assert await rig.client.prop(path, "io.rdmad1.Claim", "State") == "held"
    rows = await rig.client.manager("ListClaims")
    assert sorted((r[1], r[3]) for r in rows) == [("sim0", "net1"), ("sim1", "net2")]


async def test_a_chained_del_detaches_every_attached_hold_which_stays_held_for_the_pod(
    rig: CniRig, netns: str
) -> None:
    """The pod's sandbox goes, not the pod: only the kubelet's unprepare ends its holds."""
    path = await hold(rig, "sim0", "rdma0")
    conf = rig.conf(pod=True, ipam=None, prevResult=PRIMARY)
    assert rig.run("ADD", conf, netns, ifname="eth0", args=POD_ARGS).code == 0
    assert rig.run("DEL", rig.conf(pod=True, ipam=None), netns, ifname="eth0").code == 0
    assert link(rig.nic("sim0")) is not None and link("rdma0", netns) is None
    assert await rig.client.prop(path, "io.rdmad1.Claim", "State") == "held"


async def test_after_del_the_pods_next_sandbox_attaches_its_holds_again(
    rig: CniRig, netns: str
) -> None:
    await hold(rig, "sim0", "rdma0")
    conf = rig.conf(pod=True, ipam=None, prevResult=PRIMARY)
    assert rig.run("ADD", conf, netns, ifname="eth0", args=POD_ARGS).code == 0
    assert rig.run("DEL", rig.conf(pod=True, ipam=None), netns, ifname="eth0").code == 0
    assert rig.run("ADD", conf, netns, ifname="eth0", args=POD_ARGS).code == 0
    assert link("rdma0", netns) is not None
