"""containerd 2 driven through CRI as the kubelet drives it, with rdmad-cni as the pod
network: the pod's sandbox holds the device, a container created with the claim's CDI device
(CRI's CDIDevices) has its char devices, environment and netdev, and taking the pod down
brings the device home."""

from __future__ import annotations

from typing import Any

from testbed.cri.kubelet import Container, Kubelet, Pod
from testbed.net import addresses, ip, is_up, link
from tests.cri.conftest import NETWORK, Node

POD_IP = "10.77.0.2"  # host-local's first lease in CniRig.conf's subnet


async def pod_with_container(node: Node, **rdmad: Any) -> tuple[Kubelet, Pod, Container]:
    """A pod on rdmad's network and a container given its claim's CDI device by claim id,
    as a DRA driver's NodePrepareResources returns it."""
    kubelet = await node.start(node.rdmad(**rdmad))
    pod = await kubelet.run_pod("trainer-0")
    device = f"rdmad.io/rdma={await node.claim_of(pod)}"
    return kubelet, pod, await kubelet.run_container(pod, "app", cdi_devices=(device,))


async def char_devices(kubelet: Kubelet, container: Container) -> set[tuple[str, int, int]]:
    """(path, major, minor) of each char device under /dev/infiniband in the container."""
    done = await kubelet.exec(container, "/bin/sh", "-c", "stat -c '%n %F %t %T' /dev/infiniband/*")
    out = set()
    for line in done.stdout.splitlines():
        path, *kind, major, minor = line.split()
        assert kind == ["character", "special", "file"], line
        out.add((path, int(major, 16), int(minor, 16)))
    return out


def spec_nodes(node: Node, claim_id: str) -> set[tuple[str, int, int]]:
    return {(d["path"], d["major"], d["minor"]) for d in node.cdi_edits(claim_id)["deviceNodes"]}


async def env_of(kubelet: Kubelet, container: Container) -> set[str]:
    return set((await kubelet.exec(container, "/bin/env")).stdout.splitlines())


def host_view(node: Node, device: str) -> tuple[str, int, bool]:
    info = link(node.rig.nic(device))
    assert info is not None, f"{node.rig.nic(device)} is not in the host netns"
    return info["ifname"], info["mtu"], is_up(info)


# ------------------------------------------------------------------ RunPodSandbox


async def test_run_pod_sandbox_claims_the_device_for_the_pods_eth0(node: Node) -> None:
    kubelet = await node.start(node.rdmad(device="sim0"))
    pod = await kubelet.run_pod("trainer-0")
    rows = await node.claims()
    assert [(r[1], r[3], r[4]) for r in rows] == [
        ("sim0", "eth0", f"cni/{NETWORK}/{pod.sandbox_id}/eth0")
    ]
    assert link(node.rig.nic("sim0")) is None  # moved into the pod


async def test_pod_ip_the_kubelet_reads_is_the_devices_ipam_address(node: Node) -> None:
    kubelet = await node.start(node.rdmad(device="sim0"))
    pod = await kubelet.run_pod("trainer-0")
    assert await kubelet.pod_ip(pod) == POD_IP


async def test_containerd_passes_the_pods_uid_name_and_namespace_to_cni(node: Node) -> None:
    kubelet = await node.start(node.rdmad(device="sim0"))
    pod = await kubelet.run_pod("trainer-0")
    (add,) = node.cni_calls()
    args = dict(kv.split("=", 1) for kv in add["args"].split(";"))
    assert (add["command"], add["container"]) == ("ADD", pod.sandbox_id)
    assert (args["K8S_POD_UID"], args["K8S_POD_NAMESPACE"], args["K8S_POD_NAME"]) == (
        pod.uid,
        "team",
        "trainer-0",
    )


# ------------------------------------------------------------------ the container


async def test_container_has_the_char_devices_of_the_claims_cdi_device(node: Node) -> None:
    kubelet, pod, container = await pod_with_container(node, device="sim0")
    expected = spec_nodes(node, await node.claim_of(pod))
    assert {p for p, _, _ in expected} == {"/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm"}
    assert await char_devices(kubelet, container) == expected


async def test_container_has_the_environment_of_the_claims_cdi_device(node: Node) -> None:
    kubelet, pod, container = await pod_with_container(node, device="sim0")
    env = await env_of(kubelet, container)
    assert "RDMAD_DEVICE=sim0" in env
    assert [e for e in env if e.startswith("NCCL_IB_HCA=")] == ["NCCL_IB_HCA==sim0:1"]
    assert set(node.cdi_edits(await node.claim_of(pod))["env"]) <= env


async def test_container_has_the_devices_netdev_as_eth0_with_its_address(node: Node) -> None:
    kubelet, _, container = await pod_with_container(node, device="sim0")
    done = await kubelet.exec(container, "/bin/ip", "-o", "-4", "addr", "show", "eth0")
    assert f"inet {POD_IP}/24" in done.stdout


async def test_cdi_name_of_the_pods_attachment_names_the_same_claim(node: Node) -> None:
    """What a user writes before the pod exists: rdmad.io/rdma=NAMESPACE.POD.IFNAME."""
    kubelet = await node.start(node.rdmad(device="sim0"))
    pod = await kubelet.run_pod("trainer-0")
    by_name = "rdmad.io/rdma=team.trainer-0.eth0"
    container = await kubelet.run_container(pod, "app", cdi_devices=(by_name,))
    assert await char_devices(kubelet, container) == spec_nodes(node, await node.claim_of(pod))
    assert "RDMAD_DEVICE=sim0" in await env_of(kubelet, container)


async def test_exclusive_mode_container_has_the_moved_devices_char_devices(
    exclusive_node: Node,
) -> None:
    node = exclusive_node
    kubelet, pod, container = await pod_with_container(node, device="sim1")
    expected = spec_nodes(node, await node.claim_of(pod))
    assert {p for p, _, _ in expected} == {"/dev/infiniband/uverbs1", "/dev/infiniband/rdma_cm"}
    assert await char_devices(kubelet, container) == expected


# ------------------------------------------------------------------ shared


async def test_shared_pod_has_a_child_of_the_device_and_the_device_stays_home(node: Node) -> None:
    kubelet, _, container = await pod_with_container(node, device="sim0", shared=True)
    done = await kubelet.exec(container, "/bin/ip", "-o", "-4", "addr", "show", "eth0")
    assert f"inet {POD_IP}/24" in done.stdout
    assert link(node.rig.nic("sim0")) is not None
    path = await node.rig.client.manager("GetDevice", "s", "sim0")
    assert await node.rig.client.prop(path, "io.rdmad1.Device", "State") == "shared"


async def test_shared_pod_container_has_the_claims_char_devices_and_environment(
    node: Node,
) -> None:
    kubelet, pod, container = await pod_with_container(node, device="sim0", shared=True)
    claim = await node.claim_of(pod)
    assert await char_devices(kubelet, container) == spec_nodes(node, claim)
    assert set(node.cdi_edits(claim)["env"]) <= await env_of(kubelet, container)


async def test_two_shared_pods_each_hold_a_claim_on_the_device(node: Node) -> None:
    kubelet = await node.start(node.rdmad(device="sim0", shared=True))
    pods = [await kubelet.run_pod(name) for name in ("trainer-0", "trainer-1")]
    assert sorted((r[1], r[4]) for r in await node.claims()) == sorted(
        ("sim0", f"cni/{NETWORK}/{p.sandbox_id}/eth0") for p in pods
    )


# ------------------------------------------------------------------ taking the pod down


async def test_stop_pod_sandbox_ends_the_claim_and_brings_the_device_home(node: Node) -> None:
    ip("link", "set", node.rig.nic("sim0"), "mtu", "1450", "up")
    before = host_view(node, "sim0")
    kubelet, pod, _ = await pod_with_container(node, device="sim0")
    claim = await node.claim_of(pod)
    mark = node.rig.client.mark()
    await kubelet.stop_pod(pod)
    released = await node.rig.client.wait_signal("Released", since=mark)
    assert (released[0], released[2]) == (claim, "requested")  # by the plugin's DEL
    assert host_view(node, "sim0") == before
    assert addresses(node.rig.nic("sim0")) == set()
    assert await node.claims() == []
    assert list(node.rig.daemon.cdi_dir.glob("*.json")) == []


async def test_remove_pod_sandbox_leaves_the_device_home_and_no_lease(node: Node) -> None:
    ip("link", "set", node.rig.nic("sim0"), "up")
    before = host_view(node, "sim0")
    kubelet, pod, _ = await pod_with_container(node, device="sim0")
    await kubelet.stop_pod(pod)
    await kubelet.remove_pod(pod)
    assert host_view(node, "sim0") == before
    assert await node.claims() == []
    assert node.rig.leases() == set()
    assert await kubelet.cri.list_pod_sandboxes() == []


async def test_shared_pod_removed_leaves_the_device_available(node: Node) -> None:
    kubelet, pod, _ = await pod_with_container(node, device="sim0", shared=True)
    await kubelet.stop_pod(pod)
    await kubelet.remove_pod(pod)
    assert await node.claims() == []
    path = await node.rig.client.manager("GetDevice", "s", "sim0")
    assert await node.rig.client.prop(path, "io.rdmad1.Device", "State") == "available"


async def test_second_cni_del_at_remove_pod_sandbox_is_harmless(node: Node) -> None:
    ip("link", "set", node.rig.nic("sim0"), "up")
    before = host_view(node, "sim0")
    kubelet, pod, _ = await pod_with_container(node, device="sim0")
    await kubelet.stop_pod(pod)
    mark = node.rig.client.mark()
    await kubelet.remove_pod(pod)  # raises if the DEL failed: containerd keeps the sandbox
    assert [c["command"] for c in node.cni_calls()] == ["ADD", "DEL", "DEL"]
    assert [m.member for m in node.rig.client.signals[mark:] if m.member == "Released"] == []
    assert host_view(node, "sim0") == before
    assert await node.claims() == []
