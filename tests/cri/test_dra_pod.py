"""A ResourceClaim end to end on a node without its kubelet: rdmad-dra's
NodePrepareResources (the real plugin, the loopback API server serving the claim) holds the
device for the pod; containerd's RunPodSandbox runs the pod network, the node's plugin (here
rdmad-cni claiming sim1 as eth0) chained with rdmad-cni in pod mode, which attaches the held
device; CreateContainer with the CDI device ID the prepare returned; StartContainer. Then
the pod is stopped and removed, the claim unprepared, and the device is home."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from testbed.cri.kubelet import Container, Kubelet, Pod
from testbed.dra import kubelet as dra
from testbed.dra.apiserver import ApiServer
from testbed.dra.claims import DRIVER, NODE, claim
from testbed.dra.plugin_process import Plugin, running_plugin
from testbed.net import link
from tests.cri.conftest import Node
from tests.cri.test_containerd import char_devices, env_of, spec_nodes

SERVICE = "v1.DRAPlugin"


@dataclass
class Prepared:
    ref: dra.Claim
    pod_uid: str
    cdi_ids: list[str]

    @property
    def hold_id(self) -> str:
        (cdi,) = self.cdi_ids
        return cdi.removeprefix("rdmad.io/rdma=")


class Endpoint(Protocol):
    """A running rdmad-dra, as the kubelet calls it: the DRA socket its GetInfo named."""

    @property
    def endpoint(self) -> Path: ...


@contextlib.asynccontextmanager
async def dra_plugin(node: Node, workdir: Path) -> AsyncIterator[tuple[ApiServer, Plugin]]:
    """rdmad-dra on the node's rdmad, with the loopback API server as its cluster."""
    api = ApiServer(NODE, DRIVER)
    with api.running():
        async with running_plugin(api, node.rig.daemon.bus_address, workdir) as p:
            yield api, p
        assert api.invalid == [], "the plugin sent slices the API server refuses"


@pytest.fixture
async def plugin(node: Node, tmp_path: Path) -> AsyncIterator[tuple[ApiServer, Plugin]]:
    async with dra_plugin(node, tmp_path / "dra") as p:
        yield p


async def prepare(api: ApiServer, plugin: Endpoint, device: str) -> Prepared:
    """What the kubelet does before RunPodSandbox: NodePrepareResources of the pod's claim."""
    pod_uid = str(uuid.uuid4())
    ref = dra.Claim("team", str(uuid.uuid4()), "trainer-0-rdma")
    api.put_claim(
        claim(
            ref.uid,
            [device],
            name=ref.name,
            namespace=ref.namespace,
            pods=(pod_uid,),
            parameters={"interfaceName": "rdma0"},
        )
    )
    (result,) = (await dra.prepare_devices(str(plugin.endpoint), SERVICE, [ref])).values()
    assert result.error == "", result.error
    (device_result,) = result.devices
    return Prepared(ref, pod_uid, device_result.cdi_device_ids)


async def start_node(node: Node) -> Kubelet:
    """containerd with the pod network: the node's plugin (rdmad-cni claiming sim1 as
    eth0), then rdmad-cni in pod mode."""
    return await node.start(node.rdmad(device="sim1"), node.rdmad(pod=True, ipam=None))


async def run_prepared_pod(
    kubelet: Kubelet, prepared: Prepared, attempt: int = 0
) -> tuple[Pod, Container]:
    """The prepared pod's sandbox, and a container given the prepare's CDI device IDs."""
    pod = await kubelet.run_pod("trainer-0", uid=prepared.pod_uid, attempt=attempt)
    container = await kubelet.run_container(
        pod, "app", cdi_devices=tuple(prepared.cdi_ids), attempt=attempt
    )
    return pod, container


async def pod_with_container(node: Node, prepared: Prepared) -> tuple[Kubelet, Pod, Container]:
    kubelet = await start_node(node)
    return kubelet, *await run_prepared_pod(kubelet, prepared)


async def take_down_and_unprepare(
    kubelet: Kubelet, pod: Pod, plugin: Endpoint, prepared: Prepared
) -> None:
    """What the kubelet does when the pod ends: StopPodSandbox, RemovePodSandbox, then
    NodeUnprepareResources of its claim."""
    await kubelet.stop_pod(pod)
    await kubelet.remove_pod(pod)
    unprepared = await dra.unprepare(str(plugin.endpoint), SERVICE, [prepared.ref])
    assert unprepared == {prepared.ref.uid: ""}


async def assert_home(node: Node, device: str) -> None:
    """No claim left, the device's netdev in the host netns and the device available."""
    assert await node.claims() == []
    assert link(node.rig.nic(device)) is not None
    path = await node.rig.client.manager("GetDevice", "s", device)
    assert await node.rig.client.prop(path, "io.rdmad1.Device", "State") == "available"


async def test_the_container_of_a_prepared_pod_has_the_held_devices_netdev_and_char_devices(
    node: Node, plugin: tuple[ApiServer, Plugin]
) -> None:
    prepared = await prepare(*plugin, "sim0")
    kubelet, _, container = await pod_with_container(node, prepared)
    done = await kubelet.exec(container, "/bin/ip", "-o", "link", "show", "rdma0")
    assert "rdma0" in done.stdout
    assert await char_devices(kubelet, container) == spec_nodes(node, prepared.hold_id)
    env = await env_of(kubelet, container)
    assert set(node.cdi_edits(prepared.hold_id)["env"]) <= env
    assert any(e.startswith("RDMAD_DEVICE") and "sim0" in e for e in env)


async def test_taking_the_pod_down_and_unpreparing_brings_the_device_home(
    node: Node, plugin: tuple[ApiServer, Plugin]
) -> None:
    prepared = await prepare(*plugin, "sim0")
    kubelet, pod, _ = await pod_with_container(node, prepared)
    await take_down_and_unprepare(kubelet, pod, plugin[1], prepared)
    await assert_home(node, "sim0")


async def test_the_claims_status_shows_the_pods_rdma_interface_until_unprepare(
    node: Node, plugin: tuple[ApiServer, Plugin]
) -> None:
    """KEP-4817: what `kubectl get resourceclaim -o yaml` shows of the running pod."""
    api, endpoint = plugin
    prepared = await prepare(api, endpoint, "sim0")
    kubelet, pod, container = await pod_with_container(node, prepared)
    where = (prepared.ref.namespace, prepared.ref.name)
    (entry,) = await api.wait_status(*where, lambda e: bool(e) and "networkData" in e[0])
    shown = await kubelet.exec(container, "/bin/ip", "-o", "link", "show", "rdma0")
    mac = shown.stdout.split("link/ether ", 1)[1].split()[0]
    assert entry["networkData"] == {"interfaceName": "rdma0", "hardwareAddress": mac}
    assert {c["type"]: c["status"] for c in entry["conditions"]} == {
        "Ready": "True",
        "NetworkReady": "True",
    }
    await take_down_and_unprepare(kubelet, pod, endpoint, prepared)
    assert await api.wait_status(*where, lambda e: e == []) == []


async def test_in_exclusive_mode_the_container_gets_the_char_devices_read_after_the_move(
    exclusive_node: Node, tmp_path: Path
) -> None:
    node = exclusive_node
    async with dra_plugin(node, tmp_path / "dra") as (api, plugin):
        prepared = await prepare(api, plugin, "sim0")
        at_prepare = spec_nodes(node, prepared.hold_id)
        kubelet, _, container = await pod_with_container(node, prepared)
        in_container = await char_devices(kubelet, container)
    assert in_container == spec_nodes(node, prepared.hold_id)
    uverbs = {n for n in in_container if n[0] == "/dev/infiniband/uverbs0"}
    assert uverbs and uverbs.isdisjoint(at_prepare), "the move made uverbs0 anew"


# ------------------------------------------------------------------ restarts between
# prepare and sandbox


async def test_rdmad_killed_between_prepare_and_sandbox_keeps_the_hold_for_the_pod(
    node: Node, plugin: tuple[ApiServer, Plugin]
) -> None:
    prepared = await prepare(*plugin, "sim0")
    await node.rig.daemon.kill()
    await node.rig.daemon.start()
    kubelet, _, container = await pod_with_container(node, prepared)
    assert "rdma0" in (await kubelet.exec(container, "/bin/ip", "-o", "link")).stdout
    assert await char_devices(kubelet, container) == spec_nodes(node, prepared.hold_id)


async def test_the_plugin_killed_between_prepare_and_sandbox_changes_nothing_for_the_pod(
    node: Node, tmp_path: Path
) -> None:
    async with dra_plugin(node, tmp_path / "dra") as (api, plugin):
        prepared = await prepare(api, plugin, "sim0")
        plugin.proc.kill()  # SIGKILL: no chance to tidy anything
        await plugin.proc.wait()
        kubelet, pod, container = await pod_with_container(node, prepared)
        assert await char_devices(kubelet, container) == spec_nodes(node, prepared.hold_id)
        await kubelet.stop_pod(pod)
        await kubelet.remove_pod(pod)
        async with running_plugin(api, node.rig.daemon.bus_address, tmp_path / "dra") as again:
            unprepared = await dra.unprepare(str(again.endpoint), SERVICE, [prepared.ref])
    assert unprepared == {prepared.ref.uid: ""}
    assert await node.claims() == [] and link(node.rig.nic("sim0")) is not None


async def test_containerd_killed_between_prepare_and_sandbox_runs_the_pod_with_the_held_device(
    node: Node, plugin: tuple[ApiServer, Plugin]
) -> None:
    await start_node(node)  # a node's containerd runs when its kubelet prepares
    prepared = await prepare(*plugin, "sim0")
    kubelet = await node.restart_containerd()
    _, container = await run_prepared_pod(kubelet, prepared)
    assert "rdma0" in (await kubelet.exec(container, "/bin/ip", "-o", "link")).stdout
    assert await char_devices(kubelet, container) == spec_nodes(node, prepared.hold_id)
    assert set(node.cdi_edits(prepared.hold_id)["env"]) <= await env_of(kubelet, container)


async def test_containerd_killed_between_prepare_and_sandbox_leaves_unprepare_bringing_it_home(
    node: Node, plugin: tuple[ApiServer, Plugin]
) -> None:
    await start_node(node)  # a node's containerd runs when its kubelet prepares
    prepared = await prepare(*plugin, "sim0")
    kubelet = await node.restart_containerd()
    pod, _ = await run_prepared_pod(kubelet, prepared)
    await take_down_and_unprepare(kubelet, pod, plugin[1], prepared)
    await assert_home(node, "sim0")


# ------------------------------------------------------------------ a sandbox made again


async def sandbox_made_again(
    kubelet: Kubelet, pod: Pod, prepared: Prepared
) -> tuple[Pod, Container]:
    """What the kubelet does when a pod's sandbox died or must change: StopPodSandbox of the
    old one (CNI DEL), a new sandbox (attempt 1) for the same pod, with no new prepare (its
    claims are prepared already), its containers given the same CDI device IDs; the old
    sandbox is removed after (garbage collection)."""
    await kubelet.stop_pod(pod)
    again = await run_prepared_pod(kubelet, prepared, attempt=1)
    await kubelet.remove_pod(pod)
    return again


async def test_a_sandbox_made_again_for_the_pod_gets_the_held_device_again(
    node: Node, plugin: tuple[ApiServer, Plugin]
) -> None:
    prepared = await prepare(*plugin, "sim0")
    kubelet, pod, _ = await pod_with_container(node, prepared)
    _, container = await sandbox_made_again(kubelet, pod, prepared)
    assert "rdma0" in (await kubelet.exec(container, "/bin/ip", "-o", "link")).stdout
    assert await char_devices(kubelet, container) == spec_nodes(node, prepared.hold_id)
    assert set(node.cdi_edits(prepared.hold_id)["env"]) <= await env_of(kubelet, container)


async def test_between_two_sandboxes_the_device_is_home_and_still_held(
    node: Node, plugin: tuple[ApiServer, Plugin]
) -> None:
    prepared = await prepare(*plugin, "sim0")
    kubelet, pod, _ = await pod_with_container(node, prepared)
    await kubelet.stop_pod(pod)
    assert link(node.rig.nic("sim0")) is not None, "home before the old netns went"
    path = await node.rig.client.manager("GetDevice", "s", "sim0")
    assert await node.rig.client.prop(path, "io.rdmad1.Device", "State") == "claimed"
    assert [(r[0], r[2]) for r in await node.claims() if r[1] == "sim0"] == [(prepared.hold_id, "")]


async def test_unprepare_after_a_sandbox_made_again_brings_the_device_home(
    node: Node, plugin: tuple[ApiServer, Plugin]
) -> None:
    prepared = await prepare(*plugin, "sim0")
    kubelet, pod, _ = await pod_with_container(node, prepared)
    again, _ = await sandbox_made_again(kubelet, pod, prepared)
    await take_down_and_unprepare(kubelet, again, plugin[1], prepared)
    await assert_home(node, "sim0")


async def test_unprepare_of_a_pod_whose_sandbox_never_came_back_brings_the_device_home(
    node: Node, plugin: tuple[ApiServer, Plugin]
) -> None:
    """Nothing is stranded: the hold the last sandbox left is the kubelet's to unprepare."""
    prepared = await prepare(*plugin, "sim0")
    kubelet, pod, _ = await pod_with_container(node, prepared)
    await take_down_and_unprepare(kubelet, pod, plugin[1], prepared)
    await assert_home(node, "sim0")
