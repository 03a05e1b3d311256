"""Contract tests of the device status (KEP-4817): the real plugin writes each prepared
claim's `status.devices[]` through the status subresource of the loopback API server
(testbed/dra/apiserver.py, which merges and authorizes the apply as the real one does:
testbed/dra/claim_status.py), from rdmad's claim objects on a real rdmad (sim devices on
real veths): `Ready` once held, `NetworkReady` and `networkData` once the pod's netns has
the device, kept current as the pod's addresses change, and removed at unprepare. What it
writes must deserialize into the kubernetes client's V1AllocatedDeviceStatus and
V1NetworkDeviceData."""

from __future__ import annotations

from typing import Any

import pytest
from dbus_fast import Variant
from kubernetes.client import V1AllocatedDeviceStatus, V1NetworkDeviceData

from testbed.dra import kubelet
from testbed.dra.apiserver import ApiServer
from testbed.dra.claim_status import STATUS_PATCH
from testbed.dra.claims import POD_UID
from testbed.dra.plugin_process import Plugin
from testbed.net import ip, link
from tests.dra.contract import SERVICE, prepare, serve
from tests.support.sim_rig import Rig

pytestmark = pytest.mark.usefixtures("root")  # real veths and netns

A = kubelet.Claim("default", "0b9f2c1e-1111-4c3e-9a6e-000000000001", "pod-a-rdma")
OTHER_DRIVER = {"driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"}


def status(api: ApiServer) -> list[dict[str, Any]]:
    return api.device_status(A.namespace, A.name)


async def status_when(api: ApiServer, what: Any) -> list[dict[str, Any]]:
    entries = await api.wait_status(A.namespace, A.name, what)
    for entry in entries:
        V1AllocatedDeviceStatus.model_validate(entry)
        if "networkData" in entry:
            V1NetworkDeviceData.model_validate(entry["networkData"])
    return entries


def conditions(entry: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in entry["conditions"]}


def attached(entries: list[dict[str, Any]]) -> bool:
    return any("networkData" in e for e in entries)


async def attach(rig: Rig, netns: str, *cidrs: str) -> None:
    options = {"addresses": Variant("as", list(cidrs))}
    await rig.client.manager("Attach", "ssa{sv}", POD_UID, netns, options)


async def test_prepare_writes_ready_for_the_held_device_without_network_data(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    serve(api, A, ["sim0"])
    await prepare(plugin, A)
    (entry,) = await status_when(api, bool)
    assert {k: entry[k] for k in ("driver", "pool", "device")} == {
        "driver": "rdma.rdmad.io",
        "pool": "node-a",
        "device": "sim0",
    }
    assert conditions(entry) == {"Ready": ("True", "Held")}
    assert "networkData" not in entry


async def test_attach_adds_network_ready_and_the_pods_interface_address_and_mac(
    api: ApiServer, rig: Rig, plugin: Plugin, netns: str
) -> None:
    serve(api, A, ["sim0"], parameters={"interfaceName": "rdma0"})
    await prepare(plugin, A)
    await status_when(api, bool)
    await attach(rig, netns, "192.0.2.5/24")
    (entry,) = await status_when(api, attached)
    inside = link("rdma0", netns)
    assert inside is not None
    assert conditions(entry) == {"Ready": ("True", "Held"), "NetworkReady": ("True", "Attached")}
    assert entry["networkData"] == {
        "interfaceName": "rdma0",
        "ips": ["192.0.2.5/24"],
        "hardwareAddress": inside["address"],
    }


async def test_addresses_the_pod_changes_show_in_the_status(
    api: ApiServer, rig: Rig, plugin: Plugin, netns: str
) -> None:
    serve(api, A, ["sim0"], parameters={"interfaceName": "rdma0"})
    await prepare(plugin, A)
    await attach(rig, netns, "192.0.2.5/24")
    await status_when(api, attached)
    ip("addr", "add", "2001:db8::7/64", "dev", "rdma0", netns=netns)
    ip("addr", "del", "192.0.2.5/24", "dev", "rdma0", netns=netns)
    (entry,) = await status_when(
        api, lambda e: attached(e) and e[0]["networkData"]["ips"] == ["2001:db8::7/64"]
    )
    assert entry["networkData"]["interfaceName"] == "rdma0"


async def test_unprepare_removes_the_drivers_entries_and_leaves_another_drivers(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    serve(api, A, ["sim0"])
    other = {**OTHER_DRIVER, "conditions": []}
    with api.lock():
        claim = api.claims[(A.namespace, A.name)]
        results = claim["status"]["allocation"]["devices"]["results"]
        results.append({"request": "gpu", **OTHER_DRIVER})
        claim["status"]["devices"] = [other]
    await prepare(plugin, A)
    await status_when(api, lambda e: len(e) == 2)
    assert await kubelet.unprepare(str(plugin.endpoint), SERVICE, [A]) == {A.uid: ""}
    assert await status_when(api, lambda e: len(e) == 1) == [other]


async def test_a_refused_status_write_is_logged_and_the_prepare_still_succeeds(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    """A cluster whose RBAC lacks the 1.36 node-aware verbs on resourceclaims/driver."""
    api.status.granted = {STATUS_PATCH}
    serve(api, A, ["sim0"])
    got = await prepare(plugin, A)
    assert got[A.uid].error == "" and len(got[A.uid].devices) == 1
    line = await plugin.wait_log("its device status is not written")
    assert "403" in line and "associated-node:patch" in line
    assert status(api) == []
